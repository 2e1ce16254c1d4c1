// One step of beam search, on the device: one thread per image ranks its
// live beams' continuations (each row's best 2 x width candidates from
// top_candidates, as (id, log-probability bits) pairs) by total score,
// then beam, then id, in rounds that each take the next best; finishes
// those that end, keeps the best width others as the new beams, and
// records both in `state` (layout in BeamStep, src/backend.rs): the trace
// [steps, rows, 3] of (parent, token, score bits), then per image the
// count of finished captions and the best width of them as (score bits,
// step, parent, token). The host reads `state` once, at the end, and walks
// the trace back. The work per step is at most 2 x width rounds over
// 2 x width^2 candidates per image: the caches' reorder, which follows
// `parents`, costs far more. The CPU twin is src/cpu/beam.rs.

struct Params {
    images: u32,
    width: u32,
    n_best: u32,
    count: u32,      // candidates per row: 2 x width
    steps: u32,
    step: u32,
    eos: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> candidates: array<u32>;
@group(0) @binding(2) var<storage, read_write> parents: array<u32>;
@group(0) @binding(3) var<storage, read_write> next: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;

const NO_TOKEN: u32 = 0xffffffffu;

struct Continuation {
    score: f32,
    beam: u32,
    id: u32,
}

// Ranked first: the higher score, then the lower beam, then the lower id.
fn before(a: Continuation, b: Continuation) -> bool {
    return a.score > b.score
        || (a.score == b.score && (a.beam < b.beam || (a.beam == b.beam && a.id < b.id)));
}

fn trace_at(step: u32, row: u32) -> u32 {
    return (step * p.images * p.width + row) * 3u;
}

fn finished_at(image: u32) -> u32 {
    return p.steps * p.images * p.width * 3u + image * (1u + 4u * p.width);
}

fn is_live(base: u32, k: u32) -> bool {
    if (p.step == 0u) { return k == 0u; }
    return state[trace_at(p.step - 1u, base + k) + 1u] != p.pad;
}

fn live_score(base: u32, k: u32) -> f32 {
    if (p.step == 0u) { return 0.0; }
    return bitcast<f32>(state[trace_at(p.step - 1u, base + k) + 2u]);
}

// Inserts a finished caption (c after the beam on row `parent`) among the
// image's best width, after every one it does not beat.
fn finish(image: u32, c: Continuation, parent: u32) {
    let f = finished_at(image);
    let n = state[f];
    var at = n;
    for (var k = 0u; k < n; k += 1u) {
        if (bitcast<f32>(state[f + 1u + 4u * k]) < c.score) {
            at = k;
            break;
        }
    }
    if (at >= p.width) { return; }
    // Entries at..end - 2 move down one (end > at, since at <= n).
    let end = min(n + 1u, p.width);
    for (var shifted = 0u; shifted < end - 1u - at; shifted += 1u) {
        let k = end - 1u - shifted;
        for (var j = 0u; j < 4u; j += 1u) {
            state[f + 1u + 4u * k + j] = state[f + 1u + 4u * (k - 1u) + j];
        }
    }
    let e = f + 1u + 4u * at;
    state[e] = bitcast<u32>(c.score);
    state[e + 1u] = p.step;
    state[e + 2u] = parent;
    state[e + 3u] = c.id;
    state[f] = end;
}

@compute @workgroup_size(64)
fn beam_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let image = workgroup_index(wid, nwg) * 64u + lid;
    if (image >= p.images) { return; }
    let base = image * p.width;
    let last = p.step + 1u == p.steps;
    var previous = Continuation(0.0, 0u, 0u);
    var kept = 0u;
    var best_kept = 0.0;
    for (var rank = 0u; rank < 2u * p.width; rank += 1u) {
        var found = false;
        var best = Continuation(0.0, 0u, 0u);
        for (var beam = 0u; beam < p.width; beam += 1u) {
            if (!is_live(base, beam)) { continue; }
            let score = live_score(base, beam);
            let row = (base + beam) * p.count;
            for (var n = 0u; n < p.count; n += 1u) {
                let id = candidates[2u * (row + n)];
                if (id == NO_TOKEN) { continue; }
                let c = Continuation(score + bitcast<f32>(candidates[2u * (row + n) + 1u]), beam, id);
                if ((rank == 0u || before(previous, c)) && (!found || before(c, best))) {
                    found = true;
                    best = c;
                }
            }
        }
        if (!found) { break; }
        previous = best;
        if (best.id == p.eos || last) {
            if (rank < p.width) { finish(image, best, base + best.beam); }
        } else if (kept < p.width) {
            let row = base + kept;
            parents[row] = base + best.beam;
            next[row] = best.id;
            let at = trace_at(p.step, row);
            state[at] = base + best.beam;
            state[at + 1u] = best.id;
            state[at + 2u] = bitcast<u32>(best.score);
            best_kept = select(max(best_kept, best.score), best.score, kept == 0u);
            kept += 1u;
        }
    }
    // Extending a beam only lowers its score: the image stops once its
    // n_best-th finished caption beats every beam kept.
    let f = finished_at(image);
    if (state[f] >= p.n_best && kept > 0u
        && best_kept <= bitcast<f32>(state[f + 1u + 4u * (p.n_best - 1u)])) {
        kept = 0u;
    }
    for (var r = kept; r < p.width; r += 1u) {
        let row = base + r;
        parents[row] = row;
        next[row] = p.pad;
        let at = trace_at(p.step, row);
        state[at] = row;
        state[at + 1u] = p.pad;
        state[at + 2u] = 0u;
    }
}
