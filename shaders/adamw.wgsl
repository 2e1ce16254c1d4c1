// AdamW (Loshchilov & Hutter) with decoupled weight decay, and clipping by
// the global gradient norm, whose square the reduce family has already
// written to grad_sumsq[0] (so nothing is read back to clip).
//   g = grad * min(1, max_norm / (||grad|| + 1e-6))   (max_norm <= 0: no clipping)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr * (wd * param + (m / bc1) / (sqrt(v / bc2) + eps))

struct Params {
    len: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32, // 1 - beta1^t
    bias_correction2: f32, // 1 - beta2^t
    max_norm: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read> grad_sumsq: array<f32>;
@group(0) @binding(3) var<storage, read_write> param: array<f32>;
@group(0) @binding(4) var<storage, read_write> m: array<f32>;
@group(0) @binding(5) var<storage, read_write> v: array<f32>;

@compute @workgroup_size(256)
fn adamw_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.len) { return; }
    var clip = 1.0;
    if (p.max_norm > 0.0) {
        clip = min(1.0, p.max_norm / (sqrt(grad_sumsq[0]) + 1e-6));
    }
    let g = grad[i] * clip;
    let mi = p.beta1 * m[i] + (1.0 - p.beta1) * g;
    let vi = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    let update = (mi / p.bias_correction1) / (sqrt(vi / p.bias_correction2) + p.eps);
    param[i] = param[i] - p.lr * (p.weight_decay * param[i] + update);
}
