// Log-probability of a given token under a softmax over the vocabulary or
// over a subset of it. This is the core of cross-entropy (MLE), of SMILE
// (the subset is the sequence's own tokens) and of REINFORCE (sampled tokens).
//
// Row r uses subset mask_rows[r]: FULL means the whole vocabulary, else the
// bitset masks[mask_rows[r] * words .. + words] (bit j = token j). The
// row's target always takes part, so a subset "plus the label" needs no
// extra bit.
//   logp[r] = z[r, y_r] - lse_r,  lse_r = log sum_{j allowed} exp(z[r, j])
// Backward, given dlogp (the gradient of the loss w.r.t. logp[r]):
//   dz[r, j] = dlogp[r] * ([j == y_r] - [j allowed] * exp(z[r, j] - lse_r))

struct Params {
    rows: u32,
    vocab: u32,
    words: u32,      // u32 words per subset bitset
    accumulate: u32, // backward: 1 = add to the existing dlogits
}

const FULL: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read> mask_rows: array<u32>;
@group(0) @binding(4) var<storage, read> masks: array<u32>;

fn allowed(row: u32, j: u32) -> bool {
    let subset = mask_rows[row];
    if (subset == FULL || j == targets[row]) { return true; }
    return ((masks[subset * p.words + j / 32u] >> (j % 32u)) & 1u) != 0u;
}

// ---- forward: one workgroup per row ----

@group(0) @binding(5) var<storage, read_write> logp: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse_out: array<f32>;

@compute @workgroup_size(256)
fn log_softmax_gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.vocab;
    var m = NEG_INF;
    for (var j = lid; j < p.vocab; j += WG) {
        if (allowed(row, j)) { m = max(m, logits[base + j]); }
    }
    m = workgroup_reduce(lid, m, true);
    var s = 0.0;
    for (var j = lid; j < p.vocab; j += WG) {
        if (allowed(row, j)) { s += exp(logits[base + j] - m); }
    }
    s = workgroup_reduce(lid, s, false);
    if (lid == 0u) {
        let lse = m + log(s);
        lse_out[row] = lse;
        logp[row] = logits[base + targets[row]] - lse;
    }
}

// ---- backward: one thread per logit; 2-D grid ----

@group(0) @binding(5) var<storage, read> lse_b: array<f32>;
@group(0) @binding(6) var<storage, read> dlogp: array<f32>;
@group(0) @binding(7) var<storage, read_write> dlogits: array<f32>;

@compute @workgroup_size(256)
fn log_softmax_gather_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.rows * p.vocab) { return; }
    let row = i / p.vocab;
    let j = i % p.vocab;
    var g = 0.0;
    if (allowed(row, j)) { g = -exp(logits[i] - lse_b[row]); }
    if (j == targets[row]) { g += 1.0; }
    var v = dlogp[row] * g;
    if (p.accumulate != 0u) { v += dlogits[i]; }
    dlogits[i] = v;
}

// ---- the entropy of the full softmax: one workgroup per row ----
//   H_r = -sum_j p_j log p_j = lse_r - sum_j p_j z_j
// Backward, given dH (the gradient of the loss w.r.t. H_r):
//   dz[r, j] = dH_r * (-p_j (log p_j + H_r))

@group(0) @binding(2) var<storage, read_write> entropy_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> entropy_lse_out: array<f32>;

@compute @workgroup_size(256)
fn softmax_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.vocab;
    var m = NEG_INF;
    for (var j = lid; j < p.vocab; j += WG) {
        m = max(m, logits[base + j]);
    }
    m = workgroup_reduce(lid, m, true);
    var s = 0.0;
    var sz = 0.0;
    for (var j = lid; j < p.vocab; j += WG) {
        let z = logits[base + j] - m;
        let e = exp(z);
        s += e;
        sz += e * z;
    }
    s = workgroup_reduce(lid, s, false);
    sz = workgroup_reduce(lid, sz, false);
    if (lid == 0u) {
        // With z relative to the max: lse - m = log s, sum p z = sz / s.
        entropy_out[row] = log(s) - sz / s;
        entropy_lse_out[row] = m + log(s);
    }
}

@group(0) @binding(2) var<storage, read> entropy_in: array<f32>;
@group(0) @binding(3) var<storage, read> entropy_lse_in: array<f32>;
@group(0) @binding(4) var<storage, read> d_entropy: array<f32>;
@group(0) @binding(5) var<storage, read_write> entropy_dlogits: array<f32>;

// One thread per logit; 2-D grid.
@compute @workgroup_size(256)
fn softmax_entropy_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.rows * p.vocab) { return; }
    let row = i / p.vocab;
    let log_p = logits[i] - entropy_lse_in[row];
    var v = -d_entropy[row] * exp(log_p) * (log_p + entropy_in[row]);
    if (p.accumulate != 0u) { v += entropy_dlogits[i]; }
    entropy_dlogits[i] = v;
}
