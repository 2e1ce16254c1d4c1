//! What every decoder family shares: the token inputs of a batch,
//! teacher forcing's targets, the policy mask, and the workspaces kept
//! per batch shape.
//!
//! Every family's logits are its network's plus the policy mask m,
//! [`MASKED_LOGIT`] at the padding and start ids (`SpecialIds::masked`:
//! `<pad>` and `<bos>`) and 0 elsewhere: decoding never chooses them, so
//! the distribution every loss, sample and explanation reads is the one
//! captions are generated from (docs/training.md#one-policy).

use super::CaptionerConfig;
use crate::backend::{Backend, TokenIndex};
use anyhow::{Result, bail};

/// Token positions of trimmed batches are rounded up to a multiple of
/// this, so that a run keeps a few workspaces, not one per length: every
/// workspace holds its own `[rows, vocab]` logits, so all of them together
/// take at most about 2.7 times the full width's (widths 8, 16, 24 and 31
/// of 31), and a finer step buys little (about 5% of a shapes step).
const TRIM_STEP: usize = 8;

/// The logit of an id outside the policy: exp of it underflows to exactly
/// 0 in every softmax, while staying finite, so that 0 * log p is 0 in
/// an entropy and a weighted-out `<pad>` target adds 0 to a loss.
pub const MASKED_LOGIT: f32 = -1e30;

/// `[vocab]`: [`MASKED_LOGIT`] at the ids outside the policy, else 0;
/// every family adds it to its logits.
pub fn policy_mask(c: &CaptionerConfig) -> Vec<f32> {
    let mut mask = vec![0.0; c.vocab_size];
    for id in c.specials.masked() {
        mask[id as usize] = MASKED_LOGIT;
    }
    mask
}

/// The activations a decoder keeps for each batch shape it has run
/// (sequences, token positions), and which one the last forward used:
/// the weights live once, and a batch trimmed to its longest caption, a
/// training batch and the inspector's batch of one each have their own.
pub struct Workspaces<W> {
    shapes: Vec<((usize, usize), W)>,
    current: usize,
}

impl<W> Default for Workspaces<W> {
    fn default() -> Self {
        Workspaces {
            shapes: Vec::new(),
            current: 0,
        }
    }
}

impl<W> Workspaces<W> {
    /// Makes the workspace of `inputs`' shape the current one; false when
    /// there is none yet ([`Workspaces::add`] one).
    pub fn select<B: Backend>(&mut self, inputs: &TokenInputs<B>) -> bool {
        let shape = (inputs.batch, inputs.positions);
        match self.shapes.iter().position(|(s, _)| *s == shape) {
            Some(i) => {
                self.current = i;
                true
            }
            None => false,
        }
    }

    /// Adds the workspace of `inputs`' shape, as the current one.
    pub fn add<B: Backend>(&mut self, inputs: &TokenInputs<B>, workspace: W) {
        self.shapes
            .push(((inputs.batch, inputs.positions), workspace));
        self.current = self.shapes.len() - 1;
    }

    pub fn current(&self) -> &W {
        &self.shapes[self.current].1
    }

    /// The current workspace, which must be `inputs`' shape (a backward
    /// follows the forward of the same inputs).
    pub fn current_for<B: Backend>(&mut self, inputs: &TokenInputs<B>) -> &mut W {
        let (shape, workspace) = &mut self.shapes[self.current];
        assert_eq!(
            *shape,
            (inputs.batch, inputs.positions),
            "backward follows the forward of the same inputs"
        );
        workspace
    }
}

/// Decoder inputs for one batch: `[batch, positions]` ids, each row
/// `<bos> w1 .. wn` then padding.
pub struct TokenInputs<B: Backend> {
    pub ids: TokenIndex<B>,
    /// `ids` as the host holds them, `[batch, positions]`.
    pub host_ids: Vec<u32>,
    pub batch: usize,
    /// Token positions per row: the model's maximum, or fewer when trimmed.
    pub positions: usize,
}

impl<B: Backend> TokenInputs<B> {
    /// From encoded captions (`<bos> .. <eos>`, as `CaptionVocab::encode`
    /// gives), or from partial captions, over all the model's token positions.
    pub fn new(b: &B, config: &CaptionerConfig, sequences: &[Vec<u32>]) -> Result<Self> {
        Self::with_positions(b, config, sequences, config.token_positions())
    }

    /// The same, over only as many positions as the longest sequence
    /// needs (rounded up to a multiple of 8): the positions after every
    /// caption's end would be padding, and the causal mask keeps padding
    /// out of every real position, so the loss is the same.
    pub fn trimmed(b: &B, config: &CaptionerConfig, sequences: &[Vec<u32>]) -> Result<Self> {
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(1);
        // A caption of n ids (<bos> .. <eos>) feeds n - 1 positions.
        let needed = longest.saturating_sub(1).max(1);
        let positions = needed
            .next_multiple_of(TRIM_STEP)
            .min(config.token_positions());
        Self::with_positions(b, config, sequences, positions)
    }

    fn with_positions(
        b: &B,
        config: &CaptionerConfig,
        sequences: &[Vec<u32>],
        positions: usize,
    ) -> Result<Self> {
        let t = positions;
        // A sequence of t + 1 ids feeds t positions: its last id (a
        // caption's end) is only a target. A longer one would lose ids.
        if let Some(s) = sequences.iter().find(|s| s.len() > t + 1) {
            bail!(
                "a sequence of {} ids does not fit the {t} token positions fed (and its end)",
                s.len()
            );
        }
        let mut ids = vec![config.specials.pad; sequences.len() * t];
        for (i, s) in sequences.iter().enumerate() {
            let n = s.len().min(t);
            ids[i * t..i * t + n].copy_from_slice(&s[..n]);
        }
        Ok(TokenInputs {
            ids: TokenIndex::new(b, &ids, config.vocab_size)?,
            host_ids: ids,
            batch: sequences.len(),
            positions,
        })
    }

    /// Rows of the logits: one per token position of every sequence.
    pub fn rows(&self) -> usize {
        self.batch * self.positions
    }
}

/// Teacher-forcing targets `[batch, steps]`: each sequence's ids after
/// `<bos>`, then `pad` (the config's padding id: no target).
pub fn teacher_targets(sequences: &[Vec<u32>], steps: usize, pad: u32) -> Vec<u32> {
    let mut t = vec![pad; sequences.len() * steps];
    for (i, s) in sequences.iter().enumerate() {
        let n = (s.len() - 1).min(steps);
        t[i * steps..i * steps + n].copy_from_slice(&s[1..1 + n]);
    }
    t
}
