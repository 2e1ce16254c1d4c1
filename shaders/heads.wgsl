// Moves attention heads between the token-major layout of a linear layer's
// output and the head-major layout batched matmuls want.
//   token-major: src[(b * seq + t) * row_stride + col_offset + h * head_dim + e]
//   head-major:  dst[((b * heads + h) * seq + t) * head_dim + e]
// row_stride and col_offset select q, k or v inside a fused [B, T, 3C] qkv.
// One thread per element of the head-major array; 2-D grid.

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    head_dim: u32,
    row_stride: u32,
    col_offset: u32,
    accumulate: u32, // heads_to_tokens: 1 = add to the token-major destination
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

// Index of head-major element i in the token-major layout.
fn token_major_index(i: u32) -> u32 {
    let e = i % p.head_dim;
    let t = (i / p.head_dim) % p.seq;
    let h = (i / (p.head_dim * p.seq)) % p.heads;
    let b = i / (p.head_dim * p.seq * p.heads);
    return (b * p.seq + t) * p.row_stride + p.col_offset + h * p.head_dim + e;
}

@compute @workgroup_size(256)
fn tokens_to_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.batch * p.heads * p.seq * p.head_dim) {
        dst[i] = src[token_major_index(i)];
    }
}

@compute @workgroup_size(256)
fn heads_to_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.batch * p.heads * p.seq * p.head_dim) {
        let j = token_major_index(i);
        var v = src[i];
        if (p.accumulate != 0u) { v += dst[j]; }
        dst[j] = v;
    }
}
