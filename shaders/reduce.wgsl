// Deterministic reductions: no float atomics. Every result is a fixed tree
// over fixed chunks, so the same input gives the same bits on every run.
//
// Full reductions take two passes: `reduce_partials` reduces each chunk of
// `chunk` elements to one partial, written from out[out_index] on (so the
// partials of several tensors can share one buffer); `reduce_final`
// reduces the partials with one workgroup and writes one value at
// out[out_index].
// Column sums (the bias gradient) take two passes too: `column_partials`
// sums blocks of ROW_BLOCK rows per column, `column_sum` sums those blocks.
// `split_sum` is a split-K product's second pass (see matmul.wgsl).

struct Params {
    len: u32,        // elements (full) or rows (column)
    cols: u32,       // column reductions: the row length
    chunk: u32,      // reduce_partials: elements per workgroup
    op: u32,         // 0 = sum, 1 = max, 2 = sum of squares
    out_index: u32,  // where the value (reduce_final) or the first partial goes in `out`
    accumulate: u32, // reduce_final / column_sum: 1 = add to the existing value
    scale: f32,      // reduce_final: the value is multiplied by this (mean = 1/len)
    _pad: u32,
}

const OP_SUM: u32 = 0u;
const OP_MAX: u32 = 1u;
const OP_SUMSQ: u32 = 2u;
const ROW_BLOCK: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

fn identity() -> f32 {
    if (p.op == OP_MAX) { return NEG_INF; }
    return 0.0;
}

fn combine(acc: f32, v: f32) -> f32 {
    if (p.op == OP_MAX) { return max(acc, v); }
    return acc + v;
}

@compute @workgroup_size(256)
fn reduce_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let group = workgroup_index(wid, nwg);
    let start = group * p.chunk;
    let end = min(start + p.chunk, p.len);
    var acc = identity();
    for (var i = start + lid; i < end; i += WG) {
        var v = x[i];
        if (p.op == OP_SUMSQ) { v = v * v; }
        acc = combine(acc, v);
    }
    let total = workgroup_reduce(lid, acc, p.op == OP_MAX);
    if (lid == 0u) { out[p.out_index + group] = total; }
}

@compute @workgroup_size(256)
fn reduce_final(@builtin(local_invocation_index) lid: u32) {
    var acc = identity();
    for (var i = lid; i < p.len; i += WG) {
        acc = combine(acc, x[i]);
    }
    let total = workgroup_reduce(lid, acc, p.op == OP_MAX);
    if (lid == 0u) {
        var v = total * p.scale;
        if (p.accumulate != 0u) { v += out[p.out_index]; }
        out[p.out_index] = v;
    }
}

// out[block, c] = sum of x[r, c] over the rows r of block `block` (ROW_BLOCK rows).
// Grid: x over columns (256 per workgroup), y over row blocks.
@compute @workgroup_size(256)
fn column_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = wid.x * WG + lid;
    if (col >= p.cols) { return; }
    let row0 = wid.y * ROW_BLOCK;
    let row1 = min(row0 + ROW_BLOCK, p.len);
    var acc = 0.0;
    for (var r = row0; r < row1; r += 1u) {
        acc += x[r * p.cols + col];
    }
    out[wid.y * p.cols + col] = acc;
}

// out[c] (+)= sum over r of x[r, c], for the few rows of column partials.
@compute @workgroup_size(256)
fn column_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = wid.x * WG + lid;
    if (col >= p.cols) { return; }
    var acc = 0.0;
    for (var r = 0u; r < p.len; r += 1u) {
        acc += x[r * p.cols + col];
    }
    if (p.accumulate != 0u) { acc += out[col]; }
    out[col] = acc;
}

// A split-K product's partials (`chunk` splits, each `len` elements of C
// then `cols` column sums, as matmul.wgsl writes them): out[i] = scale *
// their sum over the splits, in split order (+ out[i] when accumulating),
// and sums[col] likewise for the column sums (unscaled, as the matmul's).
@group(0) @binding(3) var<storage, read_write> sums: array<f32>;

@compute @workgroup_size(256)
fn split_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    let splits = p.chunk;
    if (i < p.len) {
        var total = 0.0;
        for (var s = 0u; s < splits; s += 1u) {
            total += x[s * p.len + i];
        }
        var v = p.scale * total;
        if (p.accumulate != 0u) { v += out[i]; }
        out[i] = v;
    } else if (i < p.len + p.cols) {
        let col = i - p.len;
        var total = 0.0;
        for (var s = 0u; s < splits; s += 1u) {
            total += x[splits * p.len + s * p.cols + col];
        }
        var v = total;
        if (p.accumulate != 0u) { v += sums[col]; }
        sums[col] = v;
    }
}
