// Prepended to every kernel family by src/shaders.rs (WGSL has no imports).
// Not a family of its own: it defines no entry point.

// Threads per workgroup of every 1-D kernel.
const WG: u32 = 256u;
const NEG_INF: f32 = -3.402823e38;

// Large 1-D launches use a 2-D grid (x * y workgroups) so more than 65535
// workgroups fit; these flatten it back.
fn workgroup_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wid, nwg) * WG + lid;
}

var<workgroup> scratch: array<f32, 256>;

// Sum (or max) of one value per thread across the workgroup, as a fixed
// tree: deterministic. Every thread gets the result; `scratch` is free again
// on return.
fn workgroup_reduce(lid: u32, v: f32, take_max: bool) -> f32 {
    scratch[lid] = v;
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (lid < stride) {
            if (take_max) {
                scratch[lid] = max(scratch[lid], scratch[lid + stride]);
            } else {
                scratch[lid] += scratch[lid + stride];
            }
        }
    }
    workgroupBarrier();
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

// GELU, tanh approximation (as GPT-2): y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))).
// Here for the elementwise kernels and the matmul epilogues.
const GELU_S: f32 = 0.7978845608028654; // sqrt(2 / pi)

// tanh that stays finite for large |u| on every backend.
fn stable_tanh(u: f32) -> f32 {
    let e = exp(-2.0 * abs(u));
    return sign(u) * (1.0 - e) / (1.0 + e);
}

fn gelu_value(v: f32) -> f32 {
    return 0.5 * v * (1.0 + stable_tanh(GELU_S * (v + 0.044715 * v * v * v)));
}

// d gelu(v) / dv.
fn gelu_slope(v: f32) -> f32 {
    let t = stable_tanh(GELU_S * (v + 0.044715 * v * v * v));
    let du = GELU_S * (1.0 + 3.0 * 0.044715 * v * v);
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du;
}
