// Mean pooling over consecutive groups of rows: y[g, c] = mean over the
// `group` rows g * group .. (g + 1) * group of x[r, c] (a ViT's patches
// pooled per image). One thread per output element, on a 2-D grid.

struct Params {
    len: u32,   // elements written: of y forward, of dx backward
    cols: u32,
    group: u32,
    accumulate: u32, // backward: 1 = add dx to the existing gradient
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn mean_pool(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.len) { return; }
    let g = i / p.cols;
    let c = i % p.cols;
    var s = 0.0;
    for (var r = 0u; r < p.group; r++) { s += x[(g * p.group + r) * p.cols + c]; }
    y[i] = s / f32(p.group);
}

// dx[r, c] (+)= dy[r / group, c] / group
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn mean_pool_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.len) { return; }
    let g = i / (p.cols * p.group);
    var v = dy[g * p.cols + i % p.cols] / f32(p.group);
    if (p.accumulate != 0u) { v += dx[i]; }
    dx[i] = v;
}
