//! Caption generation: greedy, sampling (temperature, top-k, top-p) and
//! beam search, from the model's policy (its distribution, which gives
//! `<pad>` and `<bos>` no mass; `<unk>` none either when suppressed),
//! with the current weights.
//!
//! The decoder runs one position at a time through its stepper
//! ([`super::decoder::Stepper`]): what reads the image once per batch,
//! then one position per token. Greedy and sampled tokens are chosen on the device
//! (`Backend::choose_tokens`, the same ids on both backends for the same
//! seed); whether every caption has ended is read every
//! [`END_CHECK_STEPS`] steps without waiting (the answer arrives while
//! later steps are recorded), and the host waits only for the chosen ids
//! and their log-probabilities at the end. Beam search runs on the device
//! too: each row's 2 x width best candidates (`Backend::top_candidates`),
//! the choice of beams among them (`Backend::beam_step`), and the cache
//! rows following their parents; the same end checks apply, and the host
//! reads the search's record once, at the end, to spell the captions.

use super::CaptionVocab;
use super::SpecialIds;
use super::decoder::Stepper;
use super::model::Captioner;
use crate::backend::{Backend, BeamStep, Candidates, ChoiceRule, Sampling, TokenChoice};
use crate::data::vocab::UNK;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// How captions are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "kebab-case")]
pub enum Decoding {
    Greedy,
    /// Beam search of `width`, keeping the `n_best` best finished captions.
    Beam {
        width: usize,
        n_best: usize,
    },
    /// `n` samples per image at `temperature`, from the `top_k` most likely
    /// tokens (0 = all) within the smallest set of probability `top_p`.
    Sample {
        n: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
    },
    /// `n` samples per image at temperature 1 by the Gumbel-max trick,
    /// with noise `Backend::gumbel_logits` draws again (row = the
    /// sample's index among all images' samples, step = its position):
    /// what a straight-through Gumbel-softmax objective relaxes.
    Gumbel {
        n: usize,
        seed: u64,
    },
}

impl Decoding {
    /// `greedy`, `beam:W`, `beam:W:N`, `sample:N`, or
    /// `sample:N:key=value,...` with keys t (temperature), k, p, seed.
    pub fn parse(text: &str) -> Result<Decoding> {
        let parts: Vec<&str> = text.split(':').collect();
        let number = |s: &str, what: &str| -> Result<usize> {
            match s.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => bail!("--decode {text:?}: {what} must be a positive whole number, not {s:?}"),
            }
        };
        match parts.as_slice() {
            ["greedy"] => Ok(Decoding::Greedy),
            ["beam", w] => Ok(Decoding::Beam {
                width: number(w, "the beam width")?,
                n_best: 1,
            }),
            ["beam", w, n] => {
                let (width, n_best) = (number(w, "the beam width")?, number(n, "n best")?);
                if n_best > width {
                    bail!(
                        "--decode {text:?}: n best ({n_best}) cannot exceed the beam width ({width})"
                    );
                }
                Ok(Decoding::Beam { width, n_best })
            }
            ["sample", n, rest @ ..] if rest.len() <= 1 => {
                let mut d = Decoding::Sample {
                    n: number(n, "the number of samples")?,
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    seed: 0,
                };
                if let (
                    Some(options),
                    Decoding::Sample {
                        temperature,
                        top_k,
                        top_p,
                        seed,
                        ..
                    },
                ) = (rest.first(), &mut d)
                {
                    for option in options.split(',') {
                        let (key, value) = option.split_once('=').unwrap_or((option, ""));
                        let bad = || {
                            anyhow::anyhow!(
                                "--decode {text:?}: {option:?} is not t=, k=, p= or seed= with a number"
                            )
                        };
                        match key {
                            "t" => *temperature = value.parse().map_err(|_| bad())?,
                            "k" => *top_k = value.parse().map_err(|_| bad())?,
                            "p" => *top_p = value.parse().map_err(|_| bad())?,
                            "seed" => *seed = value.parse().map_err(|_| bad())?,
                            _ => return Err(bad()),
                        }
                    }
                    let valid = *temperature > 0.0
                        && temperature.is_finite()
                        && *top_p > 0.0
                        && *top_p <= 1.0;
                    if !valid {
                        bail!(
                            "--decode {text:?}: the temperature must be positive and p in (0, 1]"
                        );
                    }
                }
                Ok(d)
            }
            _ => bail!(
                "--decode {text:?}: expected greedy, beam:W, beam:W:N, sample:N or sample:N:t=0.7,k=40,p=0.9,seed=1"
            ),
        }
    }

    /// Sequences decoded at once per image: the beam's width, the number
    /// of samples, or 1.
    pub fn rows_per_image(&self) -> usize {
        match *self {
            Decoding::Greedy => 1,
            Decoding::Beam { width, .. } => width,
            Decoding::Sample { n, .. } | Decoding::Gumbel { n, .. } => n,
        }
    }

    /// Captions produced per image.
    pub fn per_image(&self) -> usize {
        match *self {
            Decoding::Greedy => 1,
            Decoding::Beam { n_best, .. } => n_best,
            Decoding::Sample { n, .. } | Decoding::Gumbel { n, .. } => n,
        }
    }
}

/// Limits on what `generate` may emit, and where it reports progress.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Stop captions after this many words (default: the model's maximum).
    pub max_words: Option<usize>,
    /// Never emit `<unk>`: decoding chooses among the other ids.
    pub suppress_unk: bool,
    /// Advanced by one for each image captioned.
    pub progress: Option<indicatif::ProgressBar>,
    /// The first image's index among all that a caller decodes in parts:
    /// the rows' random draws go on where the parts before left off, so
    /// the captions are those of one call.
    pub first_image: usize,
}

/// One generated caption.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// Index of the image in the features given to `generate`.
    pub image: usize,
    /// Chosen ids after <bos>, ending with <eos> unless cut at the maximum
    /// length or at `DecodeOptions::max_words` words.
    pub ids: Vec<u32>,
    /// Sum of the log-probabilities of the chosen ids under the policy
    /// that chose them (`<pad>`, `<bos>` and a suppressed `<unk>` have
    /// none of its mass; temperature 1, before top-k and top-p).
    pub logprob: f32,
}

impl Generated {
    pub fn text(&self, vocab: &CaptionVocab) -> String {
        vocab.decode(&self.ids)
    }

    /// Its words, as metrics and rewards read them.
    pub fn words(&self, vocab: &CaptionVocab) -> Vec<String> {
        vocab.decode_words(&self.ids)
    }
}

/// Steps between two reads of whether every caption has ended. A read is
/// begun without waiting and taken at a later step, once the device has
/// it, while the steps after it are recorded; greedy and sampled decoding
/// read back (and wait) only twice per batch: the ids and their
/// log-probabilities.
pub const END_CHECK_STEPS: usize = 4;

/// Images decoded at once (each with `Decoding::rows_per_image` rows).
pub const IMAGES_PER_BATCH: usize = 64;

/// A batch's decoding: the model's stepper, and the device-side record
/// of the tokens chosen for its `rows` sequences.
struct Decoder<'m, B: Backend> {
    stepper: Box<dyn Stepper<B> + 'm>,
    rows: usize,
    /// Token steps of one batch at most (columns of history and logprobs).
    steps: usize,
    vocab: usize,
    specials: SpecialIds,
    bos: B::Ids,
    next: B::Ids,
    history: B::Ids,
    logprobs: B::Tensor,
}

impl<'m, B: Backend> Decoder<'m, B> {
    fn new(b: &B, model: &'m Captioner<B>, rows: usize, steps: usize) -> Self {
        let c = &model.config;
        Decoder {
            stepper: model.stepper(b, rows, steps),
            rows,
            steps,
            vocab: c.vocab_size,
            specials: c.specials,
            bos: b.ids(&vec![c.specials.start; rows]),
            next: b.ids(&vec![c.specials.pad; rows]),
            history: b.ids(&vec![c.specials.pad; rows * steps]),
            logprobs: b.zeros(rows * steps),
        }
    }

    /// Runs token position `step`: the start at 0, else the tokens the
    /// device chose at the step before; the stepper's logits become the
    /// next token's.
    fn advance(&mut self, b: &B, step: usize) {
        let ids = if step > 0 { &self.next } else { &self.bos };
        self.stepper.advance(b, ids);
    }
}

/// Captions for every image of `features` (`[n, image input]`: an
/// embedding, or a cross-attending decoder's image tokens), in image
/// order, `decoding.per_image()` each, within `options`' limits (and the
/// model's maximum length), with the model's current weights.
pub fn generate<B: Backend>(
    b: &B,
    model: &Captioner<B>,
    features: &[f32],
    decoding: &Decoding,
    options: &DecodeOptions,
) -> Result<Vec<Generated>> {
    let c = model.config;
    if options.suppress_unk && c.specials != SpecialIds::WORDS {
        bail!(
            "--suppress-unk: this captioner's vocabulary has no <unk> (its special ids are \
             {:?}; a byte-level BPE such as GPT-2's spells every word); decode without it",
            c.specials
        );
    }
    // Steps: the words, then <eos>. A caption that has not ended after
    // them is cut to `words` (its ranking among beams and samples is that
    // of its whole run, as transformers' `generate` ranks a run of
    // max_new_tokens = words + 1).
    let positions = c.token_positions();
    let words = options.max_words.unwrap_or(positions);
    let steps = words.saturating_add(1).min(positions);
    let d = c.image_input_len();
    if !features.len().is_multiple_of(d) {
        bail!(
            "{} feature values are not whole image inputs of {d}",
            features.len()
        );
    }
    let images = features.len() / d;
    let per_row = decoding.rows_per_image();
    let images_per_batch = IMAGES_PER_BATCH.min(images.max(1));
    let rows = images_per_batch * per_row;
    let mut decoder = Decoder::new(b, model, rows, steps);
    let banned = if options.suppress_unk { UNK } else { u32::MAX };
    let mut out = Vec::with_capacity(images * decoding.per_image());
    for first in (0..images).step_by(images_per_batch) {
        let chunk: Vec<usize> = (first..(first + images_per_batch).min(images)).collect();
        // Every row gets an image; rows past the chunk repeat its last
        // image and are ignored.
        let rows_features: Vec<f32> = (0..rows)
            .map(|r| chunk[(r / per_row).min(chunk.len() - 1)])
            .flat_map(|i| features[i * d..(i + 1) * d].iter().copied())
            .collect();
        decoder.stepper.start(b, &rows_features);
        let generated = match *decoding {
            Decoding::Greedy => {
                choose_on_device(b, &mut decoder, ChoiceRule::Greedy, 0, 0, banned, words)
            }
            Decoding::Gumbel { seed, .. } => {
                let first_row = ((options.first_image + first) * per_row) as u32;
                let rule = ChoiceRule::Gumbel;
                choose_on_device(b, &mut decoder, rule, seed, first_row, banned, words)
            }
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                seed,
                ..
            } => {
                let sampling = Sampling {
                    temperature,
                    top_k: top_k.min(u32::MAX as usize) as u32,
                    top_p,
                };
                let first_row = ((options.first_image + first) * per_row) as u32;
                let rule = ChoiceRule::Sample(sampling);
                choose_on_device(b, &mut decoder, rule, seed, first_row, banned, words)
            }
            Decoding::Beam { width, n_best } => {
                let shape = BeamShape {
                    images: chunk.len(),
                    width,
                    n_best,
                    steps,
                    vocab: c.vocab_size,
                    suppress_unk: options.suppress_unk,
                    specials: c.specials,
                };
                beam_rows(b, &mut decoder, &shape, words)
            }
        };
        if let Some(bar) = &options.progress {
            bar.inc(chunk.len() as u64);
        }
        let keep = chunk.len() * decoding.per_image();
        for (k, (ids, logprob)) in generated.into_iter().take(keep).enumerate() {
            out.push(Generated {
                image: chunk[k / decoding.per_image()],
                ids,
                logprob,
            });
        }
    }
    Ok(out)
}

/// Whether every row has ended (its next token is `<eos>` or padding),
/// asked every [`END_CHECK_STEPS`] steps without waiting: the answer
/// arrives while later steps are recorded.
struct EndCheck<B: Backend> {
    /// The check under way: the next tokens at some step.
    pending: Option<B::PendingIds>,
}

impl<B: Backend> EndCheck<B> {
    fn new() -> Self {
        EndCheck { pending: None }
    }

    /// After step `step` of `steps` wrote `next`: whether a check that
    /// arrived shows every row ended (then the steps since add nothing).
    fn all_ended(
        &mut self,
        b: &B,
        (step, steps): (usize, usize),
        next: &B::Ids,
        specials: SpecialIds,
    ) -> bool {
        if (step + 1).is_multiple_of(END_CHECK_STEPS) && step + 1 < steps {
            match self.pending {
                None => self.pending = Some(b.begin_ids_read(next)),
                // The device works on these steps while later ones are
                // recorded.
                Some(_) => b.submit(),
            }
        }
        let Some(chosen) = self.pending.as_mut().and_then(|c| b.poll_ids_read(c)) else {
            return false;
        };
        self.pending = None;
        let pad = specials.masked()[0];
        chosen.iter().all(|&t| t == specials.end || t == pad)
    }
}

/// Greedy or sampled continuation of every row at once, chosen on the
/// device; (ids after <bos>, their total log-probability) per row, a
/// caption that did not end cut to `words`.
#[allow(clippy::too_many_arguments)]
fn choose_on_device<B: Backend>(
    b: &B,
    decoder: &mut Decoder<'_, B>,
    rule: ChoiceRule,
    seed: u64,
    first_row: u32,
    banned: u32,
    words: usize,
) -> Vec<(Vec<u32>, f32)> {
    let (rows, steps) = (decoder.rows, decoder.steps);
    let specials = decoder.specials;
    let [pad, masked_start] = specials.masked();
    let mut ran = steps;
    let mut check = EndCheck::new();
    for step in 0..steps {
        decoder.advance(b, step);
        let choice = TokenChoice {
            rows,
            vocab: decoder.vocab,
            step: step as u32,
            steps,
            rule,
            seed,
            first_row,
            banned,
            bos: masked_start,
            eos: specials.end,
            pad,
        };
        b.choose_tokens(
            decoder.stepper.logits(),
            &choice,
            &mut decoder.next,
            &mut decoder.history,
            &mut decoder.logprobs,
        );
        if check.all_ended(b, (step, steps), &decoder.next, specials) {
            ran = step + 1;
            break;
        }
    }
    let history = b.ids_to_vec(&decoder.history);
    let logprobs = b.to_vec(&decoder.logprobs);
    (0..rows)
        .map(|r| {
            let row = &history[r * steps..r * steps + ran];
            let n = row
                .iter()
                .position(|&t| t == specials.end)
                .map_or(ran.min(words), |end| end + 1);
            let logprob = logprobs[r * steps..r * steps + n].iter().sum();
            (row[..n].to_vec(), logprob)
        })
        .collect()
}

/// Beam search over the decoder's KV cache, wholly on the device: each
/// step ranks every row's best candidates (`Backend::top_candidates`),
/// chooses the beams (`Backend::beam_step`), and the next step's cache rows
/// follow their parents. The host reads the search's record once, at the
/// end.
fn beam_rows<B: Backend>(
    b: &B,
    decoder: &mut Decoder<'_, B>,
    shape: &BeamShape,
    words: usize,
) -> Vec<(Vec<u32>, f32)> {
    let c = shape.candidates();
    let mut candidates = b.ids(&vec![0; c.rows * c.count * 2]);
    let mut parents = b.ids(&vec![0; c.rows]);
    let mut state = b.ids(&vec![0; shape.at(0).state_len()]);
    let mut check = EndCheck::new();
    for step in 0..shape.steps {
        if step > 0 {
            decoder.stepper.reorder(b, &parents);
        }
        decoder.advance(b, step);
        b.top_candidates(decoder.stepper.logits(), &c, &mut candidates);
        let at = shape.at(step);
        b.beam_step(
            &candidates,
            &at,
            &mut parents,
            &mut decoder.next,
            &mut state,
        );
        if check.all_ended(b, (step, shape.steps), &decoder.next, shape.specials) {
            break;
        }
    }
    shape.captions(&b.ids_to_vec(&state), words)
}

/// What a beam search covers: `images` images of `width` rows each, beam
/// k of image i on row i * width + k. The search is the canonical one, as
/// transformers runs it with `length_penalty = 0` (no length
/// normalisation) and `early_stopping = "never"`: each step ranks every
/// beam's continuations, those among the best `width` that end finish, the
/// best `width` that do not go on, and an image stops when no live beam can
/// beat its `n_best` finished captions. Captions are ranked by total
/// log-probability under the policy: `<pad>`, `<bos>` and, when
/// suppressed, `<unk>` are never chosen and have none of its mass.
#[derive(Clone, Copy, Debug)]
pub struct BeamShape {
    pub images: usize,
    pub width: usize,
    /// Captions kept per image, best first.
    pub n_best: usize,
    /// Ids a caption may have, `<eos>` included.
    pub steps: usize,
    pub vocab: usize,
    pub suppress_unk: bool,
    pub specials: SpecialIds,
}

impl BeamShape {
    /// What each step ranks: every row's [`BeamStep::count`] best tokens.
    pub fn candidates(&self) -> Candidates {
        let [pad, start] = self.specials.masked();
        Candidates {
            rows: self.images * self.width,
            vocab: self.vocab,
            count: self.at(0).count(),
            banned: if self.suppress_unk { UNK } else { u32::MAX },
            bos: start,
            pad,
        }
    }

    /// Step `step` of the search.
    pub fn at(&self, step: usize) -> BeamStep {
        BeamStep {
            images: self.images,
            width: self.width,
            n_best: self.n_best,
            steps: self.steps,
            step,
            eos: self.specials.end,
            pad: self.specials.masked()[0],
        }
    }

    /// The `n_best` captions of each image (ids after `<bos>`, total
    /// log-probability), best first, from the search's record (the state
    /// of [`Backend::beam_step`]); an image with fewer finished gets
    /// `<eos>` alone at minus infinity for the rest.
    ///
    /// A caption that did not end is cut to `words`, with its beam's
    /// log-probability at that word, keeping its rank in the search (so a
    /// cut caption may be less likely than one after it); a beam's
    /// continuations cut to the same words are one caption, the first.
    pub fn captions(&self, state: &[u32], words: usize) -> Vec<(Vec<u32>, f32)> {
        let s = self.at(0);
        let trace = |step: usize, row: usize| &state[(step * s.rows() + row) * 3..][..3];
        let mut out = Vec::with_capacity(self.images * self.n_best);
        for image in 0..self.images {
            let f = s.finished_start() + image * s.finished_stride();
            let count = state[f] as usize;
            let first = out.len();
            for k in 0..count.min(self.n_best) {
                let [score, step, parent, token] = state[f + 1 + 4 * k..][..4] else {
                    unreachable!("four u32s")
                };
                // Walk the trace back from the beam the caption ended,
                // each id with the beam's score after it.
                let mut ids = vec![(token, f32::from_bits(score))];
                let mut row = parent as usize;
                for back in (0..step as usize).rev() {
                    let [from, token, score] = trace(back, row) else {
                        unreachable!("three u32s")
                    };
                    ids.push((*token, f32::from_bits(*score)));
                    row = *from as usize;
                }
                ids.reverse();
                if ids.len() > words && ids[words].0 != self.specials.end {
                    ids.truncate(words);
                }
                let score = ids.last().map_or(0.0, |&(_, score)| score);
                let ids: Vec<u32> = ids.into_iter().map(|(id, _)| id).collect();
                if !out[first..].iter().any(|(kept, _)| *kept == ids) {
                    out.push((ids, score));
                }
            }
            let missing = first + self.n_best - out.len();
            out.extend((0..missing).map(|_| (vec![self.specials.end], f32::NEG_INFINITY)));
        }
        out
    }
}
