// Layer norm over the last dimension of a row-major [rows, cols] array:
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps).
// One workgroup per row; the row grid is 2-D (rows > 65535 fit).

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    accumulate: u32, // backward: 1 = add dx to the existing gradient
}

const ROW_BLOCK: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;

// ---- forward ----

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd_out: array<f32>;

@compute @workgroup_size(256)
fn layer_norm_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; } // uniform across the workgroup
    let base = row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) { s += x[base + c]; }
    let mean = workgroup_reduce(lid, s, false) / f32(p.cols);
    var sq = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = x[base + c] - mean;
        sq += d * d;
    }
    let rstd = inverseSqrt(workgroup_reduce(lid, sq, false) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        y[base + c] = (x[base + c] - mean) * rstd * gamma[c] + beta[c];
    }
    if (lid == 0u) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

// ---- backward to the input ----
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.

@group(0) @binding(1) var<storage, read> dy_b: array<f32>;
@group(0) @binding(2) var<storage, read> x_b: array<f32>;
@group(0) @binding(3) var<storage, read> gamma_b: array<f32>;
@group(0) @binding(4) var<storage, read> mean_b: array<f32>;
@group(0) @binding(5) var<storage, read> rstd_b: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn layer_norm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    let mean = mean_b[row];
    let rstd = rstd_b[row];
    var sg = 0.0;
    var sgx = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let g = dy_b[base + c] * gamma_b[c];
        let xhat = (x_b[base + c] - mean) * rstd;
        sg += g;
        sgx += g * xhat;
    }
    let mean_g = workgroup_reduce(lid, sg, false) / f32(p.cols);
    let mean_gx = workgroup_reduce(lid, sgx, false) / f32(p.cols);
    for (var c = lid; c < p.cols; c += WG) {
        let g = dy_b[base + c] * gamma_b[c];
        let xhat = (x_b[base + c] - mean) * rstd;
        var v = rstd * (g - mean_g - xhat * mean_gx);
        if (p.accumulate != 0u) { v += dx[base + c]; }
        dx[base + c] = v;
    }
}

// ---- backward to gamma and beta, first pass ----
// Per block of ROW_BLOCK rows and per column: sum of dy * xhat and of dy.
// `layer_norm_param_sums` then adds up the blocks (no float atomics).

@group(0) @binding(1) var<storage, read> dy_p: array<f32>;
@group(0) @binding(2) var<storage, read> x_p: array<f32>;
@group(0) @binding(3) var<storage, read> mean_p: array<f32>;
@group(0) @binding(4) var<storage, read> rstd_p: array<f32>;
@group(0) @binding(5) var<storage, read_write> dgamma_partial: array<f32>;
@group(0) @binding(6) var<storage, read_write> dbeta_partial: array<f32>;

@compute @workgroup_size(256)
fn layer_norm_param_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = wid.x * WG + lid;
    if (col >= p.cols) { return; }
    let row0 = wid.y * ROW_BLOCK;
    let row1 = min(row0 + ROW_BLOCK, p.rows);
    var dg = 0.0;
    var db = 0.0;
    for (var r = row0; r < row1; r += 1u) {
        let d = dy_p[r * p.cols + col];
        dg += d * (x_p[r * p.cols + col] - mean_p[r]) * rstd_p[r];
        db += d;
    }
    dgamma_partial[wid.y * p.cols + col] = dg;
    dbeta_partial[wid.y * p.cols + col] = db;
}

// ---- backward to gamma and beta, second pass ----
// dgamma[c] += the sum over blocks of dgamma_blocks[block, c]; dbeta alike.
// p.rows is the number of blocks.

@group(0) @binding(1) var<storage, read> dgamma_blocks: array<f32>;
@group(0) @binding(2) var<storage, read> dbeta_blocks: array<f32>;
@group(0) @binding(3) var<storage, read_write> dgamma_sum: array<f32>;
@group(0) @binding(4) var<storage, read_write> dbeta_sum: array<f32>;

@compute @workgroup_size(256)
fn layer_norm_param_sums(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = wid.x * WG + lid;
    if (col >= p.cols) { return; }
    var dg = 0.0;
    var db = 0.0;
    for (var block = 0u; block < p.rows; block += 1u) {
        dg += dgamma_blocks[block * p.cols + col];
        db += dbeta_blocks[block * p.cols + col];
    }
    dgamma_sum[col] += dg;
    dbeta_sum[col] += db;
}
