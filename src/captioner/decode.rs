//! Caption generation: greedy, sampling (temperature, top-k, top-p) and
//! beam search, from the model's policy (its distribution, which gives
//! `<pad>` and `<bos>` no mass; `<unk>` none either when suppressed),
//! with the current weights.
//!
//! The decoder runs one position at a time over a KV cache
//! ([`crate::model::kv_cache`]): the prefix and <bos> once, then one
//! position per word. Greedy and sampled tokens are chosen on the device
//! (`Backend::choose_tokens`, the same ids on both backends for the same
//! seed); whether every caption has ended is read every
//! [`END_CHECK_STEPS`] steps without waiting (the answer arrives while
//! later steps are recorded), and the host waits only for the chosen ids
//! and their log-probabilities at the end. Beam search reads back each
//! row's 2 x width best candidates (`Backend::top_candidates`, not the
//! row's logits) and chooses among them on the host; the cache follows
//! each beam's parent on the device.

use super::CaptionVocab;
use super::SpecialIds;
use super::mapper::MapperActivations;
use super::model::Captioner;
use crate::backend::{Backend, Candidates, ChoiceRule, Sampling, TokenChoice};
use crate::data::vocab::UNK;
use crate::model::kv_cache::{KvCache, Prefill};
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
}

/// One generated caption.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// Index of the image in the features given to `generate`.
    pub image: usize,
    /// Chosen ids after <bos>, ending with <eos> unless cut at the maximum length.
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

/// What feeds a token position.
enum Feed<'a, B: Backend> {
    Bos,
    /// The tokens the device chose at the previous step.
    Chosen,
    Given(&'a B::Ids),
}

/// The captioner run incrementally on `rows` sequences: the mapper's
/// buffers, the KV cache, and the device-side record of chosen tokens.
struct Decoder<'m, B: Backend> {
    model: &'m Captioner<B>,
    rows: usize,
    /// Token steps of one batch at most (columns of history and logprobs).
    steps: usize,
    cache: KvCache<B>,
    prefill: Prefill<B>,
    /// [0, 1, .., prefix_len - 1] for every row: the prefix's position ids.
    prefix_positions: B::Ids,
    mapper: MapperActivations<B>,
    /// positions[p] = [p; rows]: the position ids of decoder position p.
    positions: Vec<B::Ids>,
    bos: B::Ids,
    next: B::Ids,
    history: B::Ids,
    logprobs: B::Tensor,
    hidden: B::Tensor,
    /// [rows, vocab]: the logits of the position just run.
    logits: B::Tensor,
}

impl<'m, B: Backend> Decoder<'m, B> {
    fn new(b: &B, model: &'m Captioner<B>, rows: usize, steps: usize) -> Self {
        let c = &model.config;
        let (w, k) = (c.decoder.width, c.prefix_len);
        Decoder {
            model,
            rows,
            steps,
            cache: model.decoder.kv_cache(b, rows, k + steps),
            prefill: model.decoder.prefill(b, rows, k),
            prefix_positions: b.ids(&(0..rows).flat_map(|_| 0..k as u32).collect::<Vec<_>>()),
            mapper: MapperActivations::new(b, model.mapper(), c, rows, false),
            positions: (0..k + steps)
                .map(|p| b.ids(&vec![p as u32; rows]))
                .collect(),
            bos: b.ids(&vec![c.specials.start; rows]),
            next: b.ids(&vec![c.specials.pad; rows]),
            history: b.ids(&vec![c.specials.pad; rows * steps]),
            logprobs: b.zeros(rows * steps),
            hidden: b.zeros(rows * w),
            logits: b.zeros(rows * c.vocab_size),
        }
    }

    /// Starts a batch: the mapper on `features` (`[rows, embed_dim]`),
    /// then the prefix positions into the cache, all at once.
    fn start(&mut self, b: &B, features: &[f32]) {
        let (m, p) = (self.model, &self.model.params);
        let c = &m.config;
        m.mapper().forward(b, p, &mut self.mapper, features);
        self.cache.clear();
        // The prefix is [rows, prefix_len, width] already.
        let input = self.prefill.input();
        b.axpby(1.0, &self.mapper.prefix, 0.0, input);
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

    /// Adds the next position's embedding to the cache's input.
    fn add_position(&mut self, b: &B) {
        let m = self.model;
        let position = &self.positions[self.cache.len()];
        b.embedding(
            m.params.value(m.positions),
            position,
            self.cache.input(),
            m.config.decoder.width,
            true,
        );
    }

    /// Runs the next token position on `feed`; `logits` become its
    /// next-token logits.
    fn advance(&mut self, b: &B, feed: Feed<'_, B>) {
        let (m, p) = (self.model, &self.model.params);
        let c = &m.config;
        let ids = match feed {
            Feed::Bos => &self.bos,
            Feed::Chosen => &self.next,
            Feed::Given(ids) => ids,
        };
        b.embedding(
            p.value(m.tokens),
            ids,
            self.cache.input(),
            c.decoder.width,
            false,
        );
        self.add_position(b);
        m.decoder
            .forward_cached(b, p, &mut self.cache, &mut self.hidden);
        m.output
            .forward(b, p, c, &self.hidden, &mut self.logits, self.rows);
    }
}

/// Captions for every image of `features` (`[n, embed_dim]`), in image
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
    // Steps: the words, then <eos>.
    let steps = options
        .max_words
        .map_or(c.token_positions(), |w| (w + 1).min(c.token_positions()));
    let d = c.embed_dim;
    if !features.len().is_multiple_of(d) {
        bail!(
            "{} feature values are not whole image embeddings of {d}",
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
        decoder.start(b, &rows_features);
        let generated = match *decoding {
            Decoding::Greedy => choose_on_device(b, &mut decoder, ChoiceRule::Greedy, 0, 0, banned),
            Decoding::Gumbel { seed, .. } => {
                let first_row = (first * per_row) as u32;
                let rule = ChoiceRule::Gumbel;
                choose_on_device(b, &mut decoder, rule, seed, first_row, banned)
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
                let first_row = (first * per_row) as u32;
                let rule = ChoiceRule::Sample(sampling);
                choose_on_device(b, &mut decoder, rule, seed, first_row, banned)
            }
            Decoding::Beam { width, n_best } => beam_rows(
                b,
                &mut decoder,
                width,
                n_best,
                chunk.len(),
                options.suppress_unk,
            ),
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

/// Greedy or sampled continuation of every row at once, chosen on the
/// device; (ids after <bos>, their total log-probability) per row.
fn choose_on_device<B: Backend>(
    b: &B,
    decoder: &mut Decoder<'_, B>,
    rule: ChoiceRule,
    seed: u64,
    first_row: u32,
    banned: u32,
) -> Vec<(Vec<u32>, f32)> {
    let (rows, steps) = (decoder.rows, decoder.steps);
    let specials = decoder.model.config.specials;
    let [pad, masked_start] = specials.masked();
    let mut ran = steps;
    // The end check under way: the chosen tokens at some step, arriving
    // while later steps are recorded.
    let mut check = None;
    for step in 0..steps {
        let feed = if step == 0 { Feed::Bos } else { Feed::Chosen };
        decoder.advance(b, feed);
        let choice = TokenChoice {
            rows,
            vocab: decoder.model.config.vocab_size,
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
            &decoder.logits,
            &choice,
            &mut decoder.next,
            &mut decoder.history,
            &mut decoder.logprobs,
        );
        if (step + 1).is_multiple_of(END_CHECK_STEPS) && step + 1 < steps {
            match check {
                None => check = Some(b.begin_ids_read(&decoder.next)),
                // The device works on these steps while later ones are
                // recorded.
                Some(_) => b.submit(),
            }
        }
        if let Some(chosen) = check.as_mut().and_then(|c| b.poll_ids_read(c)) {
            check = None;
            // Every caption had ended by then: the steps since add nothing.
            if chosen.iter().all(|&t| t == specials.end || t == pad) {
                ran = step + 1;
                break;
            }
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
                .map_or(ran, |end| end + 1);
            let logprob = logprobs[r * steps..r * steps + n].iter().sum();
            (row[..n].to_vec(), logprob)
        })
        .collect()
}

/// Beam search over the decoder's KV cache: each step feeds every beam's
/// last id, after the cache rows followed their parents, and reads back
/// each row's candidates.
fn beam_rows<B: Backend>(
    b: &B,
    decoder: &mut Decoder<'_, B>,
    width: usize,
    n_best: usize,
    images: usize,
    suppress_unk: bool,
) -> Vec<(Vec<u32>, f32)> {
    let shape = BeamShape {
        images,
        width,
        n_best,
        steps: decoder.steps,
        vocab: decoder.model.config.vocab_size,
        suppress_unk,
        specials: decoder.model.config.specials,
    };
    let c = shape.candidates();
    let mut candidates = b.ids(&vec![0; c.rows * c.count * 2]);
    beam_search(&shape, |moved| {
        match moved {
            None => decoder.advance(b, Feed::Bos),
            Some((parents, next)) => {
                decoder.cache.reorder(b, &b.ids(parents));
                decoder.advance(b, Feed::Given(&b.ids(next)));
            }
        }
        b.top_candidates(&decoder.logits, &c, &mut candidates);
        b.ids_to_vec(&candidates)
    })
}

/// What a beam search covers: `images` images of `width` rows each.
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
    /// What each step ranks: every row's 2 x width best tokens. The best
    /// 2 x width continuations of an image are among them, since a row
    /// adds its beam's score to each of its tokens alike.
    pub fn candidates(&self) -> Candidates {
        let [pad, start] = self.specials.masked();
        Candidates {
            rows: self.images * self.width,
            vocab: self.vocab,
            count: 2 * self.width,
            banned: if self.suppress_unk { UNK } else { u32::MAX },
            bos: start,
            pad,
        }
    }
}

/// Beam search on the host over any source of next-token candidates:
/// `step_candidates(moved)` returns the pairs of
/// [`Backend::top_candidates`] for [`BeamShape::candidates`] after row r
/// took over row `parents[r]`'s history and was fed `next[r]` (`moved` =
/// `(parents, next)`; `None` at the first step, when every row is fed
/// `<bos>`). Beam k of image i runs on row i * width + k. Returns `n_best`
/// captions per image (ids after `<bos>`), best first, ranked by total
/// log-probability under the policy: `<pad>`, `<bos>` and, when
/// suppressed, `<unk>` are never chosen and have none of its mass. The
/// search is the canonical one, as transformers runs it with
/// `length_penalty = 0` (no length normalisation) and
/// `early_stopping = "never"`: each step ranks every beam's continuations,
/// those among the best `width` that end finish, the best `width` that do
/// not go on, and an image stops when no live beam can beat its `n_best`
/// finished captions.
pub fn beam_search(
    shape: &BeamShape,
    mut step_candidates: impl FnMut(Option<(&[u32], &[u32])>) -> Vec<u32>,
) -> Vec<(Vec<u32>, f32)> {
    let BeamShape {
        images,
        width,
        n_best,
        steps,
        specials,
        ..
    } = *shape;
    let count = shape.candidates().count;
    let rows = images * width;
    // Live beams per image: (ids from <bos>, score). At the start one beam per image.
    let mut live: Vec<Vec<(Vec<u32>, f32)>> = vec![vec![(vec![specials.start], 0.0)]; images];
    let mut finished: Vec<Vec<(Vec<u32>, f32)>> = vec![Vec::new(); images];
    let mut moved: Option<(Vec<u32>, Vec<u32>)> = None;
    for step in 0..steps {
        if live.iter().all(Vec::is_empty) {
            break;
        }
        let pairs = step_candidates(moved.as_ref().map(|(p, n)| (p.as_slice(), n.as_slice())));
        let last_step = step + 1 == steps;
        let mut parents: Vec<u32> = (0..rows as u32).collect();
        let mut next_ids = vec![specials.pad; rows];
        for i in 0..images {
            let mut candidates: Vec<(f32, usize, usize)> = Vec::new();
            for (k, (_, score)) in live[i].iter().enumerate() {
                let row = (i * width + k) * count;
                for pair in pairs[2 * row..2 * (row + count)].chunks(2) {
                    if pair[0] != u32::MAX {
                        candidates.push((score + f32::from_bits(pair[1]), k, pair[0] as usize));
                    }
                }
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
            // The best 2 x width candidates: those of them among the best
            // width that end (at the end id, or at the last step) finish,
            // and the best width of the others go on; the finished keep
            // their best width.
            let mut next = Vec::new();
            for (rank, (score, k, id)) in candidates.into_iter().take(2 * width).enumerate() {
                if score == f32::NEG_INFINITY {
                    break;
                }
                let mut ids = live[i][k].0.clone();
                ids.push(id as u32);
                if id as u32 == specials.end || last_step {
                    if rank < width {
                        finished[i].push((ids, score));
                    }
                } else if next.len() < width {
                    let row = i * width + next.len();
                    parents[row] = (i * width + k) as u32;
                    next_ids[row] = id as u32;
                    next.push((ids, score));
                }
            }
            finished[i].sort_by(|x, y| y.1.total_cmp(&x.1));
            finished[i].truncate(width);
            // Extending a beam only lowers its score: stop an image once its
            // n_best-th finished caption beats every live beam.
            if let Some(kth) = finished[i].get(n_best - 1)
                && next.iter().all(|l| l.1 <= kth.1)
            {
                next.clear();
            }
            live[i] = next;
        }
        moved = Some((parents, next_ids));
    }
    let mut out = Vec::with_capacity(images * n_best);
    for (i, mut done) in finished.into_iter().enumerate() {
        done.append(&mut live[i]);
        done.sort_by(|x, y| y.1.total_cmp(&x.1));
        for k in 0..n_best {
            let (ids, score) = done
                .get(k)
                .cloned()
                .unwrap_or((vec![specials.start, specials.end], f32::NEG_INFINITY));
            out.push((ids[1..].to_vec(), score));
        }
    }
    out
}
