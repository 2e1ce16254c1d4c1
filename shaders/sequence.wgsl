// Per-sequence quantities spread over each sequence's rows, computed where
// sampled ids already are (on the device).
//
// `spread_sequence_weights`: the coefficients of REINFORCE's surrogate loss,
//   coef[i] = alpha * weights[i / per_sequence] * [ids[i] != pad]
// for `rows` rows, `per_sequence` consecutive rows per sequence. One thread
// per row.

struct Params {
    rows: u32,
    per_sequence: u32,
    pad: u32,
    alpha: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> coef: array<f32>;

@compute @workgroup_size(256)
fn spread_sequence_weights(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.rows) { return; }
    var v = 0.0;
    if (ids[i] != p.pad) {
        v = p.alpha * weights[i / p.per_sequence];
    }
    coef[i] = v;
}
