// Rows scaled to unit L2 norm: y = x / n with n = max(||x||, EPS), the
// norm saved per row. One workgroup per row, on a 2-D grid.

struct Params {
    rows: u32,
    cols: u32,
    accumulate: u32, // backward: 1 = add dx to the existing gradient
    _pad: u32,
}

const EPS: f32 = 1e-12;

@group(0) @binding(0) var<uniform> p: Params;

// ---- forward ----

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> norm_out: array<f32>;

@compute @workgroup_size(256)
fn l2_normalize_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; } // uniform across the workgroup
    let base = row * p.cols;
    var sq = 0.0;
    for (var c = lid; c < p.cols; c += WG) { sq += x[base + c] * x[base + c]; }
    let n = max(sqrt(workgroup_reduce(lid, sq, false)), EPS);
    for (var c = lid; c < p.cols; c += WG) { y[base + c] = x[base + c] / n; }
    if (lid == 0u) { norm_out[row] = n; }
}

// ---- backward: dx (+)= (dy - y * dot(y, dy)) / n ----

@group(0) @binding(1) var<storage, read> y_in: array<f32>;
@group(0) @binding(2) var<storage, read> norm_in: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn l2_normalize_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    var d = 0.0;
    for (var c = lid; c < p.cols; c += WG) { d += y_in[base + c] * dy[base + c]; }
    let dot_y_dy = workgroup_reduce(lid, d, false);
    let n = norm_in[row];
    for (var c = lid; c < p.cols; c += WG) {
        var g = (dy[base + c] - y_in[base + c] * dot_y_dy) / n;
        if (p.accumulate != 0u) { g += dx[base + c]; }
        dx[base + c] = g;
    }
}
