//! The prefix decoder run one position at a time over a KV cache
//! ([`crate::model::kv_cache`]): the mapper and the prefix positions once
//! per batch, all at once, then one position per token.

use super::PrefixDecoder;
use super::mapper::MapperActivations;
use crate::backend::{Backend, HeadLayout};
use crate::captioner::decoder::Stepper;
use crate::model::kv_cache::{KvCache, Prefill};

pub(super) struct PrefixStepper<'m, B: Backend> {
    model: &'m PrefixDecoder<B>,
    rows: usize,
    cache: KvCache<B>,
    prefill: Prefill<B>,
    /// [0, 1, .., prefilled - 1] for every row: the prefilled prefix's
    /// position ids.
    prefix_positions: B::Ids,
    /// Prefix vectors prefilled: all of them, or all but the last where
    /// the last stands in the start's place (ClipCap's layout), with
    /// where they and the last lie in the mapper's output.
    prefilled: usize,
    held_back: Option<(HeadLayout, HeadLayout)>,
    mapper: MapperActivations<B>,
    /// positions[p] = [p; rows]: the position ids of decoder position p.
    positions: Vec<B::Ids>,
    hidden: B::Tensor,
    /// [rows, vocab]: the logits of the position just run.
    logits: B::Tensor,
}

impl<'m, B: Backend> PrefixStepper<'m, B> {
    pub(super) fn new(b: &B, model: &'m PrefixDecoder<B>, rows: usize, steps: usize) -> Self {
        let c = &model.config;
        let (w, k) = (c.decoder.width, c.prefix_len);
        let prefilled = k - usize::from(c.prefix_predicts_first);
        let of_prefix = |vectors: usize, first: usize| HeadLayout {
            batch: rows,
            seq: 1,
            heads: 1,
            head_dim: vectors * w,
            row_stride: k * w,
            col_offset: first * w,
        };
        PrefixStepper {
            model,
            rows,
            cache: model.decoder.kv_cache(b, rows, prefilled + steps),
            prefill: model.decoder.prefill(b, rows, prefilled),
            prefix_positions: b.ids(
                &(0..rows)
                    .flat_map(|_| 0..prefilled as u32)
                    .collect::<Vec<_>>(),
            ),
            prefilled,
            held_back: c
                .prefix_predicts_first
                .then(|| (of_prefix(prefilled, 0), of_prefix(1, prefilled))),
            mapper: MapperActivations::new(b, &model.mapper, c, rows, false),
            positions: (0..k + steps)
                .map(|p| b.ids(&vec![p as u32; rows]))
                .collect(),
            hidden: b.zeros(rows * w),
            logits: b.zeros(rows * c.vocab_size),
        }
    }
}

impl<B: Backend> Stepper<B> for PrefixStepper<'_, B> {
    /// The mapper on `features` (`[rows, embed_dim]`), then the prefix
    /// positions into the cache.
    fn start(&mut self, b: &B, features: &[f32]) {
        let (m, p) = (self.model, &self.model.params);
        let c = &m.config;
        m.mapper.forward(b, p, &mut self.mapper, features);
        self.cache.clear();
        let input = self.prefill.input();
        match &self.held_back {
            Some((prefilled, _)) => b.tokens_to_heads(&self.mapper.prefix, input, prefilled),
            // The prefix is [rows, prefix_len, width] already.
            None => b.axpby(1.0, &self.mapper.prefix, 0.0, input),
        }
        b.embedding(
            p.value(m.positions),
            &self.prefix_positions,
            input,
            c.decoder.width,
            true,
        );
        m.decoder
            .prefill_cached(b, p, &mut self.cache, &mut self.prefill);
    }

    fn advance(&mut self, b: &B, ids: &B::Ids) {
        let (m, p) = (self.model, &self.model.params);
        let c = &m.config;
        let width = c.decoder.width;
        match &self.held_back {
            // The start's place: the prefix's last vector, whatever `ids` say.
            Some((_, last)) if self.cache.len() == self.prefilled => {
                b.tokens_to_heads(&self.mapper.prefix, self.cache.input(), last)
            }
            _ => b.embedding(p.value(m.tokens), ids, self.cache.input(), width, false),
        }
        let position = &self.positions[self.cache.len()];
        b.embedding(
            p.value(m.positions),
            position,
            self.cache.input(),
            width,
            true,
        );
        m.decoder
            .forward_cached(b, p, &mut self.cache, &mut self.hidden);
        m.output
            .forward(b, p, c, &self.hidden, &mut self.logits, self.rows);
    }

    fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    fn reorder(&mut self, b: &B, parents: &B::Ids) {
        self.cache.reorder(b, parents);
    }
}
