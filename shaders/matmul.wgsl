// Batched matrix multiply: C[i] = alpha * op(A[i]) * op(B[i]) (+ C[i] when
// accumulating), with epilogues that spare a linear layer's neighbours a
// dispatch of their own (each for one product, no batch):
// - BIAS: C gets epilogue_in[col] added to every row (the forward);
// - GELU: epilogue_out = GELU(C) too (an MLP's first layer);
// - GELU_GRAD: the product is multiplied by GELU'(epilogue_in) elementwise
//   before C gets it (the gradient through an MLP's GELU);
// - COLUMN_SUMS: epilogue_out[col] (+)= the sum over kk of op(B)[kk, col]
//   (a linear layer's bias gradient beside its weight gradient).
// - RESIDUAL (after BIAS): C gets epilogue_add added elementwise (a
//   residual branch's last layer joining the stream).
//
// op(A) is m x k: A is stored row-major as [m, k], or as [k, m] when TRANS_A.
// op(B) is k x n: B is stored row-major as [k, n], or as [n, k] when TRANS_B.
// Batch item i (workgroup_id.z) is head i % heads of group i / heads; each
// operand's matrix for it starts at offset + group * group_stride +
// head * head_stride, its stored rows `ld` apart. Strides of 0 share one
// matrix (a weight) across the batch; a row stride wider than the row
// reads heads side by side in token-major rows, so attention needs no
// layout copies.
//
// Split-K (k_split > 0, one product into a packed C): workgroup z takes the
// k-range [z * k_split, (z + 1) * k_split) and writes its raw partial
// product to epilogue_out at [z, m, n] (its column sums of op(B) after all
// the products, at [splits, m, n] + [z, n]); the reduce family's
// `split_sum` then adds the splits in order, scales by alpha and
// accumulates, or, for a product with an epilogue other than COLUMN_SUMS,
// `split_epilogue` adds them in order and applies the epilogue as an
// unsplit product would: the same bits on every run, with many more
// workgroups for a product of few output tiles and a long k (a weight
// gradient, or decoding's few rows).
//
// Five variants compute the same thing, by the tile of C a workgroup takes
// (src/gpu/matmul_plan.rs chooses per product):
// - `matmul_shared`: 128x128, staged through workgroup memory in k-slices
//   of 8, 8x8 results per thread. For real GPUs' large products.
// - `matmul_shared_buffered`: the same with two staging buffers and one
//   barrier per slice, a candidate for real GPUs (below).
// - `matmul_registers`: 64x64, each thread owning a 4x4 block of C and
//   reading A and B straight from storage. Large products on CPU-type
//   adapters (lavapipe), where workgroup barriers are expensive, and real
//   GPUs' products of too few 128x128 tiles.
// - `matmul_skinny` (16x8, 4 rows per thread) and `matmul_row` (1x64, one
//   output per thread): products too small or too thin for the others to
//   fill a GPU.

struct Operand {
    offset: u32,
    ld: u32,
    group_stride: u32,
    head_stride: u32,
}

struct Params {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,     // TRANS_A | TRANS_B | ACCUMULATE and the epilogues
    alpha: f32,
    heads: u32,
    k_split: u32,   // 0: the whole k; else each split's k (a multiple of 8)
    splits: u32,    // split_epilogue: the splits whose partials it sums
    a: Operand,
    b: Operand,
    c: Operand,
}

const TRANS_A: u32 = 1u;
const TRANS_B: u32 = 2u;
const ACCUMULATE: u32 = 4u;
const BIAS: u32 = 8u;
const COLUMN_SUMS: u32 = 16u;
const GELU: u32 = 32u;
const GELU_GRAD: u32 = 64u;
const RESIDUAL: u32 = 128u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
// The bias (BIAS) or GELU's input (GELU_GRAD); another read-only operand
// is bound here otherwise.
@group(0) @binding(4) var<storage, read> epilogue_in: array<f32>;
// GELU(C) (GELU) or the column sums of op(B) (COLUMN_SUMS); a spare buffer
// otherwise.
@group(0) @binding(5) var<storage, read_write> epilogue_out: array<f32>;
// The residual stream, as large as C (RESIDUAL); A otherwise.
@group(0) @binding(6) var<storage, read> epilogue_add: array<f32>;

fn start(o: Operand, batch: u32) -> u32 {
    return o.offset + (batch / p.heads) * o.group_stride + (batch % p.heads) * o.head_stride;
}

// op(A)[row, kk] of the batch item whose A starts at `base`, 0 outside
// the matrix.
fn load_a(base: u32, row: u32, kk: u32) -> f32 {
    if (row >= p.m || kk >= p.k) {
        return 0.0;
    }
    if ((p.flags & TRANS_A) != 0u) {
        return a[base + kk * p.a.ld + row];
    }
    return a[base + row * p.a.ld + kk];
}

// op(B)[kk, col] of the batch item whose B starts at `base`, 0 outside
// the matrix.
fn load_b(base: u32, kk: u32, col: u32) -> f32 {
    if (kk >= p.k || col >= p.n) {
        return 0.0;
    }
    if ((p.flags & TRANS_B) != 0u) {
        return b[base + col * p.b.ld + kk];
    }
    return b[base + kk * p.b.ld + col];
}

// With split-K, the batch item is 0 and workgroup z the split.
fn batch_of(z: u32) -> u32 {
    return select(z, 0u, p.k_split != 0u);
}

// The k-range workgroup z sums over.
fn k_begin(z: u32) -> u32 {
    return select(0u, z * p.k_split, p.k_split != 0u);
}

fn k_end(z: u32) -> u32 {
    return select(p.k, min(p.k, (z + 1u) * p.k_split), p.k_split != 0u);
}

fn splits() -> u32 {
    return (p.k + p.k_split - 1u) / p.k_split;
}

// C[row, col] of the batch item whose C starts at `base`; with split-K,
// split z's partial product at that place.
fn store_c(base: u32, z: u32, row: u32, col: u32, value: f32) {
    if (row >= p.m || col >= p.n) {
        return;
    }
    if (p.k_split != 0u) {
        epilogue_out[(z * p.m + row) * p.n + col] = value;
        return;
    }
    let i = base + row * p.c.ld + col;
    var out = p.alpha * value;
    if ((p.flags & BIAS) != 0u) {
        out += epilogue_in[col];
    }
    if ((p.flags & RESIDUAL) != 0u) {
        out += epilogue_add[i];
    }
    if ((p.flags & GELU_GRAD) != 0u) {
        out *= gelu_slope(epilogue_in[i]);
    }
    if ((p.flags & ACCUMULATE) != 0u) {
        out += c[i];
    }
    c[i] = out;
    if ((p.flags & GELU) != 0u) {
        epilogue_out[i] = gelu_value(out);
    }
}

fn store_sum(z: u32, col: u32, value: f32) {
    if (col >= p.n) {
        return;
    }
    if (p.k_split != 0u) {
        epilogue_out[splits() * p.m * p.n + z * p.n + col] = value;
        return;
    }
    var out = value;
    if ((p.flags & ACCUMULATE) != 0u) {
        out += epilogue_out[col];
    }
    epilogue_out[col] = out;
}

// ---- register-tiled variant: workgroup 16x16 threads, 64x64 tile of C ----

// Every loop over a thread's results is written out, with the results in
// named vec4s: an array indexed in a loop can be left in local memory by a
// driver that does not unroll the loop, and naga gives no unroll hints.

// C's four columns from `col` of one row, as `store_c` stores each.
fn store4(base: u32, z: u32, row: u32, col: u32, v: vec4<f32>) {
    store_c(base, z, row, col, v.x);
    store_c(base, z, row, col + 1u, v.y);
    store_c(base, z, row, col + 2u, v.z);
    store_c(base, z, row, col + 3u, v.w);
}

// Four column sums from `col`, as `store_sum` stores each.
fn store_sum4(z: u32, col: u32, v: vec4<f32>) {
    store_sum(z, col, v.x);
    store_sum(z, col + 1u, v.y);
    store_sum(z, col + 2u, v.z);
    store_sum(z, col + 3u, v.w);
}

@compute @workgroup_size(16, 16, 1)
fn matmul_registers(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let batch = batch_of(wid.z);
    let base_a = start(p.a, batch);
    let base_b = start(p.b, batch);
    let row0 = wid.y * 64u + lid.y * 4u;
    let col0 = wid.x * 64u + lid.x * 4u;
    // Row i of the thread's 4 x 4 block of C.
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    // The threads of C's first rows also sum B's columns.
    let sum_b = (p.flags & COLUMN_SUMS) != 0u && row0 == 0u;
    var b_sum = vec4<f32>(0.0);
    for (var kk = k_begin(wid.z); kk < k_end(wid.z); kk += 1u) {
        let bv = vec4<f32>(
            load_b(base_b, kk, col0),
            load_b(base_b, kk, col0 + 1u),
            load_b(base_b, kk, col0 + 2u),
            load_b(base_b, kk, col0 + 3u),
        );
        c0 = fma(vec4<f32>(load_a(base_a, row0, kk)), bv, c0);
        c1 = fma(vec4<f32>(load_a(base_a, row0 + 1u, kk)), bv, c1);
        c2 = fma(vec4<f32>(load_a(base_a, row0 + 2u, kk)), bv, c2);
        c3 = fma(vec4<f32>(load_a(base_a, row0 + 3u, kk)), bv, c3);
        if (sum_b) {
            b_sum += bv;
        }
    }
    let base_c = start(p.c, batch);
    store4(base_c, wid.z, row0, col0, c0);
    store4(base_c, wid.z, row0 + 1u, col0, c1);
    store4(base_c, wid.z, row0 + 2u, col0, c2);
    store4(base_c, wid.z, row0 + 3u, col0, c3);
    if (sum_b) {
        store_sum4(wid.z, col0, b_sum);
    }
}

// ---- small tiles: products too small or too thin to fill a GPU ----

// A 16 x 8 tile of C per workgroup of 32 threads, each thread 4 rows of
// one column: skinny products (the mapper's rows are a batch's images)
// and small ones, with 8 to 16 times the workgroups of the 64 x 64 tile.
// Consecutive threads take consecutive columns of B; each B value read
// serves 4 rows.
@compute @workgroup_size(8, 4, 1)
fn matmul_skinny(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let batch = batch_of(wid.z);
    let base_a = start(p.a, batch);
    let base_b = start(p.b, batch);
    let row0 = wid.y * 16u + lid.y * 4u;
    let col = wid.x * 8u + lid.x;
    // Rows row0.. as one vec4, not an array indexed by a loop counter,
    // which a driver may keep in local memory.
    var acc = vec4<f32>(0.0);
    var b_sum = 0.0;
    for (var kk = k_begin(wid.z); kk < k_end(wid.z); kk += 1u) {
        let bv = load_b(base_b, kk, col);
        b_sum += bv;
        let av = vec4<f32>(
            load_a(base_a, row0, kk),
            load_a(base_a, row0 + 1u, kk),
            load_a(base_a, row0 + 2u, kk),
            load_a(base_a, row0 + 3u, kk),
        );
        acc = fma(av, vec4<f32>(bv), acc);
    }
    let base_c = start(p.c, batch);
    store_c(base_c, wid.z, row0, col, acc.x);
    store_c(base_c, wid.z, row0 + 1u, col, acc.y);
    store_c(base_c, wid.z, row0 + 2u, col, acc.z);
    store_c(base_c, wid.z, row0 + 3u, col, acc.w);
    if ((p.flags & COLUMN_SUMS) != 0u && row0 == 0u) {
        store_sum(wid.z, col, b_sum);
    }
}

// A 1 x 64 tile of C per workgroup, one output per thread: products of a
// few rows, which a taller tile would mostly pad.
@compute @workgroup_size(64, 1, 1)
fn matmul_row(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let batch = batch_of(wid.z);
    let base_a = start(p.a, batch);
    let base_b = start(p.b, batch);
    let row = wid.y;
    let col = wid.x * 64u + lid.x;
    var acc = 0.0;
    var b_sum = 0.0;
    for (var kk = k_begin(wid.z); kk < k_end(wid.z); kk += 1u) {
        let bv = load_b(base_b, kk, col);
        acc = fma(load_a(base_a, row, kk), bv, acc);
        b_sum += bv;
    }
    store_c(start(p.c, batch), wid.z, row, col, acc);
    if ((p.flags & COLUMN_SUMS) != 0u && row == 0u) {
        store_sum(wid.z, col, b_sum);
    }
}

// ---- shared-memory variant: 256 threads, 128x128 tile of C, k-slices of 8 ----
//
// A slice of A (128 rows x 8) and one of B (8 x 128 columns) are staged in
// workgroup memory k-major, as vec4s: each k-row holds 32 vec4s and one of
// padding, so the 32 threads that store one step of a slice hit 32
// different banks. Thread (tx, ty) owns rows ty*4.. and 64 + ty*4.., and
// columns tx*4.. and 64 + tx*4.., of the tile (8x8 results): the 16
// threads of a row of the workgroup read 16 consecutive vec4s of B, free
// of bank conflicts. While a slice is multiplied, each thread's share of
// the next one is already on its way from storage into registers.

const TILE: u32 = 128u;
const SLICE: u32 = 8u;
// vec4s per staged k-row: 32 and one of padding.
const PADDED: u32 = 33u;

var<workgroup> tile_a: array<vec4<f32>, 264>; // [SLICE][PADDED]
var<workgroup> tile_b: array<vec4<f32>, 264>; // [SLICE][PADDED]

// A thread's share of one slice: 4 elements of A's and 4 of B's, element e
// at (row or column of the tile, k within the slice) = `staged(li, e, ..)`.
struct Slice {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Where element e of thread li's share sits: neighbouring threads take
// neighbouring addresses of the stored operand, so the index that is
// contiguous in memory varies fastest. `k_fast`: the operand's k is
// contiguous (A untransposed, B transposed).
fn staged(li: u32, e: u32, k_fast: bool) -> vec2<u32> {
    let idx = li + e * 256u; // 0..1024
    if (k_fast) {
        return vec2<u32>(idx / SLICE, idx % SLICE);
    }
    return vec2<u32>(idx % TILE, idx / TILE);
}

fn fetch_a(base_a: u32, tile_row: u32, k0: u32, li: u32, e: u32) -> f32 {
    let at = staged(li, e, (p.flags & TRANS_A) == 0u);
    return load_a(base_a, tile_row + at.x, k0 + at.y);
}

fn fetch_b(base_b: u32, tile_col: u32, k0: u32, li: u32, e: u32) -> f32 {
    let at = staged(li, e, (p.flags & TRANS_B) != 0u);
    return load_b(base_b, k0 + at.y, tile_col + at.x);
}

fn fetch(base_a: u32, base_b: u32, tile_row: u32, tile_col: u32, k0: u32, li: u32) -> Slice {
    return Slice(
        vec4<f32>(
            fetch_a(base_a, tile_row, k0, li, 0u),
            fetch_a(base_a, tile_row, k0, li, 1u),
            fetch_a(base_a, tile_row, k0, li, 2u),
            fetch_a(base_a, tile_row, k0, li, 3u),
        ),
        vec4<f32>(
            fetch_b(base_b, tile_col, k0, li, 0u),
            fetch_b(base_b, tile_col, k0, li, 1u),
            fetch_b(base_b, tile_col, k0, li, 2u),
            fetch_b(base_b, tile_col, k0, li, 3u),
        ),
    );
}

// Stages element e of a thread's share in workgroup memory.
fn stage(li: u32, e: u32, a_value: f32, b_value: f32) {
    let at_a = staged(li, e, (p.flags & TRANS_A) == 0u);
    tile_a[at_a.y * PADDED + at_a.x / 4u][at_a.x % 4u] = a_value;
    let at_b = staged(li, e, (p.flags & TRANS_B) != 0u);
    tile_b[at_b.y * PADDED + at_b.x / 4u][at_b.x % 4u] = b_value;
}

// Thread (tx, ty) owns rows ty*4.. and 64 + ty*4.. of the tile, and columns
// tx*4.. and 64 + tx*4..: row i's results are c{i}_lo (the first four
// columns) and c{i}_hi (the other four).
@compute @workgroup_size(256, 1, 1)
fn matmul_shared(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let batch = batch_of(wid.z);
    let base_a = start(p.a, batch);
    let base_b = start(p.b, batch);
    let tile_row = wid.y * TILE;
    let tile_col = wid.x * TILE;
    let tx = li % 16u;
    let ty = li / 16u;
    var c0_lo = vec4<f32>(0.0);
    var c0_hi = vec4<f32>(0.0);
    var c1_lo = vec4<f32>(0.0);
    var c1_hi = vec4<f32>(0.0);
    var c2_lo = vec4<f32>(0.0);
    var c2_hi = vec4<f32>(0.0);
    var c3_lo = vec4<f32>(0.0);
    var c3_hi = vec4<f32>(0.0);
    var c4_lo = vec4<f32>(0.0);
    var c4_hi = vec4<f32>(0.0);
    var c5_lo = vec4<f32>(0.0);
    var c5_hi = vec4<f32>(0.0);
    var c6_lo = vec4<f32>(0.0);
    var c6_hi = vec4<f32>(0.0);
    var c7_lo = vec4<f32>(0.0);
    var c7_hi = vec4<f32>(0.0);
    // The threads of C's first rows also sum B's columns.
    let sum_b = (p.flags & COLUMN_SUMS) != 0u && tile_row == 0u && ty == 0u;
    var b_sum_lo = vec4<f32>(0.0);
    var b_sum_hi = vec4<f32>(0.0);
    // A split's range is a whole number of slices: only the last one of
    // k can run past it, and the loads read zeros there.
    let first = k_begin(wid.z);
    let last = k_end(wid.z);
    var next = fetch(base_a, base_b, tile_row, tile_col, first, li);
    for (var k0 = first; k0 < last; k0 += SLICE) {
        stage(li, 0u, next.a.x, next.b.x);
        stage(li, 1u, next.a.y, next.b.y);
        stage(li, 2u, next.a.z, next.b.z);
        stage(li, 3u, next.a.w, next.b.w);
        workgroupBarrier();
        if (k0 + SLICE < last) {
            next = fetch(base_a, base_b, tile_row, tile_col, k0 + SLICE, li);
        }
        for (var kk = 0u; kk < SLICE; kk += 1u) {
            let a_lo = tile_a[kk * PADDED + ty];
            let a_hi = tile_a[kk * PADDED + 16u + ty];
            let b_lo = tile_b[kk * PADDED + tx];
            let b_hi = tile_b[kk * PADDED + 16u + tx];
            if (sum_b) {
                b_sum_lo += b_lo;
                b_sum_hi += b_hi;
            }
            c0_lo = fma(vec4<f32>(a_lo.x), b_lo, c0_lo);
            c0_hi = fma(vec4<f32>(a_lo.x), b_hi, c0_hi);
            c1_lo = fma(vec4<f32>(a_lo.y), b_lo, c1_lo);
            c1_hi = fma(vec4<f32>(a_lo.y), b_hi, c1_hi);
            c2_lo = fma(vec4<f32>(a_lo.z), b_lo, c2_lo);
            c2_hi = fma(vec4<f32>(a_lo.z), b_hi, c2_hi);
            c3_lo = fma(vec4<f32>(a_lo.w), b_lo, c3_lo);
            c3_hi = fma(vec4<f32>(a_lo.w), b_hi, c3_hi);
            c4_lo = fma(vec4<f32>(a_hi.x), b_lo, c4_lo);
            c4_hi = fma(vec4<f32>(a_hi.x), b_hi, c4_hi);
            c5_lo = fma(vec4<f32>(a_hi.y), b_lo, c5_lo);
            c5_hi = fma(vec4<f32>(a_hi.y), b_hi, c5_hi);
            c6_lo = fma(vec4<f32>(a_hi.z), b_lo, c6_lo);
            c6_hi = fma(vec4<f32>(a_hi.z), b_hi, c6_hi);
            c7_lo = fma(vec4<f32>(a_hi.w), b_lo, c7_lo);
            c7_hi = fma(vec4<f32>(a_hi.w), b_hi, c7_hi);
        }
        workgroupBarrier();
    }
    let base_c = start(p.c, batch);
    let col_lo = tile_col + tx * 4u;
    let col_hi = tile_col + 64u + tx * 4u;
    let row_lo = tile_row + ty * 4u;
    let row_hi = tile_row + 64u + ty * 4u;
    store4(base_c, wid.z, row_lo, col_lo, c0_lo);
    store4(base_c, wid.z, row_lo, col_hi, c0_hi);
    store4(base_c, wid.z, row_lo + 1u, col_lo, c1_lo);
    store4(base_c, wid.z, row_lo + 1u, col_hi, c1_hi);
    store4(base_c, wid.z, row_lo + 2u, col_lo, c2_lo);
    store4(base_c, wid.z, row_lo + 2u, col_hi, c2_hi);
    store4(base_c, wid.z, row_lo + 3u, col_lo, c3_lo);
    store4(base_c, wid.z, row_lo + 3u, col_hi, c3_hi);
    store4(base_c, wid.z, row_hi, col_lo, c4_lo);
    store4(base_c, wid.z, row_hi, col_hi, c4_hi);
    store4(base_c, wid.z, row_hi + 1u, col_lo, c5_lo);
    store4(base_c, wid.z, row_hi + 1u, col_hi, c5_hi);
    store4(base_c, wid.z, row_hi + 2u, col_lo, c6_lo);
    store4(base_c, wid.z, row_hi + 2u, col_hi, c6_hi);
    store4(base_c, wid.z, row_hi + 3u, col_lo, c7_lo);
    store4(base_c, wid.z, row_hi + 3u, col_hi, c7_hi);
    if (sum_b) {
        store_sum4(wid.z, col_lo, b_sum_lo);
        store_sum4(wid.z, col_hi, b_sum_hi);
    }
}

// ---- the 128x128 kernel with two staging buffers ----
//
// `matmul_shared`'s tile, threads and arithmetic, in the same order, with
// each slice staged in one of two buffers in turn: a thread stages the
// next slice into the other buffer while its neighbours may still read
// this one, so one barrier per slice suffices where `matmul_shared` needs
// two. Two padded buffers would outgrow WebGPU's 16 KiB of workgroup
// memory, so each k-row holds its 32 vec4s unpadded, the vec4 at v stored
// at v ^ k: the threads staging one step of a slice still hit different
// banks, and the 16 threads reading a k-row still read 16 different
// vec4s. A candidate for real GPUs, compared kernel by kernel in
// `captune bench matmuls` and chosen with CAPTUNE_MATMUL_TILES=buffered.

// vec4s per staged slice (SLICE k-rows of 32).
const BUFFER: u32 = 256u;

var<workgroup> buffered_a: array<vec4<f32>, 512>; // [2][SLICE][32], swizzled
var<workgroup> buffered_b: array<vec4<f32>, 512>; // [2][SLICE][32], swizzled

// Where vec4 v of k-row k of the buffer starting at `at` is kept.
fn swizzled(at: u32, k: u32, v: u32) -> u32 {
    return at + k * 32u + (v ^ k);
}

// Stages element e of a thread's share in the buffer starting at `at`.
fn stage_buffered(at: u32, li: u32, e: u32, a_value: f32, b_value: f32) {
    let at_a = staged(li, e, (p.flags & TRANS_A) == 0u);
    buffered_a[swizzled(at, at_a.y, at_a.x / 4u)][at_a.x % 4u] = a_value;
    let at_b = staged(li, e, (p.flags & TRANS_B) != 0u);
    buffered_b[swizzled(at, at_b.y, at_b.x / 4u)][at_b.x % 4u] = b_value;
}

fn stage_slice(at: u32, li: u32, s: Slice) {
    stage_buffered(at, li, 0u, s.a.x, s.b.x);
    stage_buffered(at, li, 1u, s.a.y, s.b.y);
    stage_buffered(at, li, 2u, s.a.z, s.b.z);
    stage_buffered(at, li, 3u, s.a.w, s.b.w);
}

@compute @workgroup_size(256, 1, 1)
fn matmul_shared_buffered(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let batch = batch_of(wid.z);
    let base_a = start(p.a, batch);
    let base_b = start(p.b, batch);
    let tile_row = wid.y * TILE;
    let tile_col = wid.x * TILE;
    let tx = li % 16u;
    let ty = li / 16u;
    var c0_lo = vec4<f32>(0.0);
    var c0_hi = vec4<f32>(0.0);
    var c1_lo = vec4<f32>(0.0);
    var c1_hi = vec4<f32>(0.0);
    var c2_lo = vec4<f32>(0.0);
    var c2_hi = vec4<f32>(0.0);
    var c3_lo = vec4<f32>(0.0);
    var c3_hi = vec4<f32>(0.0);
    var c4_lo = vec4<f32>(0.0);
    var c4_hi = vec4<f32>(0.0);
    var c5_lo = vec4<f32>(0.0);
    var c5_hi = vec4<f32>(0.0);
    var c6_lo = vec4<f32>(0.0);
    var c6_hi = vec4<f32>(0.0);
    var c7_lo = vec4<f32>(0.0);
    var c7_hi = vec4<f32>(0.0);
    let sum_b = (p.flags & COLUMN_SUMS) != 0u && tile_row == 0u && ty == 0u;
    var b_sum_lo = vec4<f32>(0.0);
    var b_sum_hi = vec4<f32>(0.0);
    let first = k_begin(wid.z);
    let last = k_end(wid.z);
    stage_slice(0u, li, fetch(base_a, base_b, tile_row, tile_col, first, li));
    workgroupBarrier();
    var current = 0u;
    for (var k0 = first; k0 < last; k0 += SLICE) {
        let more = k0 + SLICE < last;
        var next: Slice;
        if (more) {
            next = fetch(base_a, base_b, tile_row, tile_col, k0 + SLICE, li);
        }
        for (var kk = 0u; kk < SLICE; kk += 1u) {
            let a_lo = buffered_a[swizzled(current, kk, ty)];
            let a_hi = buffered_a[swizzled(current, kk, 16u + ty)];
            let b_lo = buffered_b[swizzled(current, kk, tx)];
            let b_hi = buffered_b[swizzled(current, kk, 16u + tx)];
            if (sum_b) {
                b_sum_lo += b_lo;
                b_sum_hi += b_hi;
            }
            c0_lo = fma(vec4<f32>(a_lo.x), b_lo, c0_lo);
            c0_hi = fma(vec4<f32>(a_lo.x), b_hi, c0_hi);
            c1_lo = fma(vec4<f32>(a_lo.y), b_lo, c1_lo);
            c1_hi = fma(vec4<f32>(a_lo.y), b_hi, c1_hi);
            c2_lo = fma(vec4<f32>(a_lo.z), b_lo, c2_lo);
            c2_hi = fma(vec4<f32>(a_lo.z), b_hi, c2_hi);
            c3_lo = fma(vec4<f32>(a_lo.w), b_lo, c3_lo);
            c3_hi = fma(vec4<f32>(a_lo.w), b_hi, c3_hi);
            c4_lo = fma(vec4<f32>(a_hi.x), b_lo, c4_lo);
            c4_hi = fma(vec4<f32>(a_hi.x), b_hi, c4_hi);
            c5_lo = fma(vec4<f32>(a_hi.y), b_lo, c5_lo);
            c5_hi = fma(vec4<f32>(a_hi.y), b_hi, c5_hi);
            c6_lo = fma(vec4<f32>(a_hi.z), b_lo, c6_lo);
            c6_hi = fma(vec4<f32>(a_hi.z), b_hi, c6_hi);
            c7_lo = fma(vec4<f32>(a_hi.w), b_lo, c7_lo);
            c7_hi = fma(vec4<f32>(a_hi.w), b_hi, c7_hi);
        }
        // The other buffer was last read before the previous barrier.
        current = BUFFER - current;
        if (more) {
            stage_slice(current, li, next);
        }
        workgroupBarrier();
    }
    let base_c = start(p.c, batch);
    let col_lo = tile_col + tx * 4u;
    let col_hi = tile_col + 64u + tx * 4u;
    let row_lo = tile_row + ty * 4u;
    let row_hi = tile_row + 64u + ty * 4u;
    store4(base_c, wid.z, row_lo, col_lo, c0_lo);
    store4(base_c, wid.z, row_lo, col_hi, c0_hi);
    store4(base_c, wid.z, row_lo + 1u, col_lo, c1_lo);
    store4(base_c, wid.z, row_lo + 1u, col_hi, c1_hi);
    store4(base_c, wid.z, row_lo + 2u, col_lo, c2_lo);
    store4(base_c, wid.z, row_lo + 2u, col_hi, c2_hi);
    store4(base_c, wid.z, row_lo + 3u, col_lo, c3_lo);
    store4(base_c, wid.z, row_lo + 3u, col_hi, c3_hi);
    store4(base_c, wid.z, row_hi, col_lo, c4_lo);
    store4(base_c, wid.z, row_hi, col_hi, c4_hi);
    store4(base_c, wid.z, row_hi + 1u, col_lo, c5_lo);
    store4(base_c, wid.z, row_hi + 1u, col_hi, c5_hi);
    store4(base_c, wid.z, row_hi + 2u, col_lo, c6_lo);
    store4(base_c, wid.z, row_hi + 2u, col_hi, c6_hi);
    store4(base_c, wid.z, row_hi + 3u, col_lo, c7_lo);
    store4(base_c, wid.z, row_hi + 3u, col_hi, c7_hi);
    if (sum_b) {
        store_sum4(wid.z, col_lo, b_sum_lo);
        store_sum4(wid.z, col_hi, b_sum_hi);
    }
}

// ---- the second pass of a split-K product with an epilogue ----

// One thread per element of C: the sum of the splits' partials (bound as
// A, [splits, m, n] as the first pass wrote them), in split order, stored
// through `store_c`'s epilogue (BIAS, RESIDUAL, GELU, GELU_GRAD, alpha and
// ACCUMULATE). Dispatched with k_split 0 and `splits` set.
@compute @workgroup_size(256)
fn split_epilogue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_index(wid, nwg, lid);
    let len = p.m * p.n;
    if (i >= len) {
        return;
    }
    var total = 0.0;
    for (var s = 0u; s < p.splits; s += 1u) {
        total += a[s * len + i];
    }
    store_c(start(p.c, 0u), 0u, i / p.n, i % p.n, total);
}
