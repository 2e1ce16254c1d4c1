// Embedding lookup and its deterministic backward.
// Forward: out[i, c] (+)= table[ids[i], c], or 0 where ids[i] is
// 0xffffffff (NO_ROW: a gather that moves rows between layouts leaves the
// rows with no source at zero). One thread per output element.
// Backward: the host groups token positions by id (see src/index.rs):
// `unique` holds each distinct id once, positions of unique[u] are
// order[offsets[u] .. offsets[u + 1]] in ascending order. One thread per
// (u, c) sums those rows of dout in that order and adds the sum to
// dtable[unique[u], c]: no two threads write the same element, no atomics.

struct Params {
    len: u32,      // forward: tokens * dim; backward: unique ids * dim
    dim: u32,
    accumulate: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn embedding_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.len) { return; }
    let token = i / p.dim;
    let c = i % p.dim;
    var v = 0.0;
    if (ids[token] != 0xffffffffu) { v = table[ids[token] * p.dim + c]; }
    if (p.accumulate != 0u) { v += out[i]; }
    out[i] = v;
}

@group(0) @binding(1) var<storage, read> dout: array<f32>;
@group(0) @binding(2) var<storage, read> unique: array<u32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read_write> dtable: array<f32>;

@compute @workgroup_size(256)
fn embedding_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.len) { return; }
    let u = i / p.dim;
    let c = i % p.dim;
    var s = 0.0;
    for (var k = offsets[u]; k < offsets[u + 1u]; k += 1u) {
        s += dout[order[k] * p.dim + c];
    }
    let j = unique[u] * p.dim + c;
    dtable[j] = dtable[j] + s;
}
