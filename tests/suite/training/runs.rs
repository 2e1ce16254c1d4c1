//! Safe runs with the real `captune` binary: a run folder is never taken
//! over silently, `--resume --epochs N` trains N more epochs, and a
//! training process killed with SIGKILL at any moment leaves a folder
//! that `--resume` continues to exactly the uninterrupted run's result.

use captune::tensorfile;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common;

use common::TINY_WORLD_ARGS as WORLD;

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = crate::common::fresh_temp(name);
        std::fs::create_dir_all(&dir).unwrap();
        // The tiny preset, logging every step, for three epochs of three steps.
        let config = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/presets/tiny.toml"),
        )
        .unwrap()
        .replace("log_every = 5", "log_every = 1")
        .replace("epochs = 2", "epochs = 3");
        std::fs::write(dir.join("tiny3.toml"), config).unwrap();
        Scratch { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_captune"));
        // Run from the scratch folder, as an installed binary would be:
        // nothing may be read relative to the source tree.
        cmd.current_dir(&self.dir)
            .args(["--device", "cpu"])
            .args(args)
            .env("CAPTUNE_CACHE", self.dir.join("cache"))
            .env_remove("CAPTUNE_KILLPOINT")
            .env_remove("CAPTUNE_DEVICE");
        cmd
    }

    fn train_args(&self, out: &Path, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = ["train", "--out", out.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        if !extra.contains(&"--resume") {
            args.extend(["--config".to_string(), self.path("tiny3.toml")]);
        }
        args.extend(WORLD.iter().map(|s| s.to_string()));
        args
    }

    fn train(&self, out: &Path, extra: &[&str]) -> Output {
        let args = self.train_args(out, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(&args).output().unwrap()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn succeeded(out: &Output) {
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The JSON records of a run file, less the wall-clock speed.
fn records(run: &Path, file: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join(file))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: corrupt line {l:?}: {e}", file));
            v.as_object_mut().unwrap().remove("tokens_per_s");
            v
        })
        .collect()
}

fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let file = tensorfile::read(&run.join("checkpoint.safetensors")).unwrap();
    let mut w: Vec<(String, Vec<f32>)> =
        file.tensors.into_iter().map(|(k, t)| (k, t.data)).collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

#[test]
fn a_run_folder_is_never_taken_over_and_resume_adds_epochs() {
    let s = Scratch::new("runs-safe");
    let run = s.dir.join("run");
    let out = s.train(&run, &["--epochs", "1"]);
    succeeded(&out);
    assert!(
        !text(&out.stderr).contains("from the cache"),
        "the first start embeds"
    );
    let first = weights(&run);

    // A second run into the same folder is refused, naming both ways on.
    let out = s.train(&run, &["--epochs", "1"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(run.to_str().unwrap())
            && err.contains("--resume")
            && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(weights(&run), first, "the refused run changed nothing");

    // The README's example: resume a finished MLE run with SMILE for N more epochs.
    let out = s.train(&run, &["--resume", "--objective", "smile", "--epochs", "2"]);
    succeeded(&out);
    assert!(
        text(&out.stderr).contains("image embeddings from the cache"),
        "{}",
        text(&out.stderr)
    );
    let log = records(&run, "log.jsonl");
    let last = log.last().unwrap();
    assert_eq!(last["epoch"], 3, "1 epoch, then 2 more: {last}");
    assert_eq!(last["step"], 9);
    assert!(
        log.iter()
            .any(|l| l["objective"].as_str().unwrap().starts_with("smile"))
    );
    assert!(log[0]["objective"].as_str().unwrap().starts_with("mle"));
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("epochs = 3") && config.contains("objective = \"smile\""),
        "{config}"
    );

    // --overwrite starts again: the old records are gone.
    succeeded(&s.train(&run, &["--epochs", "1", "--overwrite"]));
    assert_eq!(records(&run, "log.jsonl").last().unwrap()["step"], 3);

    // Other commands refuse to write over a file too.
    let results = s.dir.join("results.json");
    std::fs::write(&results, "mine").unwrap();
    let ck = run.join("checkpoint.safetensors");
    let mut args = vec![
        "eval",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
    ];
    args.extend(WORLD);
    let out = s.command(&args).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--overwrite"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&results).unwrap(), "mine");
    let mut args = vec![
        "embed",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        results.to_str().unwrap(),
    ];
    args.extend(WORLD);
    let out = s.command(&args).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("--overwrite"));
    assert_eq!(std::fs::read_to_string(&results).unwrap(), "mine");
    let mut args = vec![
        "retriever",
        "train",
        "--out",
        results.to_str().unwrap(),
        "--epochs",
        "1",
    ];
    args.extend(WORLD);
    let out = s.command(&args).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("--overwrite"));
    assert_eq!(std::fs::read_to_string(&results).unwrap(), "mine");
    // A folder with something in it is not replaced by a generated world.
    let mut args = vec!["data", "shapes", "--out", s.dir.to_str().unwrap()];
    args.extend(WORLD);
    let out = s.command(&args).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("--overwrite"));
    assert_eq!(std::fs::read_to_string(&results).unwrap(), "mine");
}

/// Starts a run that stops at `point` (see src/killpoint.rs), kills it
/// with SIGKILL there, then resumes it to the end.
fn kill_then_resume(s: &Scratch, run: &Path, point: &str) {
    kill_then_resume_with(s, run, point, &[]);
}

/// The same, the run started with `extra` arguments.
fn kill_then_resume_with(s: &Scratch, run: &Path, point: &str, extra: &[&str]) {
    let args = s.train_args(run, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = s
        .command(&args)
        .env("CAPTUNE_KILLPOINT", point)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("killpoint") {
            break;
        }
    }
    assert!(
        seen.contains("killpoint"),
        "{point} was never reached:\n{seen}"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = s.train(run, &["--resume"]);
    assert!(
        out.status.success(),
        "resuming after a kill at {point}: {}",
        text(&out.stderr)
    );
}

#[test]
fn a_run_killed_anywhere_resumes_to_the_uninterrupted_result() {
    let s = Scratch::new("runs-kill");
    let whole = s.dir.join("whole");
    succeeded(&s.train(&whole, &[]));
    // Passes counted from the start: the state is saved once at the start
    // and after each epoch; a record is appended at each step and for each
    // sample and metrics line; atomic writes are config.toml's, then two
    // per save (the embeddings are cached by the first run).
    for point in [
        "batch:1",      // in the first epoch, before any epoch was saved
        "batch:5",      // in the middle of the second epoch
        "record:7",     // half a line written
        "validation:2", // between the samples and the metrics of epoch 2
        "checkpoint:3", // the checkpoint of epoch 2 written, not the optimizer
        "commit:3",     // the optimizer renamed into place, not the checkpoint
        "commit:1",     // the same in the save at the start
        "atomic:4",     // a temporary file written, not yet renamed (epoch 1's checkpoint)
    ] {
        let run = s.dir.join(point.replace(':', "-"));
        kill_then_resume(&s, &run, point);
        for file in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
            assert_eq!(
                records(&run, file),
                records(&whole, file),
                "{file} after a kill at {point}"
            );
        }
        assert_eq!(
            weights(&run),
            weights(&whole),
            "weights after a kill at {point}"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&run)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".next") || n.contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{point}: {leftovers:?}");
    }
}

/// The same for the objectives that generate their own captions: SCST
/// (samples and greedy captions drawn by step) and DiscriTune, whose
/// running-mean baseline of every earlier reward is saved with the state.
/// Killed in the second epoch, each resumes from the first epoch's end to
/// the uninterrupted run's log and weights.
#[test]
fn sequence_and_retrieval_runs_killed_mid_run_resume_exactly() {
    let s = Scratch::new("runs-kill-objectives");
    for objective in ["scst", "discritune"] {
        let extra = ["--objective", objective];
        let whole = s.dir.join(format!("{objective}-whole"));
        succeeded(&s.train(&whole, &extra));
        let run = s.dir.join(format!("{objective}-killed"));
        kill_then_resume_with(&s, &run, "batch:5", &extra);
        let log = records(&run, "log.jsonl");
        assert!(
            log.iter()
                .all(|l| l["objective"].as_str().unwrap().starts_with(objective)),
            "{log:?}"
        );
        assert!(log.iter().all(|l| l["baseline"].is_number()), "{log:?}");
        for file in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
            assert_eq!(
                records(&run, file),
                records(&whole, file),
                "{objective}: {file} after a kill at batch:5"
            );
        }
        assert_eq!(weights(&run), weights(&whole), "{objective}: weights");
    }
}
