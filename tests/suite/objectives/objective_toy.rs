//! An objective defined only here, through the public training API: it
//! trains, logs a series of its own, and the app's loss panel plots that
//! series with no change to the app.

use crate::common;

use captune::app::{CaptuneApp, Source};
use captune::backend::{Backend, VocabSubsets};
use captune::captioner::inputs::{TokenInputs, teacher_targets};
use captune::captioner::objective::{Objective, StepContext};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::cpu::CpuBackend;
use captune::ops::cross_entropy::CrossEntropy;
use common::{new_run, tiny_data};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Cross-entropy on each caption's first word only, logged as
/// `first_word` beside `loss`.
struct FirstWord<B: Backend> {
    /// The last step's loss and the buffers of its batch width.
    last: Option<(CrossEntropy<B>, B::Tensor)>,
}

impl<B: Backend> Objective<B> for FirstWord<B> {
    fn describe(&self) -> String {
        "first-word".into()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> anyhow::Result<()> {
        let b = cx.b;
        // Each row comes with its image's references; this run has no retriever.
        assert_eq!(cx.batch.images.len(), cx.batch.sequences.len());
        assert!(
            cx.batch
                .images
                .iter()
                .all(|&i| !cx.corpus.references[i].is_empty())
        );
        assert!(cx.retriever.is_none());
        let inputs = TokenInputs::trimmed(b, &cx.model.config, &cx.batch.sequences)?;
        let steps = inputs.positions;
        let vocab = cx.model.config.vocab_size;
        let pad = cx.model.config.specials.pad;
        let targets = b.ids(&teacher_targets(&cx.batch.sequences, steps, pad));
        let weights: Vec<f32> = (0..inputs.rows())
            .map(|r| if r % steps == 0 { 1.0 } else { 0.0 })
            .collect();
        let mut ce = CrossEntropy::new(b, inputs.rows(), vocab);
        ce.set_weights(b, &weights, 1.0);
        let full = VocabSubsets::full(b, inputs.rows());
        cx.model.forward(b, &cx.batch.inputs, &inputs)?;
        ce.forward(b, cx.model.logits(), &targets, &full, cx.monitor);
        let mut d_logits = b.zeros(inputs.rows() * vocab);
        ce.backward(b, cx.model.logits(), &targets, &full, &mut d_logits, false);
        cx.model.backward(b, &inputs, &d_logits);
        self.last = Some((ce, d_logits));
        Ok(())
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        vec![&self.last.as_ref().expect("a step").0.loss]
    }

    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        vec![("loss", read[0]), ("first_word", read[0])]
    }
}

#[test]
fn an_objective_defined_in_a_test_trains_logs_its_series_and_reaches_the_app() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.epochs = 6;
    config.train.log_every = 1;
    config.train.sample_images = 1;
    config.train.eval_images = 2;
    config.train.lr = 3e-3;
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let (mut trainer, dir) = new_run(&b, &mut ck, &data, &config, "toy-objective", None);
    trainer.use_objective(Box::new(FirstWord { last: None }));
    let mut first_words = Vec::new();
    while !trainer.finished() {
        let flow = trainer
            .train_batch(&b, |e| {
                if let Event::Log(l) = e {
                    assert_eq!(l.objective, "first-word");
                    first_words.push(l.values["first_word"]);
                }
                Flow::Continue
            })
            .unwrap();
        assert_eq!(flow, Flow::Continue);
    }
    // It trains: the first word's loss falls.
    let n = first_words.len();
    assert!(n >= 12, "{n} log lines");
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (early, late) = (mean(&first_words[..4]), mean(&first_words[n - 4..]));
    assert!(late < 0.8 * early, "first-word loss {early} -> {late}");
    // The run folder's log carries the series ...
    let log = std::fs::read_to_string(dir.join("log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), n);
    assert!(log.lines().all(|l| l.contains("\"first_word\":")), "{log}");

    // ... and the app, following the folder, plots it.
    let app = CaptuneApp::new(
        &egui::Context::default(),
        Arc::new(data),
        Source::Follow(dir.clone()),
    );
    let mut h = Harness::builder()
        .with_size(egui::vec2(1100.0, 720.0))
        .with_max_steps(32)
        .build_ui_state(|ui, app: &mut CaptuneApp| app.show(ui), app);
    let start = Instant::now();
    while h.state().history.losses.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the app read no log"
        );
        std::thread::sleep(Duration::from_millis(30));
        h.step();
    }
    h.run();
    assert!(
        h.state()
            .history
            .objective_series_names()
            .iter()
            .any(|s| s == "first_word"),
        "{:?}",
        h.state().history.objective_series_names()
    );
    assert!(h.query_by_label("first word").is_some(), "no legend entry");
    std::fs::remove_dir_all(&dir).unwrap();
}
