//! The desktop app driven through egui_kittest: a run trained in the app
//! fills the loss curves and switches objective; the inspector rescores
//! as you type; a followed run folder fills every panel. Snapshot images
//! of the panels are kept in tests/snapshots/ (rendered by wgpu; lavapipe
//! in CI). `UPDATE_SNAPSHOTS=1` rewrites them.

use crate::common;

use captune::app::history::RecordFile;
use captune::app::live::State;
use captune::app::{CaptuneApp, Source, Tab, TrainSetup};
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::cpu::CpuBackend;
use captune::device::DeviceChoice;
use captune::shapes::facts::FactMark;
use captune::source::embeddings::CaptionData;
use common::tiny_data;
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fresh folder; its name has no process id, as the snapshots show it.
fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("captune-app-test-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn harness(source: Source) -> Harness<'static, CaptuneApp> {
    harness_on(tiny_data(), source)
}

fn harness_on(data: CaptionData, source: Source) -> Harness<'static, CaptuneApp> {
    let app = CaptuneApp::new(&egui::Context::default(), Arc::new(data), source);
    // Answers arriving from the threads relayout tables and scroll areas,
    // which can take egui more than the default 4 steps to settle.
    Harness::builder()
        .with_size(egui::vec2(1100.0, 720.0))
        .with_max_steps(32)
        .build_ui_state(|ui, app: &mut CaptuneApp| app.show(ui), app)
}

/// Steps the UI (in real time: the app polls files and threads) until
/// `done` holds; fails after two minutes.
fn step_until(h: &mut Harness<'_, CaptuneApp>, what: &str, done: impl Fn(&CaptuneApp) -> bool) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "waited two minutes for {what}; live run: {:?}",
            h.state().live_status()
        );
        std::thread::sleep(Duration::from_millis(30));
        h.step();
    }
    h.run();
}

/// Training `config` in the app on the CPU into `out`, from fresh weights.
fn live_cpu_run(config: RunConfig, out: &Path, autostart: bool) -> Source {
    Source::Train(Box::new(TrainSetup {
        device: DeviceChoice::Cpu,
        config,
        out: out.to_path_buf(),
        init: None,
        retriever: None,
        autostart,
    }))
}

fn tiny_config() -> RunConfig {
    let mut c = RunConfig::preset("tiny").unwrap();
    c.train.epochs = 8;
    c.train.log_every = 1;
    c.train.sample_images = 2;
    c.train.eval_images = 4;
    c
}

#[test]
fn a_live_run_fills_the_loss_curves_pauses_and_switches_objective() {
    let out = temp("live");
    // Epochs enough that the run is still training when Pause is pressed.
    let mut config = tiny_config();
    config.train.epochs = 30;
    let mut h = harness(live_cpu_run(config, &out, false));
    h.run();
    // Before Start, the empty loss panel says how to begin.
    assert!(
        h.query_by_label_contains("Press Start on the left")
            .is_some()
            && h.query_by_label_contains("--follow").is_some()
    );
    h.get_by_label("Start").click();
    step_until(&mut h, "five loss points", |a| a.history.losses.len() >= 5);
    // The curves keep gaining points while it trains.
    let seen = h.state().history.losses.len();
    step_until(&mut h, "more loss points", |a| {
        a.history.losses.len() > seen + 3
    });
    assert_eq!(
        h.query_all_by_label_contains(", MLE ").count(),
        1,
        "the newest losses"
    );

    h.get_by_label("Pause").click();
    step_until(&mut h, "the pause", |a| {
        a.live_status().unwrap().state == State::Paused
    });
    let paused_at = h.state().live_status().unwrap().step;
    std::thread::sleep(Duration::from_millis(300));
    h.run();
    assert_eq!(
        h.state().live_status().unwrap().step,
        paused_at,
        "a paused run trains no further"
    );

    // The objective's knobs come from its declared settings: MLE has
    // none, SMILE a first-token mode and lambda.
    let shown =
        |h: &Harness<'_, CaptuneApp>, label: &str| h.query_all_by_label_contains(label).count() > 0;
    assert!(!shown(&h, "lambda"));
    h.state_mut().training.knobs.objective = "smile".into();
    h.run();
    assert!(shown(&h, "lambda (MLE weight)") && shown(&h, "first token"));
    // One click per frame, as a person clicks.
    for button in ["Apply objective", "Save checkpoint", "Resume"] {
        h.get_by_label(button).click_accesskit();
        h.run();
    }
    step_until(&mut h, "the end of the run", |a| {
        a.live_status().unwrap().state == State::Finished
    });
    step_until(&mut h, "the last log lines", |a| {
        a.history.losses.last().map(|p| p.step) == Some(a.live_status().unwrap().total)
    });
    let objectives: Vec<String> = h
        .state()
        .history
        .switches
        .iter()
        .map(|s| s.objective.clone())
        .collect();
    assert_eq!(objectives.len(), 2, "{objectives:?}");
    assert!(objectives[0].starts_with("mle") && objectives[1].starts_with("smile"));
    assert!(h.state().history.switches[1].step > paused_at);
    let saved = out.join(format!("step-{paused_at}.safetensors"));
    assert!(
        saved.exists(),
        "{} missing; the folder has {:?}",
        saved.display(),
        std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    // The run folder records the switch for `captune train --resume`.
    let config = RunConfig::load(&out.join("config.toml")).unwrap();
    assert_eq!(config.train.objective, "smile");
    assert!(!h.state().history.metrics.is_empty() && !h.state().history.samples.is_empty());
    std::fs::remove_dir_all(&out).unwrap();
}

/// Under a labelled fraction, Apply objective with an objective that
/// trains on the other images is refused with a note saying what to do,
/// and the run trains on as it was.
#[test]
fn a_refused_objective_switch_is_a_note_and_the_run_trains_on() {
    let out = temp("labelled-switch");
    let mut config = tiny_config();
    config.train.epochs = 400;
    config.train.labelled = 0.25;
    let mut h = harness(live_cpu_run(config, &out, true));
    step_until(&mut h, "a loss point", |a| !a.history.losses.is_empty());
    h.state_mut().training.knobs.objective = "clip-relevance".into();
    h.run();
    h.get_by_label("Apply objective").click_accesskit();
    h.run();
    step_until(&mut h, "the refusal", |a| {
        a.live_status().unwrap().note.contains("--init")
    });
    let seen = h.state().history.losses.len();
    step_until(&mut h, "more loss points", |a| {
        a.history.losses.len() > seen + 3
    });
    let status = h.state().live_status().unwrap();
    assert_eq!(status.state, State::Running);
    assert!(status.objective.starts_with("mle"), "{}", status.objective);
    h.get_by_label("Stop").click_accesskit();
    step_until(&mut h, "the stop", |a| {
        a.live_status().unwrap().state == State::Stopped
    });
    std::fs::remove_dir_all(&out).unwrap();
}

fn tiny_checkpoint(path: &Path) {
    checkpoint_of(&tiny_config(), path);
}

fn checkpoint_of(config: &RunConfig, path: &Path) {
    let cpu = CpuBackend::new();
    let ck = fresh_checkpoint(&cpu, &tiny_data(), config).unwrap();
    ck.save(&cpu, path, HashMap::new()).unwrap();
}

#[test]
fn the_inspector_rescores_the_caption_as_it_is_typed() {
    let dir = temp("inspect");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.safetensors");
    tiny_checkpoint(&path);
    let mut h = harness(Source::Checkpoint(path));
    assert_eq!(h.state().tab, Tab::Inspector);
    let tokens = |a: &CaptuneApp| -> Option<Vec<String>> {
        a.scored(captune::app::scorer::Asker::Inspector)
            .map(|t| t.iter().map(|s| s.token.clone()).collect())
    };
    step_until(&mut h, "the reference's scores", |a| tokens(a).is_some());
    let before = tokens(h.state()).unwrap();

    h.get_by_role(Role::TextInput).focus();
    h.run();
    h.key_combination_modifiers(egui::Modifiers::COMMAND, &[egui::Key::A]);
    h.get_by_role(Role::TextInput).type_text("a green circle");
    h.run();
    assert_eq!(h.state().panels.inspector.text, "a green circle");
    step_until(&mut h, "the typed caption's scores", |a| {
        tokens(a).is_some_and(|t| t != before)
    });
    assert_eq!(
        tokens(h.state()).unwrap(),
        ["a", "green", "circle", "<eos>"]
    );
    assert!(
        h.query_by_label("green").is_some(),
        "the table lists the typed words"
    );
    h.snapshot("inspector");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A captioner whose decoder came from a GPT-2: the inspector scores a
/// typed caption piece by piece, the pieces spelling the caption.
#[test]
fn the_inspector_scores_a_gpt2_captioner_by_its_pieces() {
    let dir = temp("inspect-gpt2");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt2.safetensors");
    let mut config = tiny_config();
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    config.model.decoder = Some(format!("hf:{}", gpt2.display()));
    checkpoint_of(&config, &path);
    let mut h = harness(Source::Checkpoint(path));
    let tokens = |a: &CaptuneApp| -> Option<Vec<String>> {
        a.scored(captune::app::scorer::Asker::Inspector)
            .map(|t| t.iter().map(|s| s.token.clone()).collect())
    };
    step_until(&mut h, "the reference's scores", |a| tokens(a).is_some());
    h.get_by_role(Role::TextInput).focus();
    h.run();
    h.key_combination_modifiers(egui::Modifiers::COMMAND, &[egui::Key::A]);
    h.get_by_role(Role::TextInput).type_text("a green circle");
    h.run();
    step_until(&mut h, "the typed caption's pieces", |a| {
        tokens(a).is_some_and(|t| t.concat() == "a green circle<|endoftext|>")
    });
    let pieces = tokens(h.state()).unwrap();
    assert!(
        pieces.len() > 4,
        "the tiny tokenizer splits words: {pieces:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A live run of a captioner whose decoder is a GPT-2, through every
/// panel: the loss curves and metrics fill, the samples panel shows the
/// decoded captions, and the per-token view explains a reference piece by
/// piece under SCST, its pieces spelling the caption and its end.
#[test]
fn a_live_gpt2_run_fills_every_panel() {
    // Enough for the tiny random GPT-2 to caption the tiny world.
    const EPOCHS: usize = 30;
    let out = temp("live-gpt2");
    let mut config = tiny_config();
    (config.train.epochs, config.train.lr) = (EPOCHS, 1e-2);
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    config.model.decoder = Some(format!("hf:{}", gpt2.display()));
    let mut h = harness(live_cpu_run(config, &out, true));
    step_until(&mut h, "the end of the run", |a| {
        a.live_status().is_some_and(|s| s.state == State::Finished)
    });
    step_until(&mut h, "the last records", |a| {
        a.history.metrics.last().map(|m| m.epoch) == Some(EPOCHS)
    });
    assert!(h.query_all_by_label_contains(", MLE ").count() > 0);
    let sample = h.state().history.samples.last().unwrap().clone();
    assert!(
        !sample.caption.is_empty() && sample.tokens.len() > 1,
        "the trained GPT-2 says something: {sample:?}"
    );
    let pieces: String = sample.tokens.iter().map(|t| t.token.as_str()).collect();
    assert_eq!(
        pieces.trim_end_matches("<|endoftext|>").trim(),
        sample.caption,
        "a sample's tokens are the pieces of its caption"
    );

    h.get_by_label("Samples").click_accesskit();
    h.run();
    assert_eq!(h.state().tab, Tab::Samples);
    for word in sample.caption.split_whitespace() {
        assert!(
            h.query_all_by_label(word).count() > 0,
            "the samples panel shows {word:?} of {:?}",
            sample.caption
        );
    }
    h.get_by_label("Metrics over time").click_accesskit();
    h.run();
    assert!(h.query_all_by_label_contains("CIDEr-D").count() > 0);

    h.get_by_label("Per-token view").click_accesskit();
    h.run();
    h.get_by_label("scst").click_accesskit();
    h.run();
    let explained = |a: &CaptuneApp| a.explained(captune::app::scorer::Asker::PerToken).cloned();
    step_until(&mut h, "SCST's explanation", |a| explained(a).is_some());
    let e = explained(h.state()).unwrap();
    let spelled: String = e.tokens.iter().map(|t| t.token.as_str()).collect();
    assert!(
        e.tokens.len() > 2 && spelled.ends_with("<|endoftext|>"),
        "{spelled:?}"
    );
    assert!(h.query_all_by_label_contains("advantage").count() > 0);
    std::fs::remove_dir_all(&out).unwrap();
}

/// A live run of a BLIP captioner (the tiny random folder, its image
/// tokens attached to the data as `app --config` attaches them): the loss
/// curves fill, the samples are its decoded pieces, and the inspector
/// scores a typed caption piece by piece, a word split into a piece and
/// its continuation, up to [SEP].
#[test]
fn a_live_blip_run_fills_its_panels_and_the_inspector_scores_pieces() {
    const EPOCHS: usize = 2;
    let out = temp("live-blip");
    let mut config = tiny_config();
    config.train.epochs = EPOCHS;
    let blip = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blip-tiny");
    config.model.decoder = Some(format!("hf:{}", blip.display()));
    let mut data = tiny_data();
    let b = CpuBackend::new();
    let progress = captune::progress::Progress::hidden();
    data.attach_image_tokens(&b, &blip, &progress).unwrap();
    let mut h = harness_on(data, live_cpu_run(config, &out, true));
    step_until(&mut h, "the end of the run", |a| {
        a.live_status().is_some_and(|s| s.state == State::Finished)
    });
    step_until(&mut h, "the last records", |a| {
        a.history.metrics.last().map(|m| m.epoch) == Some(EPOCHS)
    });
    assert!(h.query_all_by_label_contains(", MLE ").count() > 0);
    let sample = h.state().history.samples.last().unwrap().clone();
    let pieces: Vec<&str> = sample.tokens.iter().map(|t| t.token.as_str()).collect();
    assert!(
        pieces.iter().all(|p| !p.is_empty()),
        "a sample's tokens are WordPiece pieces: {pieces:?}"
    );
    inspector_scores_as(
        &mut h,
        "two red balls",
        &["two", "red", "ball", "##s", "[SEP]"],
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// Opens the inspector, waits for the reference's scores, types `caption`
/// over it, and waits until the inspector scores it as `tokens`.
fn inspector_scores_as(h: &mut Harness<'_, CaptuneApp>, caption: &str, tokens: &[&str]) {
    let scores = |a: &CaptuneApp| -> Option<Vec<String>> {
        a.scored(captune::app::scorer::Asker::Inspector)
            .map(|t| t.iter().map(|s| s.token.clone()).collect())
    };
    h.get_by_label("Inspector").click_accesskit();
    h.run();
    step_until(h, "the reference's scores", |a| scores(a).is_some());
    h.get_by_role(Role::TextInput).focus();
    h.run();
    h.key_combination_modifiers(egui::Modifiers::COMMAND, &[egui::Key::A]);
    h.get_by_role(Role::TextInput).type_text(caption);
    h.run();
    step_until(h, "the typed caption's tokens", |a| {
        scores(a).is_some_and(|t| t == tokens)
    });
}

/// A live run of an LSTM captioner (`decoder = "lstm:fc"`): the loss
/// curves and samples fill, and the inspector scores a typed caption word
/// by word, up to <eos>.
#[test]
fn a_live_lstm_run_fills_its_panels_and_the_inspector_scores_words() {
    const EPOCHS: usize = 2;
    let out = temp("live-lstm");
    let mut config = tiny_config();
    config.train.epochs = EPOCHS;
    config.model.decoder = Some("lstm:fc".into());
    let mut h = harness_on(tiny_data(), live_cpu_run(config, &out, true));
    step_until(&mut h, "the end of the run", |a| {
        a.live_status().is_some_and(|s| s.state == State::Finished)
    });
    step_until(&mut h, "the last records", |a| {
        a.history.metrics.last().map(|m| m.epoch) == Some(EPOCHS)
    });
    assert!(h.query_all_by_label_contains(", MLE ").count() > 0);
    assert!(!h.state().history.samples.is_empty(), "samples were logged");
    inspector_scores_as(&mut h, "a red circle", &["a", "red", "circle", "<eos>"]);
    std::fs::remove_dir_all(&out).unwrap();
}

fn log_line(step: usize, objective: &str, mle: f64, smile: f64) -> String {
    format!(
        r#"{{"step":{step},"epoch":1,"objective":"{objective}","loss":{mle},"mle":{mle},"smile":{smile},"lr":0.001,"grad_norm":1.0,"tokens_per_s":1000.0}}"#
    )
}

fn append(dir: &Path, file: RecordFile, lines: &[String]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file.file_name()))
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

#[test]
fn following_a_run_folder_fills_every_panel_as_it_grows() {
    let dir = temp("follow");
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = (1..=10)
        .map(|s| log_line(s * 10, "mle", 4.0 / s as f64, 2.0 / s as f64))
        .collect();
    append(&dir, RecordFile::Log, &lines);
    let mut h = harness(Source::Follow(dir.clone()));
    step_until(&mut h, "the first lines", |a| a.history.losses.len() == 10);

    // SMILE takes over: the curves gain points and a switch.
    let lines: Vec<String> = (11..=20)
        .map(|s| log_line(s * 10, "smile", 4.0 / s as f64 + 0.5, 1.0 / s as f64))
        .collect();
    append(&dir, RecordFile::Log, &lines);
    step_until(&mut h, "the appended lines", |a| {
        a.history.losses.len() == 20
    });
    assert_eq!(h.state().history.switches.len(), 2);
    h.snapshot("follow_losses");

    let val_image = {
        let data = tiny_data();
        let i = data.items(captune::data::Split::Val)[0];
        data.data.items[i].id.clone()
    };
    append(
        &dir,
        RecordFile::Metrics,
        &[
            r#"{"epoch":1,"step":100,"images":4,"mean_length":6.5,"div1":0.4,"div2":0.6,"mbleu4":0.5,"vocabulary_usage":12,"CIDEr-D":0.2,"fact_precision":0.9,"fact_recall":0.3}"#.into(),
            r#"{"epoch":2,"step":200,"images":4,"mean_length":9.25,"div1":0.5,"div2":0.7,"mbleu4":0.3,"vocabulary_usage":15,"CIDEr-D":0.15,"fact_precision":0.8,"fact_recall":0.45}"#.into(),
        ],
    );
    append(
        &dir,
        RecordFile::Samples,
        &[format!(
            r#"{{"epoch":2,"step":200,"image_id":"{val_image}","caption":"a zebra circle","tokens":[],"samples":["a circle","two zebra squares","a red circle","circle","a big circle"]}}"#
        )],
    );
    step_until(&mut h, "metrics and samples", |a| {
        a.history.metrics.len() == 2 && a.history.samples.len() == 1
    });
    h.get_by_label("Metrics over time").click();
    h.run();
    assert!(h.query_by_label("mean length: 9.250").is_some());
    h.snapshot("follow_metrics");
    h.get_by_label("Samples").click();
    h.run();
    // In the greedy caption and in one sample; the references never say it.
    assert_eq!(h.query_all_by_label("zebra").count(), 2);
    // The shapes world's captions are checked fact by fact.
    for mark in FactMark::ALL {
        assert!(h.query_by_label(mark.meaning()).is_some(), "{mark:?}");
    }
    assert!(
        h.query_by_label_contains("no reference of the image uses")
            .is_none()
    );
    h.snapshot("follow_samples");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run that PyTorch trained in two processes under torchrun (the
/// package in `python/`, skipped where python3 has no torch) fills the
/// loss curves when followed, as captune's own runs do.
#[test]
fn following_a_torchrun_run_fills_the_loss_curves() {
    let Some(python) = common::python_with_torch() else {
        return;
    };
    let dir = temp("follow-torchrun");
    let out = std::process::Command::new(python)
        .args(["-m", "tests.test_ddp"])
        .arg(&dir)
        .current_dir(common::python_dir())
        .env("CAPTUNE_BIN", env!("CARGO_BIN_EXE_captune"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.join("log.jsonl")).unwrap();
    let lines = log.lines().count();
    assert!(lines >= 2, "{log}");
    let mut h = harness(Source::Follow(dir.clone()));
    step_until(&mut h, "the run's log lines", |a| {
        a.history.losses.len() == lines
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// On a data set without scenes, no fact can be checked: the samples
/// panel highlights the words no reference uses, and says so.
#[test]
fn without_scenes_the_samples_panel_says_it_highlights_words_no_reference_uses() {
    let dir = temp("follow-no-scenes");
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = tiny_data();
    for item in &mut data.data.items {
        item.extensions.clear();
    }
    let val_image = data.data.items[data.items(captune::data::Split::Val)[0]]
        .id
        .clone();
    append(
        &dir,
        RecordFile::Samples,
        &[format!(
            r#"{{"epoch":1,"step":10,"image_id":"{val_image}","caption":"a zebra circle","tokens":[],"samples":["a circle"]}}"#
        )],
    );
    let mut h = harness_on(data, Source::Follow(dir.clone()));
    step_until(&mut h, "the samples", |a| a.history.samples.len() == 1);
    h.get_by_label("Samples").click();
    h.run();
    assert!(
        h.query_by_label_contains("no reference of the image uses")
            .is_some()
    );
    assert!(h.query_by_label(FactMark::Absent.meaning()).is_none());
    assert_eq!(h.query_all_by_label("zebra").count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sequence_level_run_gets_its_rewards_diversity_and_samples_plots() {
    let dir = temp("follow-scst");
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = (1..=10)
        .map(|s| {
            let r = 1.0 + s as f64 / 10.0;
            format!(
                r#"{{"step":{},"epoch":1,"objective":"scst (samples: 5)","loss":-0.2,"reward":{r},"baseline":{},"advantage_spread":0.5,"entropy":0.8,"sample_length":9.0,"div1":0.4,"div2":{},"mbleu4":0.25,"lr":0.00005,"grad_norm":1.0,"tokens_per_s":1000.0}}"#,
                s * 10,
                r + 0.1,
                0.7 - s as f64 / 100.0
            )
        })
        .collect();
    append(&dir, RecordFile::Log, &lines);
    let mut h = harness(Source::Follow(dir.clone()));
    step_until(&mut h, "the log", |a| a.history.losses.len() == 10);
    h.run();
    // The objective's groups, each a plot of its own, from the log alone.
    for title in [
        "rewards (per sampled caption)",
        "diversity of each image's samples",
        "samples: entropy (nats per step), length (words), repetition",
    ] {
        assert!(
            h.query_by_label(title).is_some(),
            "no plot titled {title:?}"
        );
    }
    for legend in [
        "reward",
        "baseline",
        "advantage spread",
        "div2",
        "mbleu4",
        "sample length",
    ] {
        assert!(
            h.query_all_by_label(legend).count() > 0,
            "no legend entry {legend:?}"
        );
    }
    h.snapshot("follow_rewards");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A collapse provoked on purpose in the app: SCST at a rate far too high
/// for fine-tuning (the knob set by hand over the objective's fine-tuning
/// rate), from a captioner trained briefly with MLE. The live run's note
/// gives the collapse guard's warning with its advice.
#[test]
fn a_live_run_says_when_its_captions_collapse() {
    let dir = temp("collapse");
    std::fs::create_dir_all(&dir).unwrap();
    let cpu = CpuBackend::new();
    let data = tiny_data();
    let mut warm = tiny_config();
    (warm.train.epochs, warm.train.lr) = (20, 3e-3);
    (warm.train.eval_images, warm.train.sample_images) = (0, 0);
    let mut ck = fresh_checkpoint(&cpu, &data, &warm).unwrap();
    let (mut trainer, start_run) =
        common::new_run(&cpu, &mut ck, &data, &warm, "app-collapse-start", None);
    while !trainer.finished() {
        trainer
            .train_batch(&cpu, |_| captune::captioner::records::Flow::Continue)
            .unwrap();
    }
    drop(trainer);
    std::fs::remove_dir_all(start_run).unwrap();
    let init = dir.join("mle.safetensors");
    ck.save(&cpu, &init, HashMap::new()).unwrap();
    let mut config = tiny_config();
    config.train.objective = "scst".into();
    let mut h = harness(Source::Train(Box::new(TrainSetup {
        device: DeviceChoice::Cpu,
        config,
        out: dir.join("run"),
        init: Some(init),
        retriever: None,
        autostart: false,
    })));
    // Opened with --init, the knob holds SCST's fine-tuning rate.
    assert_eq!(h.state().training.knobs.lr, 5e-5);
    h.state_mut().training.knobs.lr = 0.05;
    h.get_by_label("Start").click_accesskit();
    step_until(&mut h, "the collapse warning", |a| {
        a.live_status().is_some_and(|s| s.note.contains("collaps"))
    });
    let note = h.state().live_status().unwrap().note;
    assert!(
        note.contains("--lr"),
        "the advice names a lower rate: {note}"
    );
    h.run();
    assert!(
        h.query_all_by_label_contains("collaps").count() > 0,
        "{note}"
    );
    // The guard stops the run, which still writes its last records: its
    // folder goes once the run is over.
    step_until(&mut h, "the stopped run", |a| {
        a.live_status()
            .is_some_and(|s| matches!(s.state, State::Stopped | State::Finished | State::Failed(_)))
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_per_token_view_explains_a_reference_under_each_rewarding_objective() {
    let dir = temp("per-token-reward");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.safetensors");
    tiny_checkpoint(&path);
    let mut h = harness(Source::Checkpoint(path));
    // Clicked through accesskit, not at the node's position: in a clean
    // checkout's CI run a pointer click at the tab's last laid-out
    // position landed on "Loss curves".
    h.get_by_label("Per-token view").click_accesskit();
    h.run();
    assert_eq!(h.state().tab, Tab::PerToken);
    // The registry's objectives that explain a caption, and only those.
    for o in captune::captioner::objectives::OBJECTIVES {
        let offered = h.query_by_label(o.name).is_some();
        assert_eq!(offered, o.explains, "{} offered: {offered}", o.name);
    }
    h.get_by_label("scst").click_accesskit();
    h.run();
    assert_eq!(h.state().panels.per_token.explain_under, Some("scst"));
    let explained = |a: &CaptuneApp| {
        let e = a.explained(captune::app::scorer::Asker::PerToken)?;
        Some(e.clone())
    };
    step_until(&mut h, "the reward's explanation", |a| {
        explained(a).is_some()
    });
    let e = explained(h.state()).unwrap();
    // SCST's default baseline is the greedy caption's reward, shown first.
    let greedy = e.compared_with.first().unwrap();
    assert_eq!(greedy.kind, "greedy");
    assert_eq!(greedy.figures.get("reward"), Some(e.baseline));
    assert!(
        e.reward > 0.0,
        "a reference scores against its own image's references"
    );
    assert!(e.tokens.len() > 1);
    assert!(h.query_all_by_label_contains("advantage").count() > 0);

    // DiscriTune without the retriever says what it needs; with one, the
    // caption's rank among a batch of candidates.
    h.get_by_label("discritune").click_accesskit();
    step_until(&mut h, "the missing retriever", |a| {
        a.scorer_error(captune::app::scorer::Asker::PerToken)
            .is_some_and(|e| e.contains("--retriever"))
    });
    let cpu = CpuBackend::new();
    let retriever = dir.join("retriever.safetensors");
    common::tiny_retriever_checkpoint(&cpu, &tiny_data(), 4)
        .save(&cpu, &retriever, HashMap::new())
        .unwrap();
    h.state().judge_with(retriever);
    step_until(&mut h, "DiscriTune's explanation", |a| {
        explained(a).is_some_and(|e| e.objective.starts_with("discritune"))
    });
    let e = explained(h.state()).unwrap();
    common::assert_discritune_explanation(&serde_json::to_value(&e).unwrap());
    assert!(h.query_all_by_label_contains("rank").count() > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A live DiscriTune run in the app with a Hugging Face CLIP as its
/// retriever (`clip:FOLDER`), on the tiny world's CLIP image embeddings:
/// it trains to the end, its metrics over time hold CLIP-S and
/// RefCLIP-S, and the per-token view ranks a caption among candidates
/// with the CLIP as the judge.
#[test]
fn a_live_run_with_a_clip_retriever_fills_its_panels() {
    use captune::retriever::frozen::{CLIP_PREFIX, FrozenRetriever};
    let cpu = CpuBackend::new();
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-tiny");
    let clip = PathBuf::from(format!("{CLIP_PREFIX}{}", folder.display()));
    let mut data = tiny_data();
    let mut frozen = FrozenRetriever::load(&cpu, &clip, 16).unwrap();
    let hidden = captune::progress::Progress::hidden();
    data.features = frozen
        .embed_dataset(&cpu, &mut data.data, &hidden)
        .unwrap()
        .0;
    data.dim = frozen.model.config.embed_dim;
    let out = temp("live-clip");
    let mut config = tiny_config();
    config.train.epochs = 2;
    config.train.objective = "discritune".into();
    let source = Source::Train(Box::new(TrainSetup {
        device: DeviceChoice::Cpu,
        config,
        out: out.clone(),
        init: None,
        retriever: Some(clip.clone()),
        autostart: true,
    }));
    let mut h = harness_on(data, source);
    step_until(&mut h, "the end of the run", |a| {
        a.live_status().is_some_and(|s| s.state == State::Finished)
    });
    step_until(&mut h, "the last records", |a| {
        a.history.metrics.last().map(|m| m.epoch) == Some(2)
    });
    h.get_by_label("Metrics over time").click_accesskit();
    h.run();
    // Each plot is titled "title: newest value".
    for (title, plots) in [
        ("CLIP-S: ", 2),
        ("RefCLIP-S: ", 1),
        ("self-retrieval R@1: ", 1),
    ] {
        let found = h.query_all_by_label_contains(title).count();
        assert!(found >= plots, "{found} plots titled {title:?}");
    }
    h.get_by_label("Per-token view").click_accesskit();
    h.run();
    h.state().judge_with(clip);
    h.get_by_label("discritune").click_accesskit();
    let explained = |a: &CaptuneApp| a.explained(captune::app::scorer::Asker::PerToken).cloned();
    step_until(&mut h, "DiscriTune's explanation", |a| {
        explained(a).is_some_and(|e| e.objective.starts_with("discritune"))
    });
    let e = explained(h.state()).unwrap();
    let rank = e.figures.get("rank").unwrap();
    assert!(
        rank >= 1.0 && rank <= e.figures.get("candidates").unwrap(),
        "{e:?}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}
