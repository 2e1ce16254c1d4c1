//! Token choice and beam search: how a row's token is picked, the
//! candidates beam search keeps, one beam step.

/// Sampling settings of a [`TokenChoice`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the k most likely tokens (ties at the k-th kept); 0 keeps all.
    pub top_k: u32,
    /// Keep the most likely tokens whose mass reaches p (ties kept); 1 keeps all.
    pub top_p: f32,
}

/// An id [`Backend::embedding`](super::Backend::embedding) reads as a row of zeros.
pub const NO_ROW: u32 = u32::MAX;

/// How a [`TokenChoice`] picks a row's token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChoiceRule {
    /// The most likely allowed token (lowest id on ties).
    Greedy,
    Sample(Sampling),
    /// The allowed token with the largest logit plus Gumbel noise
    /// g(seed, row, step, token) (a sample at temperature 1 by the
    /// Gumbel-max trick), whose noise [`Backend::gumbel_logits`](super::Backend::gumbel_logits) draws
    /// again for the relaxation of the same choice.
    Gumbel,
}

/// One step of token choice over `[rows, vocab]` logits (see
/// `shaders/choose.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenChoice {
    pub rows: usize,
    pub vocab: usize,
    /// The column of `history` and `logprobs` this step writes.
    pub step: u32,
    /// Columns of `history` and `logprobs`.
    pub steps: usize,
    pub rule: ChoiceRule,
    pub seed: u64,
    /// Added to the row index in the random counter, so that the rows of
    /// successive batches draw different numbers.
    pub first_row: u32,
    /// A token never chosen (`<unk>` when suppressed), or `u32::MAX`.
    pub banned: u32,
    /// Never chosen either: a caption does not restart or pad itself.
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
}

/// Beam search's candidates: each row's `count` most likely tokens among
/// those that may be chosen (see [`Backend::top_candidates`](super::Backend::top_candidates)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidates {
    pub rows: usize,
    pub vocab: usize,
    pub count: usize,
    /// Never a candidate: a banned token (`<unk>` when suppressed, or
    /// `u32::MAX`), `<bos>` and padding.
    pub banned: u32,
    pub bos: u32,
    pub pad: u32,
}

impl Candidates {
    /// Whether token j may be a candidate.
    pub fn allowed(&self, j: u32) -> bool {
        j != self.banned && j != self.bos && j != self.pad
    }

    /// Panics unless logits are `[rows, vocab]` and the candidates `[rows,
    /// count, 2]`.
    pub fn check(&self, (logits, candidates): (usize, usize)) {
        assert!(
            logits == self.rows * self.vocab && candidates == self.rows * self.count * 2,
            "top_candidates: tensors of {logits} and {candidates} elements for {self:?}"
        );
    }
}

/// One step of beam search over `images` images of `width` rows each,
/// beam k of image i on row i * width + k (see [`Backend::beam_step`](super::Backend::beam_step)).
///
/// The search's record is one `[state_len()]` u32 tensor, zero at the
/// start: first the trace, `[steps, rows, 3]`, where (parent, token,
/// score bits) at (s, r) say that the beam on row r after step s took
/// `token` after the beam on row `parent` after step s - 1 and has total
/// log-probability `score`; a row without a beam has token `pad`. Then,
/// per image, the count of its finished captions and up to `width` of
/// them, best first, as (score bits, step, parent, token): the beam on row
/// `parent` after step - 1, followed by `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeamStep {
    pub images: usize,
    pub width: usize,
    /// Captions kept per image: an image stops once its n_best-th finished
    /// caption beats every live beam.
    pub n_best: usize,
    /// Steps of the whole search (ids a caption may have, `<eos>`
    /// included): the last one finishes every beam.
    pub steps: usize,
    /// The step this call takes.
    pub step: usize,
    pub eos: u32,
    pub pad: u32,
}

impl BeamStep {
    /// Candidates each row offers ([`Candidates::count`]): 2 x width. An
    /// image's best 2 x width continuations are among its rows' best
    /// 2 x width, since a row adds its beam's score to each of its tokens
    /// alike.
    pub fn count(&self) -> usize {
        2 * self.width
    }

    pub fn rows(&self) -> usize {
        self.images * self.width
    }

    /// Where the finished captions start in the state tensor.
    pub fn finished_start(&self) -> usize {
        self.steps * self.rows() * 3
    }

    /// u32s per image in the finished part: the count, then `width`
    /// entries of 4.
    pub fn finished_stride(&self) -> usize {
        1 + 4 * self.width
    }

    pub fn state_len(&self) -> usize {
        self.finished_start() + self.images * self.finished_stride()
    }

    /// Panics unless candidates are `[rows, count, 2]`, parents and next
    /// `[rows]`, the state `[state_len()]`, the step within the search and
    /// n_best within the width.
    pub fn check(&self, (candidates, parents, next, state): (usize, usize, usize, usize)) {
        let rows = self.rows();
        assert!(
            candidates == rows * self.count() * 2
                && parents == rows
                && next == rows
                && state == self.state_len()
                && self.step < self.steps
                && (1..=self.width).contains(&self.n_best),
            "beam_step: tensors of {candidates}, {parents}, {next} and {state} elements for {self:?}"
        );
    }
}
