//! Training a captioner into a run folder (`run_folder` says what it
//! holds and how a run survives being killed). Resuming continues exactly
//! as the uninterrupted run would have: batch order and random subsets
//! are drawn from generators seeded by epoch and step.

use super::blip::blip_checkpoint;
use super::collapse::CollapseGuard;
use super::decode::{DecodeOptions, Decoding, generate};
use super::epoch_plan::EpochPlan;
use super::evaluate::{CaptionMetrics, caption_items, score_captions, words};
use super::inspect::score_caption;
use super::labelled::LabelledSplit;
use super::listener::frozen_retriever;
use super::model::Captioner;
use super::objective::{Needs, Objective, ObjectiveInfo, StepContext, TrainsOn};
use super::objectives;
use super::objectives::settings::Settings;
use super::pretrained::{self, PrefixShape};
use super::records::{EpochMetrics, Event, Flow, LogLine, Sample, read_log};
use super::run::RunConfig;
use super::run_folder::{self, Begin, ObjectiveState, Position, RunFolder};
use super::{CaptionVocab, Checkpoint};
use crate::backend::Backend;
use crate::data::Split;
use crate::metrics::diversity::diversity;
use crate::metrics::meteor::Meteor;
use crate::optim::{AdamW, AdamWConfig, warmup_cosine};
use crate::progress::Progress;
use crate::retriever::frozen::FrozenRetriever;
use crate::source::embeddings::CaptionData;
use crate::tensorfile;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

/// "labelled" or "unlabelled": the images an objective trains on under
/// a labelled fraction.
fn images_of(trains_on: TrainsOn) -> &'static str {
    match trains_on {
        TrainsOn::Captions => "labelled",
        TrainsOn::Images => "unlabelled",
    }
}

/// What `objective` with `settings` needs besides the batch; refused
/// when it needs a retriever the run lacks, or one that does not embed in
/// the captioner's `dim` (the check the objective's own step makes).
fn needs_met<B: Backend>(
    objective: &ObjectiveInfo,
    settings: &Settings,
    retriever: Option<&mut FrozenRetriever<B>>,
    dim: usize,
) -> Result<Needs> {
    let needs = (objective.needs)(settings);
    if needs.retriever {
        frozen_retriever(retriever, dim, objective.name)?;
    }
    Ok(needs)
}

/// One optimisation step: the objective's forwards and gradient (with
/// `cx.monitor`, also the values it logs), AdamW, and the submission that
/// lets a GPU start on it. Training runs it, and `bench train` times it.
pub(crate) fn optimise<B: Backend>(
    opt: &mut AdamW<B>,
    objective: &mut dyn Objective<B>,
    cx: &mut StepContext<'_, B>,
) -> Result<()> {
    let b = cx.b;
    cx.model.params_mut().zero_grads(b);
    objective.step(cx)?;
    let params = cx.model.params_mut();
    let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
    let grads: Vec<&B::Tensor> = params.grads.iter().collect();
    opt.step(b, &mut values, &grads);
    b.submit();
    Ok(())
}

/// Stochastic captions per image: in each sample record, and for the
/// per-epoch Div-1, Div-2 and mBLEU-4 (5 per image).
const SAMPLES_PER_IMAGE: usize = 5;
/// Validation images whose samples give the per-epoch diversity figures
/// (the first of the evaluated images; sampling all of them would double
/// the evaluation time).
const DIVERSITY_IMAGES: usize = 100;

/// A captioner with fresh weights and a vocabulary from `data`'s training
/// captions, shaped by `config`; or, when `config` names a pretrained
/// decoder, that decoder and its tokenizer with a fresh mapper.
pub fn fresh_checkpoint<B: Backend>(
    b: &B,
    data: &CaptionData,
    config: &RunConfig,
) -> Result<Checkpoint<B>> {
    if let Some(dir) = config.model.blip_folder()? {
        let blip = crate::model::blip::read(&dir)?;
        let prompt = config.model.prompt.as_deref();
        let vision = config.model.train_vision;
        return blip_checkpoint(b, &dir, blip, (config.model.max_len, prompt), vision);
    }
    if config.model.prompt.is_some() {
        bail!("[model] prompt: only a BLIP decoder (--decoder hf:FOLDER) is fed a prompt");
    }
    if config.model.train_vision {
        bail!(
            "[model] train_vision: only a BLIP decoder (--decoder hf:FOLDER) trains a vision \
             tower with it"
        );
    }
    if let Some((file, dir)) = config.model.clipcap()? {
        return super::clipcap::read(b, &file, &dir, config.model.max_len);
    }
    if let Some(dir) = config.model.decoder_folder()? {
        let m = &config.model;
        let shape = PrefixShape {
            embed_dim: data.dim,
            prefix_len: m.prefix_len,
            mapper_hidden: m.mapper_hidden,
            mapper_transformer: m.mapper_transformer,
            max_len: m.max_len,
        };
        return pretrained::from_folder(b, &dir, shape, config.train.seed);
    }
    let train_items = data.items(Split::Train);
    let split = LabelledSplit::new(&data.data, &train_items, config.train.labelled);
    let vocab = if split.is_full() {
        CaptionVocab::build(&data.data, config.train.min_count)?
    } else {
        CaptionVocab::build(&split.captioned(&data.data), config.train.min_count)?
    };
    let mut model_config = config.captioner(data.dim, vocab.len());
    if model_config.lstm.is_some_and(|l| l.model.reads_tokens()) {
        // An attention LSTM reads the data's image tokens.
        let Some(tokens) = &data.image_tokens else {
            bail!(
                "an attention LSTM reads image tokens, and the data has none: name the BLIP or \
                 CLIP folder whose vision tower makes them ([model] image_tokens = \"hf:FOLDER\", \
                 or --image-tokens)"
            );
        };
        let shape = tokens.shape();
        (model_config.image_tokens, model_config.embed_dim) = (shape.tokens, shape.dim);
    }
    Ok(Checkpoint {
        model: Captioner::new(b, model_config, config.train.seed)?,
        vocab,
    })
}

/// A training run in progress: the optimizer, the objective's buffers and
/// the position in the run. [`train`] drives it to the end; the desktop
/// app steps it from its own thread and may change the objective and the
/// learning rate between steps.
pub struct Trainer<'d, B: Backend> {
    pub ck: &'d mut Checkpoint<B>,
    data: &'d CaptionData,
    retriever: Option<&'d mut FrozenRetriever<B>>,
    config: RunConfig,
    run: RunFolder,
    opt: AdamW<B>,
    objective: Box<dyn Objective<B>>,
    /// The images it trains on and the batches its steps read.
    plan: EpochPlan,
    sample_items: Vec<usize>,
    eval_items: Vec<usize>,
    total: usize,
    step: usize,
    /// Epochs completed.
    epoch: usize,
    since: Instant,
    tokens: usize,
    /// Where validation reports its progress (hidden unless set).
    progress: Progress,
    /// Reads each log line for signs of a collapse.
    guard: CollapseGuard,
    /// The step of the state in the run folder (what a resume starts from).
    saved_step: usize,
    /// Scores validation's captions by METEOR too, when set.
    meteor: Option<Meteor>,
}

impl<'d, B: Backend> Trainer<'d, B> {
    /// Prepares the run folder as `begin` says (resuming restores the
    /// optimizer from it). The retriever, when given, adds its metrics to the
    /// per-epoch validation.
    pub fn new(
        b: &B,
        ck: &'d mut Checkpoint<B>,
        data: &'d CaptionData,
        config: &RunConfig,
        run: RunFolder,
        begin: Begin,
        mut retriever: Option<&'d mut FrozenRetriever<B>>,
    ) -> Result<Self> {
        let t = &config.train;
        let all_train = data.items(Split::Train);
        let split = LabelledSplit::new(&data.data, &all_train, t.labelled);
        let info = objectives::find(&t.objective)?;
        let trains_on = info.trains_on;
        let needs = needs_met(info, &t.settings, retriever.as_deref_mut(), data.dim)?;
        let train_images = split.images_for(trains_on).len();
        if train_images < t.batch {
            let which = if split.is_full() {
                String::new()
            } else {
                format!(
                    " {} (of {}, labelled {})",
                    images_of(trains_on),
                    all_train.len(),
                    t.labelled
                )
            };
            bail!(
                "{}: {}{which} training images, fewer than one batch of {}; lower [train] \
                 batch{}",
                data.data.name,
                train_images,
                t.batch,
                if split.is_full() {
                    ""
                } else {
                    " or change [train] labelled"
                }
            );
        }
        let total = train_images / t.batch * t.epochs;
        if t.warmup >= total {
            eprintln!(
                "warning: [train] warmup ({} steps) is not shorter than the run ({total} steps); \
                 the learning rate never reaches {}",
                t.warmup, t.lr
            );
        }
        let mut opt = AdamW::new(
            b,
            AdamWConfig {
                lr: t.lr,
                weight_decay: t.weight_decay,
                ..AdamWConfig::default()
            },
            &ck.model.params().optimizer_layout(),
        );
        if t.freeze_decoder && ck.model.config.vision.is_some() {
            bail!(
                "[train] freeze_decoder trains the cross-attention only, and this captioner \
                 trains its vision tower: choose one"
            );
        }
        if t.freeze_decoder {
            let model = &ck.model;
            opt.train_only(|i| model.is_adapter(i));
            let frozen: usize = (0..model.params().specs.len())
                .filter(|&i| !model.is_adapter(i))
                .map(|i| model.params().specs[i].len())
                .sum();
            eprintln!(
                "training the mapper only (freeze_decoder): the decoder's {frozen} parameters \
                 stay as they are"
            );
        }
        // The folder's config is always the one training now: a resumed run
        // may continue with another objective or more epochs, and the
        // network is the checkpoint's (a pretrained decoder's shape, say).
        let mut config = config.clone();
        config.model.take_shape(&ck.model.config);
        if data.source.is_some() {
            config.features = data.source.clone();
        }
        let mut objective = config.objective(ck.model.config.vocab_size)?;
        let mut guard = CollapseGuard::new(info.reward, ck.model.config.token_positions());
        let Position { step, epoch } = if begin == Begin::Resume {
            let position = run.recover()?;
            let saved = run_folder::load_optimizer(b, &mut opt, &run.optimizer())?;
            // The objective's own state and the guard's, when the run
            // goes on with the same objective.
            if let Some(s) = saved.filter(|s| s.objective == config.train.objective) {
                objective.restore(&s.values)?;
                guard.restore(s.guard);
            }
            tensorfile::write_atomic(&run.config(), config.to_toml().as_bytes())?;
            position
        } else {
            run.start(begin == Begin::Overwrite)?;
            tensorfile::write_atomic(&run.config(), config.to_toml().as_bytes())?;
            // The starting state, so that a run killed in its first epoch resumes.
            let start = Position { step: 0, epoch: 0 };
            let state = ObjectiveState::default();
            run.save_state(b, ck, &opt, &state, start, checkpoint_metadata(data))?;
            start
        };
        let val_items = data.items(Split::Val);
        let mut plan = EpochPlan::new(
            data,
            &ck.vocab,
            ck.model.config.max_len,
            split,
            trains_on,
            t.batch,
            t.seed,
        )?;
        if needs.image_embeddings {
            plan.embed_images(data);
        }
        Ok(Trainer {
            ck,
            data,
            retriever,
            config,
            run,
            opt,
            objective,
            plan,
            sample_items: val_items.iter().copied().take(t.sample_images).collect(),
            eval_items: val_items.iter().copied().take(t.eval_images).collect(),
            total,
            step,
            epoch,
            since: Instant::now(),
            tokens: 0,
            progress: Progress::hidden(),
            guard,
            saved_step: step,
            meteor: None,
        })
    }

    /// Shows validation's progress through `progress`.
    pub fn show_progress(&mut self, progress: Progress) {
        self.progress = progress;
    }

    /// Adds METEOR to validation's metrics, reading its paraphrase table
    /// now for the validation references' words.
    pub fn score_meteor(&mut self, mut meteor: Meteor) -> Result<()> {
        let items = &self.data.data.items;
        let references: Vec<String> = (self.eval_items.iter())
            .flat_map(|&i| items[i].captions.iter().map(|c| c.tokens.join(" ")))
            .collect();
        meteor.expect(references.iter().map(String::as_str))?;
        self.meteor = Some(meteor);
        Ok(())
    }

    pub fn step(&self) -> usize {
        self.step
    }

    pub fn total_steps(&self) -> usize {
        self.total
    }

    pub fn finished(&self) -> bool {
        self.step >= self.total
    }

    pub fn run_folder(&self) -> &RunFolder {
        &self.run
    }

    /// Trains on with `objective` (and `lr` as the schedule's peak) from
    /// the next batch; the run folder's config.toml records the change,
    /// so `--resume` continues with it.
    pub fn set_objective(&mut self, name: &str, settings: &Settings, lr: f32) -> Result<()> {
        let info = objectives::find(name)?;
        let trains_on = info.trains_on;
        if trains_on != self.plan.trains_on && !self.plan.split.is_full() {
            bail!(
                "{name} trains on the {} images and this run on the {}; with [train] labelled {} \
                 start it as a new run from this one's checkpoint (`captune train --init`)",
                images_of(trains_on),
                images_of(self.plan.trains_on),
                self.plan.split.fraction
            );
        }
        let dim = self.data.dim;
        let needs = needs_met(info, settings, self.retriever.as_deref_mut(), dim)?;
        let t = &mut self.config.train;
        (t.objective, t.settings, t.lr) = (name.to_string(), settings.clone(), lr);
        self.config = RunConfig::parse(&self.config.to_toml(), "the changed run config")?;
        self.objective = self.config.objective(self.ck.model.config.vocab_size)?;
        let positions = self.ck.model.config.token_positions();
        self.guard = CollapseGuard::new(info.reward, positions);
        if needs.image_embeddings {
            self.plan.embed_images(self.data);
        }
        tensorfile::write_atomic(&self.run.config(), self.config.to_toml().as_bytes())
    }

    /// Trains on with an objective of the caller's from the next batch.
    /// The run folder's config.toml cannot name it: a resumed run goes on
    /// with the configured objective.
    pub fn use_objective(&mut self, objective: Box<dyn Objective<B>>) {
        self.objective = objective;
        self.guard = CollapseGuard::new(None, self.ck.model.config.token_positions());
    }

    /// Trains one batch; at the end of an epoch also writes the
    /// checkpoint, the samples and the validation metrics.
    pub fn train_batch(
        &mut self,
        b: &B,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        let t = self.config.train.clone();
        let batch =
            (self.plan).next_batch(self.data, &self.ck.model.config, self.epoch, self.step)?;
        let tokens = batch.references().tokens();
        self.tokens += tokens;
        // Steps that log read every loss; the others compute only the objective's.
        let logs =
            (self.step + 1).is_multiple_of(t.log_every.max(1)) || self.step + 1 == self.total;
        self.opt.config.lr = warmup_cosine(t.lr, t.warmup, self.step, self.total);
        let mut rng = ChaCha8Rng::seed_from_u64(t.seed.wrapping_add(self.step as u64));
        let mut cx = StepContext {
            b,
            model: &mut self.ck.model,
            vocab: &self.ck.vocab,
            batch: &batch,
            corpus: &self.plan.corpus,
            // Batches of short captions would otherwise weigh each of their
            // tokens more than batches of long ones (a loss is a per-token
            // mean): weigh the gradient by the batch's share of tokens.
            // (A labelled batch beside unlabelled images is a random draw.)
            gradient_weight: if batch.labelled.is_some() {
                1.0
            } else {
                tokens as f32 / (t.batch as f32 * self.plan.mean_tokens())
            },
            retriever: self.retriever.as_deref_mut(),
            rng: &mut rng,
            monitor: logs,
        };
        optimise(&mut self.opt, self.objective.as_mut(), &mut cx)?;
        self.step += 1;
        let epoch_done = self.plan.batch_done();
        crate::killpoint::here("batch", || {});
        if logs {
            let line = self.log_line(b)?;
            self.run.append(run_folder::LOG, &line)?;
            if on_event(Event::Log(&line)) == Flow::Stop {
                return Ok(Flow::Stop);
            }
            if self.watch_for_collapse(&line, &mut on_event)? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        if epoch_done {
            return self.end_epoch(b, on_event);
        }
        Ok(Flow::Continue)
    }

    /// The log line of the step just taken (one readback); a loss that is
    /// not finite stops training with the last good checkpoint named.
    fn log_line(&mut self, b: &B) -> Result<LogLine> {
        let (values, grad_sumsq) = read_log(b, self.objective.as_ref(), self.opt.grad_sumsq());
        let loss = values.first().map_or(f32::NAN, |v| v.1);
        if !loss.is_finite() {
            bail!(
                "the loss became {loss} at step {} (epoch {}); {}; resume from it at a lower \
                 rate with `{}`",
                self.step,
                self.epoch + 1,
                self.last_good_checkpoint(),
                self.resume_command()
            );
        }
        let line = LogLine {
            step: self.step,
            epoch: self.epoch + 1,
            objective: self.objective.describe(),
            values: values
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            lr: self.opt.config.lr,
            grad_norm: grad_sumsq.sqrt(),
            tokens_per_s: self.tokens as f64 / self.since.elapsed().as_secs_f64(),
        };
        (self.since, self.tokens) = (Instant::now(), 0);
        Ok(line)
    }

    /// Reads a log line for signs of a collapse: warns at the first of a
    /// run of them, and at the third in a row stops the run (an error
    /// naming the checkpoint kept and the command to resume) unless
    /// `collapse_stop` is off.
    fn watch_for_collapse(
        &mut self,
        line: &LogLine,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        let Some(collapse) = self.guard.observe(self.step, &line.values) else {
            return Ok(Flow::Continue);
        };
        let signs = collapse.signs.join("; ");
        let resume = self.resume_command();
        if self.config.train.collapse_stop && collapse.stops() {
            let saved_after = if self.saved_step >= collapse.since {
                format!(
                    " (saved after the first sign, at step {}: if its captions are \
                     already collapsed, start again from the checkpoint this run began \
                     from, with --init and a lower --lr)",
                    collapse.since
                )
            } else {
                String::new()
            };
            bail!(
                "the captions collapsed at step {} (epoch {}): {signs}; training stopped \
                 after {} logged steps like this. {}{saved_after}; resume from it at a \
                 lower rate with `{resume}`, or train on regardless with \
                 --no-collapse-stop ([train] collapse_stop = false)",
                self.step,
                self.epoch + 1,
                collapse.streak,
                self.last_good_checkpoint()
            );
        }
        if collapse.streak == 1 {
            let then = if self.config.train.collapse_stop {
                format!(
                    "the run stops if {} logged steps in a row look like this",
                    super::collapse::STOP_AFTER
                )
            } else {
                "the run trains on (collapse_stop is off)".into()
            };
            let warning = format!(
                "warning: the captions may be collapsing at step {}: {signs}. The \
                 learning rate ({:e}) is likely too high for fine-tuning: stop and \
                 resume at a lower one with `{resume}`; {then}",
                self.step, self.config.train.lr
            );
            return Ok(on_event(Event::Warning(&warning)));
        }
        Ok(Flow::Continue)
    }

    /// Validates the current weights into a metrics record of the current
    /// epoch and step: at a run's start (epoch 0, step 0), the "before"
    /// point of a run from a checkpoint.
    pub fn validate_now(
        &mut self,
        b: &B,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        if self.eval_items.is_empty() {
            return Ok(Flow::Continue);
        }
        let record = EpochMetrics {
            epoch: self.epoch,
            step: self.step,
            metrics: self.validate(b)?,
        };
        self.run.append(run_folder::METRICS, &record)?;
        Ok(on_event(Event::Metrics(&record)))
    }

    /// The command that resumes this run at a tenth of its rate; with the
    /// retriever its objective needs, which the run folder records only
    /// when the features came from it.
    fn resume_command(&self) -> String {
        let info = objectives::find(&self.config.train.objective);
        let needs = info.map_or(Needs::default(), |i| (i.needs)(&self.config.train.settings));
        let retriever = if needs.retriever
            && self
                .data
                .source
                .as_ref()
                .is_none_or(|s| s.retriever.is_none())
        {
            " --retriever RETRIEVER"
        } else {
            ""
        };
        format!(
            "captune train --resume --out {} --lr {}{retriever}",
            self.run.dir.display(),
            lower_rate(self.config.train.lr)
        )
    }

    /// "the last good checkpoint is PATH (...)": the state a resume starts from.
    fn last_good_checkpoint(&self) -> String {
        let when = if self.epoch == 0 {
            "the run's start".to_string()
        } else {
            format!("end of epoch {}", self.epoch)
        };
        format!(
            "the last good checkpoint is {} ({when})",
            self.run.checkpoint().display()
        )
    }

    /// Validates (samples, then metrics) and saves the state. Validation
    /// comes first: a run killed during it resumes from the previous epoch
    /// and validates again (see `run_folder`).
    fn end_epoch(&mut self, b: &B, mut on_event: impl FnMut(Event<'_>) -> Flow) -> Result<Flow> {
        self.epoch += 1;
        self.plan.next_epoch();
        if self.write_samples(b, &mut on_event)? == Flow::Stop {
            // Stopped before the metrics: the state stays at the last
            // epoch, and a resume trains and validates this one again.
            return Ok(Flow::Stop);
        }
        crate::killpoint::here("validation", || {});
        let mut flow = Flow::Continue;
        if !self.eval_items.is_empty() {
            let record = EpochMetrics {
                epoch: self.epoch,
                step: self.step,
                metrics: self.validate(b)?,
            };
            self.run.append(run_folder::METRICS, &record)?;
            flow = on_event(Event::Metrics(&record));
        }
        let position = Position {
            step: self.step,
            epoch: self.epoch,
        };
        let state = ObjectiveState {
            objective: self.config.train.objective.clone(),
            values: self.objective.state(),
            guard: self.guard.state(),
        };
        self.run.save_state(
            b,
            self.ck,
            &self.opt,
            &state,
            position,
            checkpoint_metadata(self.data),
        )?;
        self.saved_step = self.step;
        (self.since, self.tokens) = (Instant::now(), 0);
        Ok(flow)
    }

    /// Every metric of the greedy captions of the evaluated validation
    /// images, and the diversity of 5 samples for the first of them.
    fn validate(&mut self, b: &B) -> Result<CaptionMetrics> {
        let bar = self.progress.start(
            &format!("epoch {}: validation captions", self.epoch),
            self.eval_items.len() as u64,
        );
        let captions = caption_items(
            b,
            self.ck,
            self.data,
            &self.eval_items,
            &Decoding::Greedy,
            &progress_only(&bar),
        )?;
        bar.finish_and_clear();
        let mut metrics = score_captions(
            b,
            self.data,
            &self.eval_items,
            &captions,
            self.retriever.as_deref_mut(),
            self.meteor.as_mut(),
        )?;
        let diverse = &self.eval_items[..self.eval_items.len().min(DIVERSITY_IMAGES)];
        let bar = self.progress.start(
            &format!("epoch {}: validation samples", self.epoch),
            diverse.len() as u64,
        );
        let sampled = caption_items(
            b,
            self.ck,
            self.data,
            diverse,
            &sampling(self.step),
            &progress_only(&bar),
        )?;
        bar.finish_and_clear();
        let sets: Vec<Vec<Vec<String>>> = sampled
            .iter()
            .map(|g| g.iter().map(|c| words(c)).collect())
            .collect();
        let d = diversity(&sets);
        (metrics.div1, metrics.div2, metrics.mbleu4) = (Some(d.div1), Some(d.div2), Some(d.mbleu4));
        Ok(metrics)
    }

    /// Captions the fixed validation images now (greedy with per-token
    /// losses, and samples) into `samples.jsonl`.
    pub fn write_samples(
        &mut self,
        b: &B,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        // One pass samples every image; then each image's greedy caption is decoded and scored.
        let bar = self.progress.start(
            &format!("epoch {}: sample captions", self.epoch),
            2 * self.sample_items.len() as u64,
        );
        let options = progress_only(&bar);
        let sampled = caption_items(
            b,
            self.ck,
            self.data,
            &self.sample_items,
            &sampling(self.step),
            &options,
        )?;
        for (&i, samples) in self.sample_items.iter().zip(sampled) {
            let inputs = self
                .data
                .inputs_of(&[i], self.ck.model.config.embedding_reading())?;
            let generated = generate(b, &self.ck.model, &inputs, &Decoding::Greedy, &options)?;
            let ids: Vec<u32> = std::iter::once(self.ck.model.config.specials.start)
                .chain(generated[0].ids.iter().copied())
                .collect();
            let sample = Sample {
                epoch: self.epoch,
                step: self.step,
                image_id: self.data.data.items[i].id.clone(),
                caption: generated[0].text(&self.ck.vocab),
                tokens: score_caption(b, &mut self.ck.model, &self.ck.vocab, &inputs, &ids)?,
                samples,
            };
            self.run.append(run_folder::SAMPLES, &sample)?;
            if on_event(Event::Sample(&sample)) == Flow::Stop {
                bar.finish_and_clear();
                return Ok(Flow::Stop);
            }
        }
        bar.finish_and_clear();
        Ok(Flow::Continue)
    }

    /// Writes the model now (atomically) to `path`.
    pub fn save(&self, b: &B, path: &Path) -> Result<()> {
        self.ck.save(b, path, HashMap::new())
    }
}

/// A tenth of `lr`, as a flag's value ("3e-4", not "3.0000001e-4").
fn lower_rate(lr: f32) -> String {
    let tenth: f64 = format!("{:.2e}", lr as f64 / 10.0)
        .parse()
        .expect("a number");
    format!("{tenth:e}")
}

/// Default decoding limits, reporting to `bar`.
fn progress_only(bar: &indicatif::ProgressBar) -> DecodeOptions {
    DecodeOptions {
        progress: Some(bar.clone()),
        ..DecodeOptions::default()
    }
}

/// The samples' decoding: temperature 1 from the policy, seeded
/// by the step so that a resumed run draws the same ones.
fn sampling(step: usize) -> Decoding {
    Decoding::Sample {
        n: SAMPLES_PER_IMAGE,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: step as u64,
    }
}

/// Trains `ck` on the training split to the end of the run, writing the
/// run folder, with progress bars in `progress`; `begin` says whether it
/// starts a run in the folder or continues the one there. The retriever, when given, adds its metrics
/// to the per-epoch validation. With `validate_start` (a new run from a
/// checkpoint), the starting weights are validated first, as epoch 0.
/// METEOR, when given, scores validation's captions too.
#[allow(clippy::too_many_arguments)]
pub fn train<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    data: &CaptionData,
    config: &RunConfig,
    run: &RunFolder,
    begin: Begin,
    validate_start: bool,
    retriever: Option<&mut FrozenRetriever<B>>,
    meteor: Option<Meteor>,
    progress: &Progress,
    mut on_event: impl FnMut(Event<'_>) -> Flow,
) -> Result<()> {
    let mut trainer = Trainer::new(b, ck, data, config, run.clone(), begin, retriever)?;
    trainer.show_progress(progress.clone());
    if let Some(meteor) = meteor {
        trainer.score_meteor(meteor)?;
    }
    if validate_start
        && trainer.step() == 0
        && trainer.validate_now(b, |e| progress.suspend(|| on_event(e)))? == Flow::Stop
    {
        return Ok(());
    }
    let bar = progress.start("training", trainer.total_steps() as u64);
    bar.set_position(trainer.step() as u64);
    while !trainer.finished() {
        let flow = trainer.train_batch(b, |e| {
            if let Event::Log(l) = e {
                let values: Vec<String> = l
                    .values
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.3}"))
                    .collect();
                bar.set_message(format!("epoch {} {}", l.epoch, values.join(" ")));
            }
            progress.suspend(|| on_event(e))
        });
        bar.set_position(trainer.step() as u64);
        match flow {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop) => {
                bar.abandon();
                return Ok(());
            }
            Err(e) => {
                bar.abandon();
                return Err(e);
            }
        }
    }
    bar.finish();
    Ok(())
}

/// Validates a run folder's saved state (`run` resumed) without training:
/// the samples and metrics records of its epoch and step, as the end of
/// that epoch writes them. For a run another engine trained.
#[allow(clippy::too_many_arguments)]
pub fn validate_saved<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    data: &CaptionData,
    config: &RunConfig,
    run: &RunFolder,
    retriever: Option<&mut FrozenRetriever<B>>,
    meteor: Option<Meteor>,
    progress: &Progress,
    mut on_event: impl FnMut(Event<'_>) -> Flow,
) -> Result<()> {
    let mut trainer = Trainer::new(b, ck, data, config, run.clone(), Begin::Resume, retriever)?;
    trainer.show_progress(progress.clone());
    if let Some(meteor) = meteor {
        trainer.score_meteor(meteor)?;
    }
    if trainer.write_samples(b, |e| progress.suspend(|| on_event(e)))? == Flow::Stop {
        return Ok(());
    }
    trainer.validate_now(b, |e| progress.suspend(|| on_event(e)))?;
    Ok(())
}

/// What a checkpoint trained on `data` records besides its weights: where
/// its features came from.
pub fn checkpoint_metadata(data: &CaptionData) -> HashMap<String, String> {
    data.source
        .iter()
        .map(|source| {
            (
                super::FEATURES_KEY.to_string(),
                serde_json::to_string(source).expect("a feature source serialises"),
            )
        })
        .collect()
}
