// Row-wise softmax over a row-major [rows, cols] array, with the masks that
// attention needs. Rows are grouped as [batch, heads, q_len] (plain softmax:
// heads = 1, q_len = rows). Column j of row r (query q = r % q_len, batch
// item b = r / q_len / heads) takes part when
//   - not causal, or j <= q (self-attention: q_len = cols), and
//   - no key mask is used, or key_mask[b * cols + j] != 0.
// Masked entries get probability 0; a row with no allowed column is all 0.
// One workgroup per row; the row grid is 2-D (rows > 65535 fit).

struct Params {
    rows: u32,
    cols: u32,
    q_len: u32,
    heads: u32,
    causal: u32,
    use_mask: u32,
    accumulate: u32, // backward: 1 = add to the existing dx
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// ---- forward ----

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> key_mask: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn allowed(row: u32, col: u32) -> bool {
    let q = row % p.q_len;
    if (p.causal != 0u && col > q) { return false; }
    if (p.use_mask != 0u) {
        let b = row / p.q_len / p.heads;
        return key_mask[b * p.cols + col] != 0u;
    }
    return true;
}

@compute @workgroup_size(256)
fn softmax_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    var m = NEG_INF;
    for (var c = lid; c < p.cols; c += WG) {
        if (allowed(row, c)) { m = max(m, x[base + c]); }
    }
    m = workgroup_reduce(lid, m, true);
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        if (allowed(row, c)) { s += exp(x[base + c] - m); }
    }
    s = workgroup_reduce(lid, s, false);
    for (var c = lid; c < p.cols; c += WG) {
        var v = 0.0;
        if (allowed(row, c)) { v = exp(x[base + c] - m) / s; }
        y[base + c] = v;
    }
}

// ---- backward: dx = y * (dy - sum(dy * y)) ----

@group(0) @binding(1) var<storage, read> y_b: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) { s += dy[base + c] * y_b[base + c]; }
    s = workgroup_reduce(lid, s, false);
    for (var c = lid; c < p.cols; c += WG) {
        var v = y_b[base + c] * (dy[base + c] - s);
        if (p.accumulate != 0u) { v += dx[base + c]; }
        dx[base + c] = v;
    }
}
