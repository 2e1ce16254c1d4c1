//! CPU twin of `shaders/beam.wgsl`: one step of beam search per image, in
//! the kernel's order (selection rounds over the live beams' candidates,
//! finished captions inserted one at a time).

use crate::backend::BeamStep;

/// A continuation: its total score, the beam (0..width) it extends, its id.
#[derive(Clone, Copy)]
struct Continuation {
    score: f32,
    beam: usize,
    id: u32,
}

impl Continuation {
    /// Ranked first: the higher score, then the lower beam, then the lower id.
    fn before(&self, other: &Continuation) -> bool {
        self.score > other.score
            || (self.score == other.score && (self.beam, self.id) < (other.beam, other.id))
    }
}

pub fn beam_step(
    candidates: &[u32],
    s: &BeamStep,
    parents: &mut [u32],
    next: &mut [u32],
    state: &mut [u32],
) {
    let (width, count, rows) = (s.width, s.count(), s.rows());
    let trace_at = |step: usize, row: usize| (step * rows + row) * 3;
    let last = s.step + 1 == s.steps;
    for image in 0..s.images {
        let base = image * width;
        // The beam on row base + k before this step: its score, if live.
        let live_score = |state: &[u32], k: usize| -> Option<f32> {
            if s.step == 0 {
                return (k == 0).then_some(0.0);
            }
            let at = trace_at(s.step - 1, base + k);
            (state[at + 1] != s.pad).then(|| f32::from_bits(state[at + 2]))
        };
        let mut previous: Option<Continuation> = None;
        let mut kept = 0;
        let mut best_kept = 0.0f32;
        for rank in 0..2 * width {
            let mut best: Option<Continuation> = None;
            for beam in 0..width {
                let Some(score) = live_score(state, beam) else {
                    continue;
                };
                let row = (base + beam) * count;
                for pair in candidates[2 * row..2 * (row + count)].chunks(2) {
                    if pair[0] == u32::MAX {
                        continue;
                    }
                    let c = Continuation {
                        score: score + f32::from_bits(pair[1]),
                        beam,
                        id: pair[0],
                    };
                    let after_previous = previous.is_none_or(|p| p.before(&c));
                    if after_previous && best.is_none_or(|b| c.before(&b)) {
                        best = Some(c);
                    }
                }
            }
            let Some(c) = best else { break };
            previous = best;
            if c.id == s.eos || last {
                if rank < width {
                    finish(state, s, image, c, base + c.beam);
                }
            } else if kept < width {
                let row = base + kept;
                parents[row] = (base + c.beam) as u32;
                next[row] = c.id;
                let at = trace_at(s.step, row);
                state[at..at + 3].copy_from_slice(&[parents[row], c.id, c.score.to_bits()]);
                best_kept = if kept == 0 {
                    c.score
                } else {
                    best_kept.max(c.score)
                };
                kept += 1;
            }
        }
        // Extending a beam only lowers its score: the image stops once its
        // n_best-th finished caption beats every beam kept.
        let f = s.finished_start() + image * s.finished_stride();
        if state[f] as usize >= s.n_best && kept > 0 {
            let kth = f32::from_bits(state[f + 1 + 4 * (s.n_best - 1)]);
            if best_kept <= kth {
                kept = 0;
            }
        }
        for row in base + kept..base + width {
            parents[row] = row as u32;
            next[row] = s.pad;
            let at = trace_at(s.step, row);
            state[at..at + 3].copy_from_slice(&[row as u32, s.pad, 0]);
        }
    }
}

/// Inserts a finished caption (`c` after the beam on `parent`) among the
/// image's best width, after every one it does not beat.
fn finish(state: &mut [u32], s: &BeamStep, image: usize, c: Continuation, parent: usize) {
    let f = s.finished_start() + image * s.finished_stride();
    let n = state[f] as usize;
    let entry = |k: usize| f + 1 + 4 * k;
    let at = (0..n)
        .find(|&k| f32::from_bits(state[entry(k)]) < c.score)
        .unwrap_or(n);
    if at >= s.width {
        return;
    }
    let end = (n + 1).min(s.width);
    for k in (at + 1..end).rev() {
        state.copy_within(entry(k - 1)..entry(k - 1) + 4, entry(k));
    }
    let e = entry(at);
    state[e..e + 4].copy_from_slice(&[c.score.to_bits(), s.step as u32, parent as u32, c.id]);
    state[f] = end as u32;
}
