// Token choice for generation, on the device: each row's next token from
// its logits [rows, vocab], greedy (argmax, lowest id on ties), sampled
// with temperature, top-k and top-p, or by the Gumbel-max trick (argmax of
// the logits plus Gumbel noise hashed from (seed, row, step, token)); and
// the Gumbel-softmax relaxation of that last choice (gumbel_logits), which
// draws the same noise again. One thread per row, walking the
// vocabulary in id order, so the CPU twin (src/cpu/choose.rs) runs the
// same arithmetic in the same order and draws the same random bits.
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

// Tokens of the row with key >= threshold and allowed.
fn count_at_least(base: u32, lse: f32, threshold: u32) -> u32 {
    var n = 0u;
    for (var j = 0u; j < p.vocab; j++) {
        if (allowed(j) && order_key(tempered(base, j, lse)) >= threshold) { n += 1u; }
    }
    return n;
}

// Sum of exp(value - top) over the tokens with key >= threshold (and >= floor).
fn mass_at_least(base: u32, lse: f32, top: f32, floor: u32, threshold: u32) -> f32 {
    var mass = 0.0;
    for (var j = 0u; j < p.vocab; j++) {
        let s = tempered(base, j, lse);
        let key = order_key(s);
        if (allowed(j) && key >= floor && key >= threshold) { mass += exp(s - top); }
    }
    return mass;
}

@compute @workgroup_size(64)
fn choose_tokens(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if (row >= p.rows) { return; }
    let out = row * p.steps + p.step;
    if (p.step > 0u) {
        let previous = history[out - 1u];
        if (previous == p.eos || previous == p.pad) {
            history[out] = p.pad;
            logprobs[out] = 0.0;
            next[row] = p.pad;
            return;
        }
    }
    let base = row * p.vocab;
    // Log-sum-exp over the tokens that may be chosen.
    var top = NEG_INF;
    for (var j = 0u; j < p.vocab; j++) {
        if (allowed(j)) { top = max(top, logits[base + j]); }
    }
    var sum = 0.0;
    for (var j = 0u; j < p.vocab; j++) {
        if (allowed(j)) { sum += exp(logits[base + j] - top); }
    }
    let lse = top + log(sum);

    var chosen = 0u;
    var found = false;
    if (p.sample == 0u) {
        for (var j = 0u; j < p.vocab; j++) {
            if (allowed(j) && (!found || logits[base + j] > logits[base + chosen])) {
                chosen = j;
                found = true;
            }
        }
    } else if (p.sample == 2u) {
        var best = NEG_INF;
        for (var j = 0u; j < p.vocab; j++) {
            let v = logits[base + j] + gumbel(p.seed_lo, p.seed_hi, p.first_row + row, p.step, j);
            if (allowed(j) && (!found || v > best)) {
                chosen = j;
                best = v;
                found = true;
            }
        }
    } else {
        var candidates = 0u;
        var best = NEG_INF;
        for (var j = 0u; j < p.vocab; j++) {
            if (allowed(j)) {
                candidates += 1u;
                best = max(best, tempered(base, j, lse));
            }
        }
        // floor: the smallest key kept by top-k (0 keeps all).
        var floor = 0u;
        if (p.top_k > 0u && p.top_k < candidates) {
            var lo = 0u;
            var hi = 0xffffffffu;
            while (lo < hi) {
                let mid = hi - (hi - lo) / 2u;
                if (count_at_least(base, lse, mid) >= p.top_k) { lo = mid; } else { hi = mid - 1u; }
            }
            floor = lo;
        }
        if (p.top_p < 1.0) {
            let goal = p.top_p * mass_at_least(base, lse, best, floor, 0u);
            var lo = floor;
            var hi = 0xffffffffu;
            while (lo < hi) {
                let mid = hi - (hi - lo) / 2u;
                if (mass_at_least(base, lse, best, floor, mid) >= goal) { lo = mid; } else { hi = mid - 1u; }
            }
            floor = lo;
        }
        let draw = random_unit(p.first_row + row, p.step) * mass_at_least(base, lse, best, floor, 0u);
        var acc = 0.0;
        for (var j = 0u; j < p.vocab; j++) {
            let s = tempered(base, j, lse);
            if (allowed(j) && order_key(s) >= floor) {
                chosen = j;
                acc += exp(s - best);
                if (draw < acc) { break; }
            }
        }
    }
    history[out] = chosen;
    logprobs[out] = logits[base + chosen] - lse;
    next[row] = chosen;
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
