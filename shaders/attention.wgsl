// Decoding's attention, fused: one workgroup per (row, head) of a batch of
// sequences at one new position. The workgroup
//   1. appends the new key and value (parts 1 and 2 of the row of qkv,
//      [rows, 3 width] token-major) at `position` of its [capacity,
//      head_dim] slice of each cache ([rows, heads, capacity, head_dim]);
//   2. scores keys 0..=position against the query (part 0), scaled, in
//      workgroup memory, the new key read from qkv rather than from the
//      cache it was just written to;
//   3. takes their maximum and the sum of their exponentials as fixed
//      trees, and writes out[row, head] = the values weighted by the
//      exponentials in key order, over that sum.
// Nothing [rows, heads, positions] reaches global memory, and the CPU twin
// (src/cpu/attention.rs) takes the same steps.

struct Params {
    rows: u32,
    heads: u32,
    head_dim: u32,
    capacity: u32,
    position: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

// Keys a cache may hold (CachedAttention::MAX_CAPACITY): 4 KiB of weights.
const MAX_KEYS: u32 = 1024u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> keys: array<f32>;
@group(0) @binding(3) var<storage, read_write> values: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> weights: array<f32, MAX_KEYS>;

@compute @workgroup_size(256)
fn attend_cached(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let group = workgroup_index(wid, nwg);
    // Every thread of a workgroup takes the same branch: the barriers
    // below stay in uniform control flow.
    if (group >= p.rows * p.heads) { return; }
    let row = group / p.heads;
    let head = group % p.heads;
    let d = p.head_dim;
    let w = p.heads * d;
    let q = row * 3u * w + head * d;
    let new_key = q + w;
    let new_value = q + 2u * w;
    let cache = group * p.capacity * d;
    let n_keys = p.position + 1u;
    for (var i = lid; i < d; i += WG) {
        keys[cache + p.position * d + i] = qkv[new_key + i];
        values[cache + p.position * d + i] = qkv[new_value + i];
    }
    var m = NEG_INF;
    for (var j = lid; j < n_keys; j += WG) {
        var key = cache + j * d;
        var source_is_qkv = j == p.position;
        var s = 0.0;
        for (var i = 0u; i < d; i += 1u) {
            var k = 0.0;
            if (source_is_qkv) { k = qkv[new_key + i]; } else { k = keys[key + i]; }
            s = fma(qkv[q + i], k, s);
        }
        s *= p.scale;
        weights[j] = s;
        m = max(m, s);
    }
    m = workgroup_reduce(lid, m, true);
    var total = 0.0;
    for (var j = lid; j < n_keys; j += WG) {
        let e = exp(weights[j] - m);
        weights[j] = e;
        total += e;
    }
    total = workgroup_reduce(lid, total, false);
    for (var i = lid; i < d; i += WG) {
        var acc = 0.0;
        for (var j = 0u; j < n_keys; j += 1u) {
            var v = 0.0;
            if (j == p.position) { v = qkv[new_value + i]; } else { v = values[cache + j * d + i]; }
            acc = fma(weights[j], v, acc);
        }
        out[row * w + head * d + i] = acc / total;
    }
}
