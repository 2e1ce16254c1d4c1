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

// ---- self-attention of a batch, fused (FlashAttention's scheme) ----
// Training's and the full forward's attention over qkv ([batch, seq,
// 3 width] token-major: q, k, v, each [heads, head_dim]), causal or not,
// with an optional key padding mask ([batch, seq], nonzero = a real token).
// A workgroup is 16 x 16 threads (r = lid / 16, c = lid % 16) on one
// (item, head) and one tile of 16 queries (forward, query gradients) or 16
// keys (key and value gradients); the other side streams through
// workgroup memory 16 rows at a time, so no [seq, seq] tensor reaches
// global memory. The forward keeps each query's log-sum-exp; the backward
// recomputes the weights from it. No atomics: each output row is written
// by one thread, its sums taken in a fixed order that the CPU twin
// (src/cpu/attention.rs) keeps.

struct Shape {
    batch: u32,
    seq: u32,
    heads: u32,
    head_dim: u32,
    causal: u32,
    use_mask: u32,
    scale: f32,
    _pad: u32,
}

const TILE: u32 = 16u;
// The widest head (AttentionShape::MAX_FUSED_HEAD_DIM); each thread holds
// columns c, c + 16, c + 32, c + 48 of its row.
const MAX_HEAD_DIM: u32 = 64u;
const COLS: u32 = 4u;
// A panel is 16 rows of one head, each padded by one float so that the 16
// threads reading 16 different rows at one column hit different banks.
const PANEL: u32 = 1040u; // TILE * (MAX_HEAD_DIM + 1)

@group(0) @binding(0) var<uniform> shape: Shape;
@group(0) @binding(2) var<storage, read> key_mask: array<u32>;
// forward
@group(0) @binding(3) var<storage, read_write> attended: array<f32>;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;
// backward
@group(0) @binding(3) var<storage, read> attended_in: array<f32>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> d_attended: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<f32>;

// Three panels (A, B, C) and two 16 x 16 arrays of per-pair values, each
// named by its offset (WGSL passes no workgroup pointers to functions).
var<workgroup> panels: array<f32, 3u * PANEL>;
var<workgroup> pairs: array<f32, 512>;
const A: u32 = 0u;
const B: u32 = PANEL;
const C: u32 = 2u * PANEL;
const PAIRS_A: u32 = 0u;
const PAIRS_B: u32 = 256u;

// The workgroup's (item, head, tile), or false past the last.
struct Group {
    item: u32,
    head: u32,
    tile: u32,
    tiles: u32,
}

fn group_of(wid: vec3<u32>, nwg: vec3<u32>) -> Group {
    let tiles = (shape.seq + TILE - 1u) / TILE;
    let g = workgroup_index(wid, nwg);
    let pair = g / tiles;
    return Group(pair / shape.heads, pair % shape.heads, g % tiles, tiles);
}

fn group_count() -> u32 {
    return shape.batch * shape.heads * ((shape.seq + TILE - 1u) / TILE);
}

// Element e of part (0 q, 1 k, 2 v) of head `head` at position t.
fn qkv_at(item: u32, t: u32, part: u32, head: u32) -> u32 {
    let w = shape.heads * shape.head_dim;
    return (item * shape.seq + t) * 3u * w + part * w + head * shape.head_dim;
}

// Element 0 of head `head` at position t of out (or its gradient).
fn out_at(item: u32, t: u32, head: u32) -> u32 {
    let w = shape.heads * shape.head_dim;
    return (item * shape.seq + t) * w + head * shape.head_dim;
}

// Position t's log-sum-exp for head `head` ([batch, heads, seq]).
fn lse_at(item: u32, head: u32, t: u32) -> u32 {
    return (item * shape.heads + head) * shape.seq + t;
}

fn visible(item: u32, query: u32, key: u32) -> bool {
    if (query >= shape.seq || key >= shape.seq) { return false; }
    if (shape.causal != 0u && key > query) { return false; }
    if (shape.use_mask != 0u) { return key_mask[item * shape.seq + key] != 0u; }
    return true;
}

// Row i of the panel at `panel` starts at panel + i * (head_dim + 1).
fn row_start(panel: u32, i: u32) -> u32 {
    return panel + i * (shape.head_dim + 1u);
}

// Panels of the 16 positions from t0 (zeros past the end): part of qkv,
// out or its gradient.
fn load_qkv(panel: u32, item: u32, head: u32, t0: u32, part: u32, lid: u32) {
    let d = shape.head_dim;
    for (var i = lid; i < TILE * d; i += WG) {
        let row = i / d;
        let t = t0 + row;
        var v = 0.0;
        if (t < shape.seq) { v = qkv[qkv_at(item, t, part, head) + i % d]; }
        panels[row_start(panel, row) + i % d] = v;
    }
}

fn load_d_attended(panel: u32, item: u32, head: u32, t0: u32, lid: u32) {
    let d = shape.head_dim;
    for (var i = lid; i < TILE * d; i += WG) {
        let row = i / d;
        let t = t0 + row;
        var v = 0.0;
        if (t < shape.seq) { v = d_attended[out_at(item, t, head) + i % d]; }
        panels[row_start(panel, row) + i % d] = v;
    }
}

// Row i of panel x . row j of panel y.
fn panel_dot(x: u32, i: u32, y: u32, j: u32) -> f32 {
    let xi = row_start(x, i);
    let yj = row_start(y, j);
    var s = 0.0;
    for (var e = 0u; e < shape.head_dim; e += 1u) {
        s += panels[xi + e] * panels[yj + e];
    }
    return s;
}

// Thread (r, c)'s share of sum(d_out . out) for position t of the panel's
// rows (d_out in `panel` row r): elements c, c + 16, ...
fn delta_part(panel: u32, item: u32, head: u32, t: u32, r: u32, c: u32) -> f32 {
    var s = 0.0;
    if (t < shape.seq) {
        for (var col = c; col < shape.head_dim; col += TILE) {
            s += panels[row_start(panel, r) + col] * attended_in[out_at(item, t, head) + col];
        }
    }
    return s;
}

// The sum of row r of a 16 x 16 pair array, in column order.
fn row_sum(at: u32, r: u32) -> f32 {
    var s = 0.0;
    for (var c = 0u; c < TILE; c += 1u) { s += pairs[at + r * TILE + c]; }
    return s;
}

// acc[t] += sum over c of pair array `at` [r][c] * panel row c, column c_col + 16 t.
fn accumulate(acc: ptr<function, array<f32, COLS>>, at: u32, r: u32, panel: u32, c_col: u32) {
    for (var t = 0u; t < COLS; t += 1u) {
        let col = c_col + t * TILE;
        if (col < shape.head_dim) {
            var v = (*acc)[t];
            for (var c = 0u; c < TILE; c += 1u) {
                v += pairs[at + r * TILE + c] * panels[row_start(panel, c) + col];
            }
            (*acc)[t] = v;
        }
    }
}

// out = softmax(scale q k + masks) v; lse = each query's log-sum-exp (0,
// with out 0, for a query that sees no key).
@compute @workgroup_size(256)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    if (workgroup_index(wid, nwg) >= group_count()) { return; }
    let g = group_of(wid, nwg);
    let r = lid / TILE;
    let c = lid % TILE;
    let i = g.tile * TILE + r;
    load_qkv(A, g.item, g.head, g.tile * TILE, 0u, lid);
    var key_tiles = g.tiles;
    if (shape.causal != 0u) { key_tiles = g.tile + 1u; }
    var m = NEG_INF;
    var l = 0.0;
    var acc = array<f32, COLS>(0.0, 0.0, 0.0, 0.0);
    for (var kt = 0u; kt < key_tiles; kt += 1u) {
        workgroupBarrier(); // the last tile's panels and pairs are read
        load_qkv(B, g.item, g.head, kt * TILE, 1u, lid);
        load_qkv(C, g.item, g.head, kt * TILE, 2u, lid);
        workgroupBarrier();
        let j = kt * TILE + c;
        let seen = visible(g.item, i, j);
        var score = NEG_INF;
        if (seen) { score = shape.scale * panel_dot(A, r, B, c); }
        pairs[PAIRS_A + lid] = score;
        workgroupBarrier();
        var tile_max = NEG_INF;
        for (var c2 = 0u; c2 < TILE; c2 += 1u) { tile_max = max(tile_max, pairs[PAIRS_A + r * TILE + c2]); }
        let new_max = max(m, tile_max);
        var weight = 0.0;
        if (seen) { weight = exp(score - new_max); }
        pairs[PAIRS_B + lid] = weight;
        workgroupBarrier();
        let correction = exp(m - new_max);
        l = l * correction + row_sum(PAIRS_B, r);
        for (var t = 0u; t < COLS; t += 1u) { acc[t] *= correction; }
        accumulate(&acc, PAIRS_B, r, C, c);
        m = new_max;
    }
    if (i < shape.seq) {
        for (var t = 0u; t < COLS; t += 1u) {
            let col = c + t * TILE;
            if (col < shape.head_dim) {
                var v = 0.0;
                if (l > 0.0) { v = acc[t] / l; }
                attended[out_at(g.item, i, g.head) + col] = v;
            }
        }
        if (c == 0u) {
            var v = 0.0;
            if (l > 0.0) { v = m + log(l); }
            lse[lse_at(g.item, g.head, i)] = v;
        }
    }
}

// dq = scale sum_j ds_ij k_j, with p_ij = exp(scale q_i k_j - lse_i) and
// ds_ij = p_ij (d_out_i . v_j - d_out_i . out_i); one workgroup per tile of
// queries, keys streaming (values, then keys, through one panel).
@compute @workgroup_size(256)
fn attention_backward_queries(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    if (workgroup_index(wid, nwg) >= group_count()) { return; }
    let g = group_of(wid, nwg);
    let r = lid / TILE;
    let c = lid % TILE;
    let i = g.tile * TILE + r;
    load_qkv(A, g.item, g.head, g.tile * TILE, 0u, lid);
    load_d_attended(B, g.item, g.head, g.tile * TILE, lid);
    workgroupBarrier();
    pairs[PAIRS_A + lid] = delta_part(B, g.item, g.head, i, r, c);
    workgroupBarrier();
    let delta = row_sum(PAIRS_A, r);
    var lse_i = 0.0;
    if (i < shape.seq) { lse_i = lse_in[lse_at(g.item, g.head, i)]; }
    var key_tiles = g.tiles;
    if (shape.causal != 0u) { key_tiles = g.tile + 1u; }
    var acc = array<f32, COLS>(0.0, 0.0, 0.0, 0.0);
    for (var kt = 0u; kt < key_tiles; kt += 1u) {
        workgroupBarrier(); // the last tile's keys and pairs are read
        load_qkv(C, g.item, g.head, kt * TILE, 2u, lid);
        workgroupBarrier();
        let j = kt * TILE + c;
        let seen = visible(g.item, i, j);
        var dp = 0.0;
        if (seen) { dp = panel_dot(B, r, C, c); }
        workgroupBarrier(); // the values are read
        load_qkv(C, g.item, g.head, kt * TILE, 1u, lid);
        workgroupBarrier();
        var ds = 0.0;
        if (seen) {
            let p = exp(shape.scale * panel_dot(A, r, C, c) - lse_i);
            ds = p * (dp - delta);
        }
        pairs[PAIRS_A + lid] = ds;
        workgroupBarrier();
        accumulate(&acc, PAIRS_A, r, C, c);
    }
    if (i < shape.seq) {
        for (var t = 0u; t < COLS; t += 1u) {
            let col = c + t * TILE;
            if (col < shape.head_dim) { dqkv[qkv_at(g.item, i, 0u, g.head) + col] = shape.scale * acc[t]; }
        }
    }
}

// dk = scale sum_i ds_ij q_i and dv = sum_i p_ij d_out_i; one workgroup per
// tile of keys (thread (r, c): key r against query c of each query tile),
// queries streaming (queries, then d_out, then queries again, through one
// panel).
@compute @workgroup_size(256)
fn attention_backward_keys(@builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    if (workgroup_index(wid, nwg) >= group_count()) { return; }
    let g = group_of(wid, nwg);
    let r = lid / TILE;
    let c = lid % TILE;
    let j = g.tile * TILE + r;
    load_qkv(A, g.item, g.head, g.tile * TILE, 1u, lid);
    load_qkv(B, g.item, g.head, g.tile * TILE, 2u, lid);
    var first = 0u;
    if (shape.causal != 0u) { first = g.tile; }
    var acc_k = array<f32, COLS>(0.0, 0.0, 0.0, 0.0);
    var acc_v = array<f32, COLS>(0.0, 0.0, 0.0, 0.0);
    for (var qt = first; qt < g.tiles; qt += 1u) {
        let q0 = qt * TILE;
        let i = q0 + c;
        workgroupBarrier(); // the last tile's queries and pairs are read
        load_qkv(C, g.item, g.head, q0, 0u, lid);
        workgroupBarrier();
        let seen = visible(g.item, i, j);
        var p = 0.0;
        if (seen) {
            let lse_i = lse_in[lse_at(g.item, g.head, i)];
            p = exp(shape.scale * panel_dot(C, c, A, r) - lse_i);
        }
        workgroupBarrier(); // the queries are read
        load_d_attended(C, g.item, g.head, q0, lid);
        workgroupBarrier();
        // Thread (r, c) takes its share of query r's delta; PAIRS_B row c
        // then holds query c's shares.
        pairs[PAIRS_B + lid] = delta_part(C, g.item, g.head, q0 + r, r, c);
        var dp = 0.0;
        if (seen) { dp = panel_dot(C, c, B, r); }
        pairs[PAIRS_A + lid] = p;
        workgroupBarrier();
        let ds = p * (dp - row_sum(PAIRS_B, c));
        accumulate(&acc_v, PAIRS_A, r, C, c);
        workgroupBarrier(); // d_out and the deltas are read
        pairs[PAIRS_B + lid] = ds;
        load_qkv(C, g.item, g.head, q0, 0u, lid);
        workgroupBarrier();
        accumulate(&acc_k, PAIRS_B, r, C, c);
    }
    if (j < shape.seq) {
        for (var t = 0u; t < COLS; t += 1u) {
            let col = c + t * TILE;
            if (col < shape.head_dim) {
                dqkv[qkv_at(g.item, j, 1u, g.head) + col] = shape.scale * acc_k[t];
                dqkv[qkv_at(g.item, j, 2u, g.head) + col] = acc_v[t];
            }
        }
    }
}
