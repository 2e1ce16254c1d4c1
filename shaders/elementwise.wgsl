// Elementwise kernels over flat f32 arrays, one thread per element, on a
// 2-D grid (see `flat_index` in prelude.wgsl).

struct Params {
    len: u32,
    cols: u32,   // add_bias: the row length
    alpha: f32,
    beta: f32,
}

@group(0) @binding(0) var<uniform> p: Params;

// ---- one buffer ----

@group(0) @binding(1) var<storage, read_write> x_rw: array<f32>;

// x = alpha
@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { x_rw[i] = p.alpha; }
}

// x = alpha * x
@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { x_rw[i] = p.alpha * x_rw[i]; }
}

// ---- input x, output y ----

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

// y = alpha * x + beta * y  (beta = 0 copies: y is not read then)
@compute @workgroup_size(256)
fn axpby(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        var out = p.alpha * x[i];
        if (p.beta != 0.0) { out += p.beta * y[i]; }
        y[i] = out;
    }
}

// y[r, c] += x[c] for a row-major y of `cols` columns (x is the bias).
@compute @workgroup_size(256)
fn add_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { y[i] += x[i % p.cols]; }
}

// GELU (gelu_value and gelu_slope are in the prelude).
@compute @workgroup_size(256)
fn gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        y[i] = gelu_value(x[i]);
    }
}

// y = tanh(x)
@compute @workgroup_size(256)
fn tanh_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        y[i] = stable_tanh(x[i]);
    }
}

// y = max(x, 0)
@compute @workgroup_size(256)
fn relu_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        y[i] = max(x[i], 0.0);
    }
}

// Phi(x), the standard normal CDF: 0.5 erfc(-x / sqrt 2), erfc by
// Abramowitz and Stegun's 7.1.26 on |x| (as the CPU twin's normal_cdf)
fn normal_cdf(v: f32) -> f32 {
    let z = abs(v) * 0.70710677;
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.2548296 + t * (-0.28449674 + t * (1.4214138 + t * (-1.453152 + t * 1.0614054))));
    let tail = 0.5 * poly * exp(-z * z);
    return select(tail, 1.0 - tail, v >= 0.0);
}

// y = x Phi(x), GELU with the exact CDF (CLIP's "gelu")
@compute @workgroup_size(256)
fn gelu_erf_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        y[i] = x[i] * normal_cdf(x[i]);
    }
}

// y = x sigmoid(1.702 x), CLIP's quick GELU
@compute @workgroup_size(256)
fn quick_gelu_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        let v = x[i];
        y[i] = v / (1.0 + exp(-1.702 * v));
    }
}

// ---- inputs x, dy; output dx ----

@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// dx = dy * gelu'(x)  (+ dx when beta = 1: the input's gradient accumulates)
@compute @workgroup_size(256)
fn gelu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        var out = dy[i] * gelu_slope(x[i]);
        if (p.beta != 0.0) { out += p.beta * dx[i]; }
        dx[i] = out;
    }
}

// dx = dy * (1 - tanh(x)^2)
@compute @workgroup_size(256)
fn tanh_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        let t = stable_tanh(x[i]);
        dx[i] = dy[i] * (1.0 - t * t);
    }
}

// dx = dy where x > 0, else 0 (the gradient at 0 taken as 0, as PyTorch's)
@compute @workgroup_size(256)
fn relu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        dx[i] = select(0.0, dy[i], x[i] > 0.0);
    }
}

// dx = dy * (Phi(x) + x phi(x))
@compute @workgroup_size(256)
fn gelu_erf_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        let v = x[i];
        dx[i] = dy[i] * (normal_cdf(v) + v * 0.3989423 * exp(-0.5 * v * v));
    }
}

// dx = dy * (s + 1.702 x s (1 - s)), s = sigmoid(1.702 x)
@compute @workgroup_size(256)
fn quick_gelu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        let v = x[i];
        let s = 1.0 / (1.0 + exp(-1.702 * v));
        dx[i] = dy[i] * (s + 1.702 * v * s * (1.0 - s));
    }
}

// ---- inputs a, b; output out ----

@group(0) @binding(1) var<storage, read> lhs: array<f32>;
@group(0) @binding(2) var<storage, read> rhs: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out = alpha * lhs + beta * rhs
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { out[i] = p.alpha * lhs[i] + p.beta * rhs[i]; }
}

// out = alpha * lhs * rhs
@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { out[i] = p.alpha * lhs[i] * rhs[i]; }
}

// ---- a learned scalar ----

@group(0) @binding(3) var<storage, read> scalar: array<f32>;

// y = exp(scalar[0]) * x + beta * y: logits scaled by a learned log-temperature.
@compute @workgroup_size(256)
fn scale_by_exp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) {
        var out = exp(scalar[0]) * x[i];
        if (p.beta != 0.0) { out += p.beta * y[i]; }
        y[i] = out;
    }
}

// x = clamp(x, alpha, beta)
@compute @workgroup_size(256)
fn clamp_values(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.len) { x_rw[i] = clamp(x_rw[i], p.alpha, p.beta); }
}
