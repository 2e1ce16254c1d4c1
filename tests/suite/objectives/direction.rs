//! Direction of learning: on the tiny world, from a captioner trained
//! briefly with MLE, a few dozen steps of each objective raise what it
//! rewards (the reward it logs, CLIP relevance's cosine, SLE's diversity
//! with its precision term off, the token-level objectives' own loss
//! lowered), and the same steps with the gradient's sign flipped do not;
//! and SLE's samples are more diverse than SCST's at a comparable reward.
//! A sign error anywhere between an objective's reward and the
//! parameters' gradient fails here.

use crate::common;

use captune::backend::Backend;
use captune::captioner::Checkpoint;
use captune::captioner::objective::{Objective, StepContext};
use captune::captioner::objectives;
use captune::captioner::objectives::settings::{SettingValue, Settings};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::cpu::CpuBackend;
use captune::retriever::Checkpoint as RetrieverCheckpoint;
use captune::retriever::eval::embed_images;
use captune::retriever::frozen::FrozenRetriever;
use captune::retriever::train::Prepared;
use captune::source::embeddings::CaptionData;
use common::{new_run, tiny_data};

/// The objective's gradient with its sign flipped: gradient ascent on
/// its loss.
struct Flipped<B: Backend>(Box<dyn Objective<B>>);

impl<B: Backend> Objective<B> for Flipped<B> {
    fn describe(&self) -> String {
        self.0.describe()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> anyhow::Result<()> {
        self.0.step(cx)?;
        for g in cx.model.params_mut().grads.iter_mut() {
            cx.b.scale(g, -1.0);
        }
        Ok(())
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        self.0.logged()
    }

    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        self.0.report(read)
    }
}

/// The tiny world with its images embedded by the shapes world's
/// retriever (the one captune carries), and that retriever: the frozen
/// listener DiscriTune and CLIP relevance read captions with, which tells
/// these images apart.
fn tiny_world_and_retriever(b: &CpuBackend) -> (CaptionData, FrozenRetriever<CpuBackend>) {
    let mut data = tiny_data();
    let path = captune::cache::shapes_retriever().unwrap();
    let mut retriever = RetrieverCheckpoint::load(b, &path, 16).unwrap();
    let prep = Prepared::new(data.data.clone(), retriever.model.config.image_size).unwrap();
    let items: Vec<usize> = (0..data.data.items.len()).collect();
    let hidden = indicatif::ProgressBar::hidden();
    data.features = embed_images(b, &mut retriever.model, &prep.images, &items, &hidden).unwrap();
    data.dim = retriever.model.config.embed_dim;
    (
        data,
        FrozenRetriever::from_checkpoint(b, retriever).unwrap(),
    )
}

fn config(objective: &str, settings: &[(&str, SettingValue)], lr: f32, epochs: usize) -> RunConfig {
    let mut c = RunConfig::preset("tiny").unwrap();
    c.train.objective = objective.into();
    c.train.settings = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect::<Settings>();
    (c.train.lr, c.train.epochs, c.train.warmup) = (lr, epochs, 0);
    (
        c.train.log_every,
        c.train.eval_images,
        c.train.sample_images,
    ) = (1, 0, 0);
    // A flipped run collapses on purpose: it must train on.
    c.train.collapse_stop = false;
    c
}

/// The logged `series` of `config`'s run (6 steps a tiny epoch) from
/// `start`, its gradient's sign flipped or not.
fn series(
    start: &Checkpoint<CpuBackend>,
    data: &CaptionData,
    config: &RunConfig,
    series: &str,
    flipped: bool,
) -> Vec<f32> {
    all_series(start, data, config, &[series], flipped).remove(0)
}

/// Each of the logged `series` of `config`'s run from `start`.
fn all_series(
    start: &Checkpoint<CpuBackend>,
    data: &CaptionData,
    config: &RunConfig,
    series: &[&str],
    flipped: bool,
) -> Vec<Vec<f32>> {
    let b = CpuBackend::new();
    let mut ck = Checkpoint {
        model: start.model_on(&b, &b).unwrap(),
        vocab: start.vocab.clone(),
    };
    let path = captune::cache::shapes_retriever().unwrap();
    let trained = RetrieverCheckpoint::load(&b, &path, 16).unwrap();
    let mut retriever = FrozenRetriever::from_checkpoint(&b, trained).unwrap();
    let name = format!("direction-{}-{flipped}", config.train.objective);
    let (mut trainer, dir) = new_run(&b, &mut ck, data, config, &name, Some(&mut retriever));
    if flipped {
        let vocab = start.vocab.len();
        let t = &config.train;
        let inner = objectives::build::<CpuBackend>(&t.objective, &t.settings, vocab).unwrap();
        trainer.use_objective(Box::new(Flipped(inner)));
    }
    let mut values = vec![Vec::new(); series.len()];
    while !trainer.finished() {
        trainer
            .train_batch(&b, |e| {
                if let Event::Log(l) = e {
                    for (v, name) in values.iter_mut().zip(series) {
                        v.push(l.values[*name]);
                    }
                }
                Flow::Continue
            })
            .unwrap();
    }
    drop(trainer);
    std::fs::remove_dir_all(dir).unwrap();
    values
}

/// The change of a series: the mean of its last 6 values minus the mean
/// of its first 6 (an epoch each, every training image once).
fn change(values: &[f32]) -> f32 {
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    mean(&values[values.len() - 6..]) - mean(&values[..6])
}

/// (objective, its settings, lr, the series it raises, +1 if it raises it
/// or -1 if it lowers it).
type Case<'a> = (&'a str, Vec<(&'a str, SettingValue)>, f32, &'a str, f32);

/// 20 epochs of MLE on `data`: where every objective starts from.
fn warm_start(
    b: &CpuBackend,
    data: &CaptionData,
    name: &str,
    epochs: usize,
) -> Checkpoint<CpuBackend> {
    let warm = config("mle", &[], 3e-3, epochs);
    let mut start = fresh_checkpoint(b, data, &warm).unwrap();
    let (mut trainer, dir) = new_run(b, &mut start, data, &warm, name, None);
    while !trainer.finished() {
        trainer.train_batch(b, |_| Flow::Continue).unwrap();
    }
    drop(trainer);
    std::fs::remove_dir_all(dir).unwrap();
    start
}

/// SLE's point: at a comparable CIDEr-D reward, its samples of an image
/// differ more than SCST's. From the same start at the same rate, SCST's
/// epoch at which its reward first reaches SLE's last epoch's reward has
/// less diverse samples than SLE's last: lower Div-2, and an mBLEU-4 (the
/// samples' overlap with each other) at least a quarter higher. SLE with
/// its diversity term off (alpha 1, SCST itself) fails the margin.
#[test]
fn sle_samples_more_diverse_captions_than_scst_at_a_comparable_reward() {
    let b = CpuBackend::new();
    let (data, _) = tiny_world_and_retriever(&b);
    // A start converged enough that SCST's sharpening shows in 30 epochs.
    let start = warm_start(&b, &data, "direction-sle-start", 60);
    let watched = ["reward", "div2", "mbleu4"];
    // Each series by tiny epoch (6 steps): reward, div2, mBLEU-4.
    let run = |objective| -> Vec<Vec<f32>> {
        let c = config(objective, &[], 3e-3, 30);
        let s = all_series(&start, &data, &c, &watched, false);
        let epochs = |v: &Vec<f32>| -> Vec<f32> {
            v.chunks(6)
                .map(|e| e.iter().sum::<f32>() / e.len() as f32)
                .collect()
        };
        s.iter().map(epochs).collect()
    };
    let (scst, sle) = (run("scst"), run("sle"));
    let last = sle[0].len() - 1;
    let target = sle[0][last];
    assert!(target > sle[0][0], "SLE raises its reward: {:?}", sle[0]);
    let Some(e) = scst[0].iter().position(|&r| r >= target) else {
        panic!("SCST never reaches SLE's reward {target}: {:?}", scst[0]);
    };
    eprintln!(
        "reward {target:.3}: SLE div2 {:.3} mBLEU-4 {:.3}; SCST (epoch {e}, reward {:.3}) div2 {:.3} \
         mBLEU-4 {:.3}",
        sle[1][last], sle[2][last], scst[0][e], scst[1][e], scst[2][e]
    );
    assert!(
        sle[1][last] > scst[1][e],
        "Div-2: SLE {:?}, SCST {:?}",
        sle[1],
        scst[1]
    );
    assert!(
        1.25 * sle[2][last] < scst[2][e],
        "mBLEU-4: SLE {:?}, SCST {:?}",
        sle[2],
        scst[2]
    );
}

#[test]
fn every_objective_raises_what_it_rewards_and_not_with_its_sign_flipped() {
    let b = CpuBackend::new();
    let (data, _) = tiny_world_and_retriever(&b);
    let start = warm_start(&b, &data, "direction-start", 20);
    let number = |x: f64| SettingValue::Number(x);
    let choice = |c: &str| SettingValue::Choice(c.into());
    // 10 epochs of 6 steps each.
    let cases: Vec<Case> = vec![
        ("mle", vec![], 3e-3, "mle", -1.0),
        ("smile", vec![], 3e-3, "smile", -1.0),
        (
            "scst",
            vec![("baseline", choice("greedy"))],
            2e-3,
            "reward",
            1.0,
        ),
        (
            "scst",
            vec![("baseline", choice("mean"))],
            2e-3,
            "reward",
            1.0,
        ),
        ("sll-me", vec![], 2e-3, "reward", 1.0),
        ("sle", vec![], 2e-3, "reward", 1.0),
        // SLE's diversity term alone (its precision term off).
        ("sle", vec![("alpha", number(0.0))], 2e-3, "div2", 1.0),
        // Greedy captions change only where an argmax flips: 10 epochs at
        // a rate they survive (at 1e-3 and above this tiny captioner's
        // greedy DiscriTune loses reward, as a collapse does).
        ("discritune", vec![], 5e-4, "reward", 1.0),
        (
            "discritune",
            vec![("hard_negatives", number(3.0))],
            5e-4,
            "reward",
            1.0,
        ),
        (
            "discritune",
            vec![("caption_decoding", choice("sample"))],
            2e-3,
            "reward",
            1.0,
        ),
        ("clip-relevance", vec![], 2e-3, "cosine", 1.0),
    ];
    // Each case trained and flipped; the cases run two at a time, since
    // this tiny captioner's steps keep one core busy, not two.
    let case = |(objective, settings, lr, watched, sign): &Case| {
        let c = config(objective, settings, *lr, 10);
        let what = format!("{objective} {settings:?}: {watched}");
        let s = series(&start, &data, &c, watched, false);
        let trained = sign * change(&s);
        let flipped = sign * change(&series(&start, &data, &c, watched, true));
        eprintln!(
            "{what}: {trained:+.4} trained, {flipped:+.4} flipped (from {})",
            s[0]
        );
        (!(trained > 0.0 && flipped < trained && flipped <= 0.0))
            .then(|| format!("{what}: {trained:+.4} trained, {flipped:+.4} flipped"))
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                // Named, so that a panic says which test it is in.
                let name = format!(
                    "{}-{w}",
                    std::thread::current().name().unwrap_or("direction")
                );
                std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(scope, || {
                        let mut failed = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(c) = cases.get(i) else { break failed };
                            failed.extend(case(c));
                        }
                    })
                    .unwrap()
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{failures:#?}");
}
