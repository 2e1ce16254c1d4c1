//! Caption generation: greedy, sampling (temperature, top-k, top-p) and
//! beam search, always over the full vocabulary. Each step runs the
//! decoder on the partial captions, gathers the logits row of the next
//! position on the device and reads back only that row per caption;
//! token choice happens on the host, identically for both backends.

use super::CaptionVocab;
use super::model::{Captioner, TokenInputs};
use crate::backend::Backend;
use crate::data::vocab::{BOS, EOS, UNK};
use crate::index::TokenIndex;
use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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
                    if *temperature <= 0.0 || !(*top_p > 0.0 && *top_p <= 1.0) {
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
            Decoding::Sample { n, .. } => n,
        }
    }

    /// Captions produced per image.
    pub fn per_image(&self) -> usize {
        match *self {
            Decoding::Greedy => 1,
            Decoding::Beam { n_best, .. } => n_best,
            Decoding::Sample { n, .. } => n,
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
    /// Sum of the log-probabilities of the chosen ids (full vocabulary).
    pub logprob: f32,
}

impl Generated {
    pub fn text(&self, vocab: &CaptionVocab) -> String {
        vocab.decode(&self.ids)
    }
}

/// Runs a captioner on partial captions and returns next-token
/// log-probabilities, `rows` at a time.
struct Stepper<'m, B: Backend> {
    model: &'m mut Captioner<B>,
    next_logits: B::Tensor,
    suppress_unk: bool,
}

impl<B: Backend> Stepper<'_, B> {
    /// log softmax of the logits after the last id of each sequence.
    fn step(&mut self, b: &B, features: &[f32], seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let c = self.model.config;
        let t = c.token_positions();
        let inputs = TokenInputs::new(b, &c, seqs)?;
        self.model.forward(b, features, &inputs);
        let rows: Vec<u32> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| (i * t + s.len() - 1) as u32)
            .collect();
        let rows = TokenIndex::new(b, &rows, self.model.rows())?;
        b.embedding(
            &self.model.logits,
            &rows,
            &mut self.next_logits,
            c.vocab_size,
            false,
        );
        let flat = b.to_vec(&self.next_logits);
        let mut logp: Vec<Vec<f32>> = flat.chunks(c.vocab_size).map(log_softmax).collect();
        if self.suppress_unk {
            // Out of every choice; the others keep their full-vocabulary log-probability.
            logp.iter_mut()
                .for_each(|row| row[UNK as usize] = f32::NEG_INFINITY);
        }
        Ok(logp)
    }
}

fn log_softmax(z: &[f32]) -> Vec<f32> {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let lse = max + z.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    z.iter().map(|&x| x - lse).collect()
}

/// The highest entry, the lowest id on ties.
fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Captions for every image of `features` (`[n, embed_dim]`), in image
/// order, `decoding.per_image()` each, within `options`' limits (and the
/// model's maximum length). The model's batch size sets how many
/// sequences run at once.
pub fn generate<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    features: &[f32],
    decoding: &Decoding,
    options: &DecodeOptions,
) -> Result<Vec<Generated>> {
    let c = model.config;
    // Steps: the words, then <eos>.
    let steps = options
        .max_words
        .map_or(c.token_positions(), |w| (w + 1).min(c.token_positions()));
    let d = c.embed_dim;
    assert!(
        features.len().is_multiple_of(d),
        "features are [n, embed_dim]"
    );
    let images = features.len() / d;
    let per_row = decoding.rows_per_image();
    let batch = model.batch;
    if per_row > batch {
        bail!(
            "the decoding needs {per_row} sequences per image but the model runs {batch} at once"
        );
    }
    let images_per_chunk = batch / per_row;
    let mut stepper = Stepper {
        next_logits: b.zeros(batch * c.vocab_size),
        model,
        suppress_unk: options.suppress_unk,
    };
    let mut out = Vec::with_capacity(images * decoding.per_image());
    let mut rng = match *decoding {
        Decoding::Sample { seed, .. } => ChaCha8Rng::seed_from_u64(seed),
        _ => ChaCha8Rng::seed_from_u64(0),
    };
    for first in (0..images).step_by(images_per_chunk) {
        let chunk: Vec<usize> = (first..(first + images_per_chunk).min(images)).collect();
        // Every row of the model's batch gets an image; rows past the
        // chunk repeat its last image and are ignored.
        let row_image: Vec<usize> = (0..batch)
            .map(|r| chunk[(r / per_row).min(chunk.len() - 1)])
            .collect();
        let rows_features: Vec<f32> = row_image
            .iter()
            .flat_map(|&i| features[i * d..(i + 1) * d].iter().copied())
            .collect();
        let generated = match *decoding {
            Decoding::Greedy | Decoding::Sample { .. } => {
                sample_rows(b, &mut stepper, &rows_features, decoding, &mut rng, steps)?
            }
            Decoding::Beam { width, n_best } => beam_rows(
                b,
                &mut stepper,
                &rows_features,
                width,
                n_best,
                chunk.len(),
                steps,
            )?,
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

/// Greedy or sampled continuation of every row at once.
fn sample_rows<B: Backend>(
    b: &B,
    stepper: &mut Stepper<'_, B>,
    features: &[f32],
    decoding: &Decoding,
    rng: &mut ChaCha8Rng,
    steps: usize,
) -> Result<Vec<(Vec<u32>, f32)>> {
    let rows = stepper.model.batch;
    let mut seqs = vec![vec![BOS]; rows];
    let mut logprob = vec![0.0f32; rows];
    let mut done = vec![false; rows];
    for _ in 0..steps {
        let logp = stepper.step(b, features, &seqs)?;
        for r in 0..rows {
            if done[r] {
                continue;
            }
            let id = match *decoding {
                Decoding::Sample {
                    temperature,
                    top_k,
                    top_p,
                    ..
                } => sample(&logp[r], temperature, top_k, top_p, rng),
                _ => argmax(&logp[r]),
            };
            logprob[r] += logp[r][id];
            seqs[r].push(id as u32);
            done[r] = id as u32 == EOS;
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(seqs
        .into_iter()
        .zip(logprob)
        .map(|(s, lp)| (s[1..].to_vec(), lp))
        .collect())
}

/// One id from log-probabilities after temperature, top-k and top-p.
fn sample(logp: &[f32], temperature: f32, top_k: usize, top_p: f32, rng: &mut impl Rng) -> usize {
    let mut order: Vec<usize> = (0..logp.len()).collect();
    order.sort_by(|&a, &b| logp[b].total_cmp(&logp[a]).then(a.cmp(&b)));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let scaled: Vec<f32> = order.iter().map(|&i| logp[i] / temperature).collect();
    let probs = {
        let p: Vec<f32> = log_softmax(&scaled).iter().map(|x| x.exp()).collect();
        let mut mass = 0.0;
        let keep = p
            .iter()
            .position(|&x| {
                mass += x;
                mass >= top_p
            })
            .map_or(p.len(), |i| i + 1);
        p[..keep].to_vec()
    };
    let total: f32 = probs.iter().sum();
    let mut u = rng.random::<f32>() * total;
    for (k, &p) in probs.iter().enumerate() {
        if u < p {
            return order[k];
        }
        u -= p;
    }
    order[probs.len() - 1]
}

/// Beam search for `images` images, `width` rows each; returns `n_best`
/// captions per image, best first (ranked by total log-probability).
fn beam_rows<B: Backend>(
    b: &B,
    stepper: &mut Stepper<'_, B>,
    features: &[f32],
    width: usize,
    n_best: usize,
    images: usize,
    steps: usize,
) -> Result<Vec<(Vec<u32>, f32)>> {
    let rows = stepper.model.batch;
    // Live beams per image: (ids from <bos>, score). At the start one beam
    // per image; the other rows idle on <bos>.
    let mut live: Vec<Vec<(Vec<u32>, f32)>> = vec![vec![(vec![BOS], 0.0)]; images];
    let mut finished: Vec<Vec<(Vec<u32>, f32)>> = vec![Vec::new(); images];
    for step in 0..steps {
        if live.iter().all(Vec::is_empty) {
            break;
        }
        let mut seqs = vec![vec![BOS]; rows];
        for (i, beams) in live.iter().enumerate() {
            for (k, (ids, _)) in beams.iter().enumerate() {
                seqs[i * width + k] = ids.clone();
            }
        }
        let logp = stepper.step(b, features, &seqs)?;
        let last_step = step + 1 == steps;
        for i in 0..images {
            let mut candidates: Vec<(f32, usize, usize)> = Vec::new();
            for (k, (_, score)) in live[i].iter().enumerate() {
                for (id, &lp) in logp[i * width + k].iter().enumerate() {
                    candidates.push((score + lp, k, id));
                }
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
            let mut next = Vec::new();
            for (score, k, id) in candidates {
                if next.len() == width || finished[i].len() >= width {
                    break;
                }
                let mut ids = live[i][k].0.clone();
                ids.push(id as u32);
                if id as u32 == EOS || last_step {
                    finished[i].push((ids, score));
                } else {
                    next.push((ids, score));
                }
            }
            // Extending a beam only lowers its score: stop an image once its
            // n_best-th finished caption beats every live beam.
            finished[i].sort_by(|x, y| y.1.total_cmp(&x.1));
            if let Some(kth) = finished[i].get(n_best - 1)
                && next.iter().all(|l| l.1 <= kth.1)
            {
                next.clear();
            }
            live[i] = next;
        }
    }
    let mut out = Vec::with_capacity(images * n_best);
    for (i, mut done) in finished.into_iter().enumerate() {
        done.append(&mut live[i]);
        done.sort_by(|x, y| y.1.total_cmp(&x.1));
        for k in 0..n_best {
            let (ids, score) = done
                .get(k)
                .cloned()
                .unwrap_or((vec![BOS, EOS], f32::NEG_INFINITY));
            out.push((ids[1..].to_vec(), score));
        }
    }
    Ok(out)
}
