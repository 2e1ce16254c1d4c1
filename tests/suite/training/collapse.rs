//! The collapse guard through the public trainer: an objective that
//! trains as MLE but logs captions that turn into one repeated word is
//! warned about at its first such log line and stopped at the third,
//! with the last good checkpoint kept and the command to resume at a
//! lower rate; with the stop turned off it trains to the end; and a run
//! from a checkpoint validates its starting weights as epoch 0.

use crate::common;

use captune::backend::Backend;
use captune::captioner::objective::{Objective, StepContext};
use captune::captioner::objectives;
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::cpu::CpuBackend;
use captune::tensorfile;
use common::{new_run, tiny_data};
use std::cell::Cell;
use std::path::PathBuf;

/// MLE, logging `repetition` from a script: one value per logged step.
struct Scripted<B: Backend> {
    mle: Box<dyn Objective<B>>,
    script: Vec<f32>,
    reported: Cell<usize>,
}

impl<B: Backend> Objective<B> for Scripted<B> {
    fn describe(&self) -> String {
        "scripted".into()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> anyhow::Result<()> {
        self.mle.step(cx)
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        self.mle.logged()
    }

    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        let mut values = self.mle.report(read);
        let at = self.reported.get();
        self.reported.set(at + 1);
        values.push(("repetition", self.script[at.min(self.script.len() - 1)]));
        values
    }
}

/// What a run of the scripted objective did.
struct Outcome {
    warnings: Vec<String>,
    /// The error that stopped it, if one did.
    error: Option<String>,
    /// Steps trained.
    steps: usize,
    dir: PathBuf,
}

/// Trains up to `script.len()` steps of the scripted objective, each
/// logged.
fn run(script: &[f32], collapse_stop: bool, name: &str) -> Outcome {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.log_every = 1;
    config.train.epochs = 4; // 6 batches of 16 an epoch
    config.train.eval_images = 0;
    config.train.sample_images = 0;
    config.train.collapse_stop = collapse_stop;
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let vocab = ck.vocab.len();
    let (mut trainer, dir) = new_run(&b, &mut ck, &data, &config, name, None);
    trainer.use_objective(Box::new(Scripted {
        mle: objectives::build::<CpuBackend>("mle", &Default::default(), vocab).unwrap(),
        script: script.to_vec(),
        reported: Cell::new(0),
    }));
    let (mut warnings, mut error) = (Vec::new(), None);
    for _ in 0..script.len() {
        let stepped = trainer.train_batch(&b, |e| {
            if let Event::Warning(w) = e {
                warnings.push(w.to_string());
            }
            Flow::Continue
        });
        match stepped {
            Ok(flow) => assert_eq!(flow, Flow::Continue),
            Err(e) => {
                error = Some(format!("{e:#}"));
                break;
            }
        }
    }
    Outcome {
        warnings,
        error,
        steps: trainer.step(),
        dir,
    }
}

#[test]
fn a_collapse_is_warned_about_at_once_and_stops_the_run_at_the_third_sign() {
    // Steps 1-2 clean, 3 a sign, 4 clean (the streak ends), then signs
    // from step 5 on: the warnings come at steps 3 and 5, the stop at 7.
    let script = [0.2, 0.25, 0.9, 0.3, 0.95, 0.97, 1.0, 1.0, 1.0, 1.0];
    let o = run(&script, true, "collapse-stop");
    assert_eq!(o.warnings.len(), 2, "{:?}", o.warnings);
    for (w, step) in o.warnings.iter().zip([3, 5]) {
        assert!(
            w.contains(&format!("collapsing at step {step}:"))
                && w.contains("repeat one word")
                && w.contains("--resume --out")
                && w.contains("--lr 3e-4")
                && w.contains("the run stops if 3 logged steps"),
            "{w}"
        );
    }
    let error = o.error.expect("the run stops");
    assert_eq!(o.steps, 7, "{error}");
    assert!(
        error.contains("collapsed at step 7")
            && error.contains("after 3 logged steps")
            && error.contains("last good checkpoint is")
            && error.contains("(end of epoch 1) (saved after the first sign, at step 5")
            && error.contains(&format!("--resume --out {} --lr 3e-4", o.dir.display()))
            && error.contains("--no-collapse-stop"),
        "{error}"
    );
    // The checkpoint kept is the end of epoch 1 (6 batches), which a resume reads.
    let meta = tensorfile::read_metadata(&o.dir.join("checkpoint.safetensors")).unwrap();
    assert_eq!(meta["step"], "6", "{meta:?}");
    std::fs::remove_dir_all(&o.dir).unwrap();
}

#[test]
fn with_the_stop_off_a_collapse_is_warned_about_and_training_goes_on() {
    let script = [0.2, 0.9, 0.95, 0.97, 1.0, 1.0, 0.2, 0.9];
    let o = run(&script, false, "collapse-warn");
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(o.steps, script.len());
    // One warning per run of signs.
    assert_eq!(o.warnings.len(), 2, "{:?}", o.warnings);
    assert!(
        o.warnings[0].contains("the run trains on"),
        "{}",
        o.warnings[0]
    );
    std::fs::remove_dir_all(&o.dir).unwrap();
}

#[test]
fn a_run_from_a_checkpoint_validates_its_starting_weights_as_epoch_0() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.epochs = 1;
    config.train.sample_images = 0;
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let (mut trainer, dir) = new_run(&b, &mut ck, &data, &config, "validate-start", None);
    let mut seen = Vec::new();
    trainer
        .validate_now(&b, |e| {
            if let Event::Metrics(m) = e {
                seen.push((m.epoch, m.step));
            }
            Flow::Continue
        })
        .unwrap();
    while !trainer.finished() {
        trainer
            .train_batch(&b, |e| {
                if let Event::Metrics(m) = e {
                    seen.push((m.epoch, m.step));
                }
                Flow::Continue
            })
            .unwrap();
    }
    assert_eq!(seen, [(0, 0), (1, 6)]);
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(
        (first["epoch"].as_u64(), first["step"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(first["CIDEr-D"].as_f64().is_some(), "{first}");
    std::fs::remove_dir_all(&dir).unwrap();
}
