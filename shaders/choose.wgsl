// Token choice for generation, on the device: each row's next token from
// its logits [rows, vocab], greedy (argmax, lowest id on ties), sampled
// with temperature, top-k and top-p, or by the Gumbel-max trick (argmax of
// the logits plus Gumbel noise hashed from (seed, row, step, token)); and
// the Gumbel-softmax relaxation of that last choice (gumbel_logits), which
// draws the same noise again. One workgroup per row, its 256 threads each
// walking a contiguous chunk of the vocabulary in id order (below), so the
// CPU twin (src/cpu/choose.rs) runs the same arithmetic in the same order
// and draws the same random bits.
//
// Sampling needs no sort: top-k keeps the tokens whose tempered
// log-probability is at least the k-th largest, top-p those at least the
// largest threshold whose kept mass reaches p (ties at a threshold stay
// in), both thresholds found by bisection over the order-preserving u32
// keys of the values; the draw then walks the kept tokens in id order.
// The random number is a hash of (seed, row, step): no state to carry.
//
// <bos> and padding are never chosen, nor the banned token (<unk> when
// suppressed). A row whose previous token was <eos> or padding is done: it
// gets padding and log-probability 0. history[row, step] and
// logprobs[row, step] record the choice and its log-probability under the
// policy: the tokens that may be chosen, at temperature 1 (the ids never
// chosen have none of its mass); next[row] feeds the next step's embedding.

struct Params {
    rows: u32,
    vocab: u32,
    step: u32,
    steps: u32,        // columns of history and logprobs
    sample: u32,       // 0: greedy, 1: sample, 2: Gumbel-max
    top_k: u32,        // 0: every token
    temperature: f32,
    top_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    first_row: u32,    // rows of earlier batches, so every row draws its own numbers
    banned: u32,       // a token never chosen (<unk> when suppressed), or 0xffffffff
    bos: u32,          // never chosen either, nor padding
    eos: u32,
    pad: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> next: array<u32>;
@group(0) @binding(3) var<storage, read_write> history: array<u32>;
@group(0) @binding(4) var<storage, read_write> logprobs: array<f32>;

// lowbias32 (Chris Wellons' integer hash).
fn mix32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// A uniform number in [0, 1) from the counter (seed, row, step).
fn random_unit(row: u32, step: u32) -> f32 {
    var h = mix32(p.seed_lo ^ 0x9e3779b9u);
    h = mix32(h ^ p.seed_hi);
    h = mix32(h ^ row);
    h = mix32(h ^ step);
    return f32(h >> 8u) * (1.0 / 16777216.0);
}

// Gumbel noise -log(-log u) for token j, u from the counter (seed, row,
// step, j). f32 rounds u to 1 for the largest bits: -log u is kept at
// least the smallest normal float, so the noise stays finite (an
// infinite one turns the Gumbel-softmax into NaN).
fn gumbel(seed_lo: u32, seed_hi: u32, row: u32, step: u32, j: u32) -> f32 {
    var h = mix32(seed_lo ^ 0x85ebca6bu);
    h = mix32(h ^ seed_hi);
    h = mix32(h ^ row);
    h = mix32(h ^ step);
    h = mix32(h ^ j);
    let u = (f32(h >> 8u) + 0.5) * (1.0 / 16777216.0);
    return -log(max(-log(u), 1.17549435e-38));
}

// Larger floats get larger keys.
fn order_key(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x80000000u) != 0u) { return ~bits; }
    return bits | 0x80000000u;
}

fn allowed(j: u32) -> bool {
    return j != p.banned && j != p.bos && j != p.pad;
}

// The tempered log-probability of token j (the shift by the row's
// log-sum-exp cancels in every ratio; it keeps the values small).
fn tempered(base: u32, j: u32, lse: f32) -> f32 {
    return (logits[base + j] - lse) / p.temperature;
}

// ---- one workgroup per row ----
//
// Thread t (a lane) takes the contiguous chunk [t c, (t + 1) c) of the
// vocabulary, c = ceil(vocab / 256), walking it in id order. A sum adds
// each lane's chunk in id order, then the lanes' sums in lane order; the
// CPU twin keeps that order, so both get the same bits (up to `exp`). A
// maximum (the prelude's `workgroup_reduce`), a count and an argmax
// (lowest id on ties) are exact in any order. Values the bisections'
// loops test pass through workgroup memory and `workgroupUniformLoad`,
// which keeps those loops in uniform control flow.

var<workgroup> lane_f: array<f32, 256>;
var<workgroup> lane_u: array<u32, 256>;
var<workgroup> shared_f: f32;
var<workgroup> shared_u: u32;

fn chunk_begin(lane: u32) -> u32 {
    return min(lane * ((p.vocab + WG - 1u) / WG), p.vocab);
}

fn chunk_end(lane: u32) -> u32 {
    return min(chunk_begin(lane) + (p.vocab + WG - 1u) / WG, p.vocab);
}

// The lanes' values added in lane order, in every thread.
fn lane_sum(lid: u32, v: f32) -> f32 {
    lane_f[lid] = v;
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0.0;
        for (var t = 0u; t < WG; t += 1u) { total += lane_f[t]; }
        shared_f = total;
    }
    return workgroupUniformLoad(&shared_f);
}

fn lane_count(lid: u32, v: u32) -> u32 {
    lane_u[lid] = v;
    workgroupBarrier();
    if (lid == 0u) {
        var n = 0u;
        for (var t = 0u; t < WG; t += 1u) { n += lane_u[t]; }
        shared_u = n;
    }
    return workgroupUniformLoad(&shared_u);
}

// The id of the largest value over the lanes (the lowest id on ties), or
// `if_none` where no lane found one; a lane that found none passes id
// 0xffffffff.
fn lane_argmax(lid: u32, v: f32, id: u32, if_none: u32) -> u32 {
    lane_f[lid] = v;
    lane_u[lid] = id;
    workgroupBarrier();
    if (lid == 0u) {
        var found = false;
        var best = NEG_INF;
        var chosen = if_none;
        for (var t = 0u; t < WG; t += 1u) {
            if (lane_u[t] != NONE && (!found || lane_f[t] > best)) {
                best = lane_f[t];
                chosen = lane_u[t];
                found = true;
            }
        }
        shared_u = chosen;
    }
    return workgroupUniformLoad(&shared_u);
}

const NONE: u32 = 0xffffffffu;

// Tokens of the row with key >= threshold and allowed.
fn count_at_least(lid: u32, base: u32, lse: f32, threshold: u32) -> u32 {
    var n = 0u;
    for (var j = chunk_begin(lid); j < chunk_end(lid); j += 1u) {
        if (allowed(j) && order_key(tempered(base, j, lse)) >= threshold) { n += 1u; }
    }
    return lane_count(lid, n);
}

// This lane's sum of exp(value - top) over the tokens with key >=
// threshold (and >= floor), in id order.
fn chunk_mass(lid: u32, base: u32, lse: f32, top: f32, floor: u32, threshold: u32) -> f32 {
    var mass = 0.0;
    for (var j = chunk_begin(lid); j < chunk_end(lid); j += 1u) {
        let s = tempered(base, j, lse);
        let key = order_key(s);
        if (allowed(j) && key >= floor && key >= threshold) { mass += exp(s - top); }
    }
    return mass;
}

fn mass_at_least(lid: u32, base: u32, lse: f32, top: f32, floor: u32, threshold: u32) -> f32 {
    return lane_sum(lid, chunk_mass(lid, base, lse, top, floor, threshold));
}

// Log-sum-exp of the row at `base` over the tokens that may be chosen.
fn log_sum_exp(lid: u32, base: u32) -> f32 {
    var top = NEG_INF;
    for (var j = chunk_begin(lid); j < chunk_end(lid); j += 1u) {
        if (allowed(j)) { top = max(top, logits[base + j]); }
    }
    top = workgroup_reduce(lid, top, true);
    var sum = 0.0;
    for (var j = chunk_begin(lid); j < chunk_end(lid); j += 1u) {
        if (allowed(j)) { sum += exp(logits[base + j] - top); }
    }
    return top + log(lane_sum(lid, sum));
}

@compute @workgroup_size(256)
fn choose_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let out = row * p.steps + p.step;
    if (p.step > 0u) {
        if (lid == 0u) { shared_u = history[out - 1u]; }
        let previous = workgroupUniformLoad(&shared_u);
        if (previous == p.eos || previous == p.pad) {
            if (lid == 0u) {
                history[out] = p.pad;
                logprobs[out] = 0.0;
                next[row] = p.pad;
            }
            return;
        }
    }
    let base = row * p.vocab;
    let begin = chunk_begin(lid);
    let end = chunk_end(lid);
    let lse = log_sum_exp(lid, base);

    var chosen = 0u;
    if (p.sample != 1u) {
        // Greedy, or Gumbel-max: the argmax of the logits, or of the
        // logits plus noise.
        var best = NEG_INF;
        var best_j = NONE;
        for (var j = begin; j < end; j += 1u) {
            var v = logits[base + j];
            if (p.sample == 2u) {
                v += gumbel(p.seed_lo, p.seed_hi, p.first_row + row, p.step, j);
            }
            if (allowed(j) && (best_j == NONE || v > best)) {
                best_j = j;
                best = v;
            }
        }
        chosen = lane_argmax(lid, best, best_j, 0u);
    } else {
        var candidates = 0u;
        var best = NEG_INF;
        for (var j = begin; j < end; j += 1u) {
            if (allowed(j)) {
                candidates += 1u;
                best = max(best, tempered(base, j, lse));
            }
        }
        candidates = lane_count(lid, candidates);
        best = workgroup_reduce(lid, best, true);
        // floor: the smallest key kept by top-k (0 keeps all).
        var floor = 0u;
        if (p.top_k > 0u && p.top_k < candidates) {
            var lo = 0u;
            var hi = 0xffffffffu;
            while (lo < hi) {
                let mid = hi - (hi - lo) / 2u;
                if (count_at_least(lid, base, lse, mid) >= p.top_k) { lo = mid; } else { hi = mid - 1u; }
            }
            floor = lo;
        }
        if (p.top_p < 1.0) {
            let goal = p.top_p * mass_at_least(lid, base, lse, best, floor, 0u);
            var lo = floor;
            var hi = 0xffffffffu;
            while (lo < hi) {
                let mid = hi - (hi - lo) / 2u;
                if (mass_at_least(lid, base, lse, best, floor, mid) >= goal) { lo = mid; } else { hi = mid - 1u; }
            }
            floor = lo;
        }
        // The draw falls in one lane's share of the kept mass: the lane
        // whose running total (the lanes before it, in lane order) is at
        // most the draw and passes it with its own mass. That lane walks
        // its kept tokens from its running total. A draw at the very top
        // (rounding) takes the last kept token.
        var last = 0u;
        for (var j = begin; j < end; j += 1u) {
            if (allowed(j) && order_key(tempered(base, j, lse)) >= floor) { last = j + 1u; }
        }
        lane_u[lid] = last;
        let mass = chunk_mass(lid, base, lse, best, floor, 0u);
        lane_f[lid] = mass;
        workgroupBarrier();
        if (lid == 0u) {
            var highest = 0u;
            for (var t = 0u; t < WG; t += 1u) { highest = max(highest, lane_u[t]); }
            // 0 where nothing is kept (NaN logits), as the CPU twin.
            shared_u = select(highest - 1u, 0u, highest == 0u);
        }
        var before = 0.0;
        var total = 0.0;
        for (var t = 0u; t < WG; t += 1u) {
            if (t == lid) { before = total; }
            total += lane_f[t];
        }
        let draw = random_unit(p.first_row + row, p.step) * total;
        workgroupBarrier();
        if (before <= draw && draw < before + mass) {
            var acc = before;
            var walked = 0u;
            for (var j = begin; j < end; j += 1u) {
                let s = tempered(base, j, lse);
                if (allowed(j) && order_key(s) >= floor) {
                    walked = j;
                    acc += exp(s - best);
                    if (draw < acc) { break; }
                }
            }
            shared_u = walked;
        }
        chosen = workgroupUniformLoad(&shared_u);
    }
    if (lid == 0u) {
        history[out] = chosen;
        logprobs[out] = logits[base + chosen] - lse;
        next[row] = chosen;
    }
}

// ---- beam search's candidates ----
// top_candidates: the `top_k` allowed tokens of largest log-probability
// over the allowed tokens of each row (lowest id on ties, ranked by the
// f32 value beam search adds, so ties of rounding rank as it ranks them),
// best first, as pairs of the id and the bits of its log-probability; id
// 0xffffffff and minus infinity past the last allowed one. One workgroup per row, in top_k rounds: in each, every lane takes
// the best token of its chunk that comes after the last round's pick (a
// smaller logit, or the same and a larger id), and the lanes' argmax is
// the round's pick. Beam search reads these [rows, top_k] back instead of
// [rows, vocab] logits.

@group(0) @binding(2) var<storage, read_write> candidates: array<u32>;

@compute @workgroup_size(256)
fn top_candidates(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wid, nwg);
    if (row >= p.rows) { return; }
    let base = row * p.vocab;
    let lse = log_sum_exp(lid, base);
    var last = NONE;
    var last_v = 0.0;
    for (var n = 0u; n < p.top_k; n += 1u) {
        var best = NEG_INF;
        var best_j = NONE;
        for (var j = chunk_begin(lid); j < chunk_end(lid); j += 1u) {
            let v = logits[base + j] - lse;
            let after = last == NONE || v < last_v || (v == last_v && j > last);
            if (allowed(j) && after && (best_j == NONE || v > best)) {
                best_j = j;
                best = v;
            }
        }
        let pick = lane_argmax(lid, best, best_j, NONE);
        if (pick != NONE) {
            last = pick;
            last_v = logits[base + pick] - lse;
        }
        if (lid == 0u) {
            let at = 2u * (row * p.top_k + n);
            candidates[at] = pick;
            var logprob = bitcast<f32>(0xff800000u); // minus infinity
            if (pick != NONE) { logprob = last_v; }
            candidates[at + 1u] = bitcast<u32>(logprob);
        }
    }
}

// gumbel_logits: out[r, j] = (logits[r, j] + gumbel(seed, first_row +
// r / positions, r % positions, j)) / tau, one thread per element.
struct GumbelParams {
    len: u32,
    vocab: u32,
    positions: u32,
    first_row: u32,
    seed_lo: u32,
    seed_hi: u32,
    tau: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> g: GumbelParams;
@group(0) @binding(1) var<storage, read> teacher_logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> perturbed: array<f32>;

@compute @workgroup_size(256)
fn gumbel_logits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= g.len) { return; }
    let r = i / g.vocab;
    let j = i % g.vocab;
    let noise = gumbel(g.seed_lo, g.seed_hi, g.first_row + r / g.positions, r % g.positions, j);
    perturbed[i] = (teacher_logits[i] + noise) / g.tau;
}
