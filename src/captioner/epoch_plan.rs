//! What a training run's epochs pass over, and in which order: the
//! training images (labelled or not, as the objective trains on), their
//! captions encoded once, each epoch's (image, reference) pairs in batches
//! of similar length, and the labelled batches an MLE mix beside
//! unlabelled images reads. Every order is drawn from a generator seeded
//! by the run's seed and the epoch (or the pass), so a resumed run draws
//! the same.

use super::labelled::LabelledSplit;
use super::objective::{TrainingBatch, TrainingCorpus, TrainsOn};
use super::{CaptionVocab, CaptionerConfig};
use crate::data::Split;
use crate::source::embeddings::CaptionData;
use anyhow::Result;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Batches drawn from this many batches' worth of captions at once are
/// formed among captions of similar length.
const LENGTH_POOL_BATCHES: usize = 16;

/// `items` (already shuffled) in whole batches of `batch`, each batch of
/// captions of similar length: every pool of `LENGTH_POOL_BATCHES`
/// batches is sorted by length and cut into batches, and the batches are
/// shuffled. A batch is trimmed to its longest caption, so this keeps
/// padding out of most of the compute (shapes-world captions average
/// about 13 words, but a random batch of 64 holds one of about 50). The
/// sort is stable, so it depends only on the shuffle. Items past the last
/// whole batch are left out, as before.
pub(super) fn batches_by_length<T: Clone>(
    items: Vec<T>,
    batch: usize,
    length: impl Fn(&T) -> usize,
    rng: &mut ChaCha8Rng,
) -> Vec<T> {
    let whole = items.len() / batch * batch;
    let mut batches: Vec<Vec<T>> = items[..whole]
        .chunks(batch * LENGTH_POOL_BATCHES)
        .flat_map(|pool| {
            let mut pool = pool.to_vec();
            pool.sort_by_key(&length);
            pool.chunks(batch).map(<[T]>::to_vec).collect::<Vec<_>>()
        })
        .collect();
    batches.shuffle(rng);
    batches.concat()
}

/// The images a run trains on and the batches its steps read.
pub(super) struct EpochPlan {
    /// Which training images keep their captions.
    pub(super) split: LabelledSplit,
    /// What the configured objective learns from.
    pub(super) trains_on: TrainsOn,
    /// Every training image's references (none for unlabelled ones).
    pub(super) corpus: TrainingCorpus,
    /// The images an epoch passes over: the labelled ones, or the
    /// unlabelled ones for an objective that learns from images alone.
    train_items: Vec<usize>,
    /// Item -> its position in the corpus.
    corpus_index: HashMap<usize, usize>,
    /// Each training image's captions encoded (`start ids end`), by the
    /// corpus's image index.
    encoded: Vec<Vec<Vec<u32>>>,
    /// The labelled images in one pass's order, each with its reference,
    /// and the pass: the batches an MLE mix beside unlabelled images
    /// reads, drawn by step (see `labelled_batch`).
    labelled_pass: Option<(usize, Vec<(usize, usize)>)>,
    /// This epoch's images, each with its reference (none for images
    /// without captions), batch after batch, and the batches of it done
    /// so far.
    order: Vec<(usize, Option<usize>)>,
    batches_done: usize,
    /// Target tokens per caption of this epoch's pairs, on average.
    mean_tokens: f32,
    /// Draws this epoch's order and references.
    rng: ChaCha8Rng,
    batch: usize,
    seed: u64,
}

impl EpochPlan {
    /// The plan of a run over `data`'s training split as `split` labels it,
    /// for an objective that `trains_on`, in batches of `batch`.
    pub(super) fn new(
        data: &CaptionData,
        vocab: &CaptionVocab,
        max_len: usize,
        split: LabelledSplit,
        trains_on: TrainsOn,
        batch: usize,
        seed: u64,
    ) -> Result<Self> {
        let (mut corpus, corpus_items) = TrainingCorpus::training_split(&data.data);
        debug_assert_eq!(corpus_items, data.items(Split::Train));
        let corpus_index: HashMap<usize, usize> = corpus_items
            .iter()
            .enumerate()
            .map(|(p, &i)| (i, p))
            .collect();
        for i in &split.unlabelled {
            corpus.references[corpus_index[i]].clear();
        }
        let encoded = corpus_items
            .iter()
            .map(|&i| {
                let captions = &data.data.items[i].captions;
                captions
                    .iter()
                    .map(|c| vocab.encode(&c.tokens, max_len))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EpochPlan {
            train_items: split.images_for(trains_on).to_vec(),
            split,
            trains_on,
            corpus,
            corpus_index,
            encoded,
            labelled_pass: None,
            order: Vec::new(),
            batches_done: 0,
            mean_tokens: 1.0,
            rng: ChaCha8Rng::seed_from_u64(0),
            batch,
            seed,
        })
    }

    /// Gives the corpus its images' embeddings (for an objective that
    /// compares captions with images), where it has none yet.
    pub(super) fn embed_images(&mut self, data: &CaptionData) {
        if self.corpus.image_embeddings.is_empty() {
            self.corpus.image_embeddings = data.features_of(&data.items(Split::Train));
        }
    }

    /// Target tokens per caption of this epoch's pairs, on average.
    pub(super) fn mean_tokens(&self) -> f32 {
        self.mean_tokens
    }

    /// Counts the batch just trained; whether it was the epoch's last.
    pub(super) fn batch_done(&mut self) -> bool {
        self.batches_done += 1;
        self.batches_done == self.train_items.len() / self.batch
    }

    /// The next batch starts an epoch.
    pub(super) fn next_epoch(&mut self) {
        self.batches_done = 0;
    }

    /// The next batch of (image, reference) pairs, for the step `step` of
    /// epoch `epoch` (epochs completed); at an epoch's start, draws the
    /// epoch's order.
    pub(super) fn next_batch(
        &mut self,
        data: &CaptionData,
        config: &CaptionerConfig,
        epoch: usize,
        step: usize,
    ) -> Result<TrainingBatch> {
        let batch = self.batch;
        let items = &data.data.items;
        if self.batches_done == 0 {
            self.rng =
                ChaCha8Rng::seed_from_u64(self.seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9));
            let mut images = self.train_items.clone();
            images.shuffle(&mut self.rng);
            if self.reads_references() {
                let picks: Vec<(usize, Option<usize>)> = images
                    .into_iter()
                    .map(|i| (i, Some(self.rng.random_range(0..items[i].captions.len()))))
                    .collect();
                let words = |&(i, r): &(usize, Option<usize>)| {
                    r.map_or(0, |r| items[i].captions[r].tokens.len())
                };
                self.order = batches_by_length(picks, batch, words, &mut self.rng);
                // Each caption's targets: its tokens, then the end.
                let (encoded, index) = (&self.encoded, &self.corpus_index);
                let targets = |&(i, r): &(usize, Option<usize>)| {
                    r.map_or(0, |r| encoded[index[&i]][r].len() - 1)
                };
                self.mean_tokens = self.order.iter().map(targets).sum::<usize>() as f32
                    / self.order.len().max(1) as f32;
            } else {
                self.order = images.into_iter().map(|i| (i, None)).collect();
            }
        }
        let chunk = &self.order[self.batches_done * batch..(self.batches_done + 1) * batch];
        let pairs: Vec<(usize, usize)> = chunk
            .iter()
            .filter_map(|&(i, r)| r.map(|r| (i, r)))
            .collect();
        let images: Vec<usize> = chunk.iter().map(|&(i, _)| i).collect();
        let mut assembled = self.batch_of(data, config, &images, &pairs)?;
        if !self.reads_references() {
            let labelled = self.labelled_batch(data, config, step)?;
            assembled.labelled = Some(Box::new(labelled));
        }
        Ok(assembled)
    }

    /// Whether this run's batches carry references: not when the
    /// objective learns from images alone and trains on unlabelled ones.
    fn reads_references(&self) -> bool {
        !self.split.trains_unlabelled(self.trains_on)
    }

    /// The batch of `images`, with the references of `pairs` (image,
    /// reference index): all of them or none.
    fn batch_of(
        &self,
        data: &CaptionData,
        config: &CaptionerConfig,
        images: &[usize],
        pairs: &[(usize, usize)],
    ) -> Result<TrainingBatch> {
        Ok(TrainingBatch {
            inputs: data.inputs_of(images, config.embedding_reading())?,
            // Retrieval compares the unit embeddings, whatever the decoder reads.
            embeddings: (data.reads_more_than_embeddings() || config.raw_embeddings)
                .then(|| data.features_of(images)),
            sequences: pairs
                .iter()
                .map(|&(i, r)| self.encoded[self.corpus_index[&i]][r].clone())
                .collect(),
            images: images.iter().map(|i| self.corpus_index[i]).collect(),
            labelled: None,
        })
    }

    /// Step `step`'s batch of labelled images (with one reference each)
    /// for an MLE mix beside unlabelled images: positions `step * batch
    /// ..` of an endless sequence of passes over the labelled images, each
    /// pass in its own order, seeded by the run's seed and the pass.
    fn labelled_batch(
        &mut self,
        data: &CaptionData,
        config: &CaptionerConfig,
        step: usize,
    ) -> Result<TrainingBatch> {
        let (batch, seed) = (self.batch, self.seed);
        let n = self.split.labelled.len();
        let mut pairs = Vec::with_capacity(batch);
        for position in step * batch..(step + 1) * batch {
            let pass = position / n;
            if self.labelled_pass.as_ref().is_none_or(|(p, _)| *p != pass) {
                let mut rng = ChaCha8Rng::seed_from_u64(
                    seed ^ 0x6c61_6265_6c6c_6564 ^ (pass as u64).wrapping_mul(0x9e37_79b9),
                );
                let mut images = self.split.labelled.clone();
                images.shuffle(&mut rng);
                let items = &data.data.items;
                let order = images
                    .into_iter()
                    .map(|i| (i, rng.random_range(0..items[i].captions.len())))
                    .collect();
                self.labelled_pass = Some((pass, order));
            }
            let (_, order) = self.labelled_pass.as_ref().expect("drawn above");
            pairs.push(order[position % n]);
        }
        let images: Vec<usize> = pairs.iter().map(|&(i, _)| i).collect();
        self.batch_of(data, config, &images, &pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_batches_hold_every_item_once_among_similar_lengths() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        // 1000 items of lengths 1..=50, shuffled; batches of 8.
        let mut items: Vec<usize> = (0..1000).collect();
        items.shuffle(&mut rng);
        let length = |&i: &usize| 1 + i % 50;
        let out = batches_by_length(items.clone(), 8, length, &mut rng);
        assert_eq!(out.len(), 1000 / 8 * 8);
        let mut seen = out.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), out.len(), "no item twice");
        // A pool of 128 items spreads 50 lengths: a batch of 8 spans few.
        let spread: Vec<usize> = out
            .chunks(8)
            .map(|b| b.iter().map(length).max().unwrap() - b.iter().map(length).min().unwrap())
            .collect();
        assert!(spread.iter().all(|&s| s <= 8), "{spread:?}");
        // Random batches of 8 would span about 35 lengths.
        let random_spread = items[..8].iter().map(length).max().unwrap()
            - items[..8].iter().map(length).min().unwrap();
        assert!(random_spread > 8);
        // The same shuffle and generator state give the same batches (resume relies on it).
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut items: Vec<usize> = (0..1000).collect();
        items.shuffle(&mut rng);
        assert_eq!(batches_by_length(items, 8, length, &mut rng), out);
    }
}
