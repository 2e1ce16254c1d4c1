//! A training run's folder: what it holds, starting a run in it (never
//! over another run unless asked), saving its state, and bringing it back
//! after the last process ended in any way, a SIGKILL included.
//!
//! - `config.toml`: the run's configuration;
//! - `log.jsonl`, `samples.jsonl`, `metrics.jsonl`: one JSON record a line,
//!   each with the `step` it was written at;
//! - `checkpoint.safetensors` (the model) and `optimizer.safetensors`
//!   (AdamW's moments and the position in the run): the state a resume
//!   starts from, written when the run starts and after each epoch.
//!
//! How a kill at any moment is survived:
//! - a record is appended with one write of the whole line, so a kill
//!   leaves at most one last line without its newline, which resuming drops;
//! - the two state files are each written whole under a `.next` name, then
//!   the optimizer's is renamed into place, then the checkpoint's. Both
//!   carry the step in their metadata: a resume that finds the optimizer
//!   ahead of the checkpoint finishes the second rename, and any other
//!   `.next` file is an unfinished save and is removed;
//! - an epoch's samples and metrics are written before its state is saved,
//!   and resuming drops every record after the saved step, so an epoch
//!   cut short is trained and validated again, exactly as before.

use super::Checkpoint;
use super::collapse::GuardState;
use crate::backend::Backend;
use crate::optim::AdamW;
use crate::tensorfile;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a run is and what it writes.
#[derive(Clone, Debug)]
pub struct RunFolder {
    pub dir: PathBuf,
}

pub const CONFIG: &str = "config.toml";
pub const LOG: &str = "log.jsonl";
pub const SAMPLES: &str = "samples.jsonl";
pub const METRICS: &str = "metrics.jsonl";
const CHECKPOINT: &str = "checkpoint.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const RECORDS: [&str; 3] = [LOG, SAMPLES, METRICS];
/// Every file a run writes; a folder holding any of them holds a run.
const RUN_FILES: [&str; 6] = [CONFIG, LOG, SAMPLES, METRICS, CHECKPOINT, OPTIMIZER];

/// Metadata keys of the position in the run, in both state files.
const STEP_KEY: &str = "step";
const EPOCH_KEY: &str = "epoch";
const ADAMW_STEP_KEY: &str = "adamw_step";
/// Optimizer metadata key of the objective's own state ([`ObjectiveState`]).
const OBJECTIVE_STATE_KEY: &str = "objective_state";

/// What training an objective carries from step to step: the objective's
/// own state (DiscriTune's running mean of rewards) and what the collapse
/// guard has seen; saved with the optimizer so that a resumed run
/// continues exactly; JSON in the optimizer file's metadata.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ObjectiveState {
    /// The objective it belongs to: another one starts afresh.
    pub objective: String,
    pub values: Vec<f64>,
    #[serde(default)]
    pub guard: GuardState,
}

/// How a training run begins in its folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// A new run; the folder must not hold one.
    New,
    /// A new run in place of the one the folder holds (its files are deleted).
    Overwrite,
    /// The folder's run, from its saved state.
    Resume,
}

/// Where a run stands: steps taken and epochs completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub step: usize,
    pub epoch: usize,
}

impl RunFolder {
    pub fn new(dir: impl Into<PathBuf>) -> RunFolder {
        RunFolder { dir: dir.into() }
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join(CHECKPOINT)
    }

    pub fn optimizer(&self) -> PathBuf {
        self.dir.join(OPTIMIZER)
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join(CONFIG)
    }

    fn next(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".next");
        PathBuf::from(name)
    }

    /// `preferred`, or when something is already there, the first of
    /// `preferred-2`, `preferred-3`... that is free: for default output
    /// folders that a second run must not take over.
    pub fn free(preferred: &Path) -> PathBuf {
        if !preferred.exists() {
            return preferred.to_path_buf();
        }
        (2..)
            .map(|n| {
                let mut name = preferred.as_os_str().to_owned();
                name.push(format!("-{n}"));
                PathBuf::from(name)
            })
            .find(|p| !p.exists())
            .expect("some numbered folder is free")
    }

    /// Whether a run was started in this folder.
    pub fn holds_run(&self) -> bool {
        RUN_FILES.iter().any(|f| self.dir.join(f).exists())
    }

    /// Refuses a folder that holds a run unless `overwrite`; changes nothing.
    pub fn check_free(&self, overwrite: bool) -> Result<()> {
        if self.holds_run() && !overwrite {
            bail!(
                "{} already holds a training run; continue it with `--resume`, start it again \
                 with `--overwrite` (its logs and checkpoints are deleted), or choose another --out",
                self.dir.display()
            );
        }
        Ok(())
    }

    /// Makes the folder ready for a new run. A folder that holds a run is
    /// refused unless `overwrite`, which removes that run's files (and
    /// nothing else in the folder).
    pub fn start(&self, overwrite: bool) -> Result<()> {
        self.check_free(overwrite)?;
        for f in RUN_FILES {
            let path = self.dir.join(f);
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("{}: cannot remove", path.display()))?;
            }
        }
        self.remove_leftovers()?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("{}: cannot create the run folder", self.dir.display()))
    }

    /// Removes what a killed process may have left of an unfinished write:
    /// `*.next` state files and the temporary files of atomic writes.
    fn remove_leftovers(&self) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = RUN_FILES
                .iter()
                .any(|f| name.starts_with(f.split('.').next().expect("a stem")));
            if ours && (name.ends_with(".next") || name.contains(".tmp-")) {
                std::fs::remove_file(entry.path())
                    .with_context(|| format!("{}: cannot remove", entry.path().display()))?;
            }
        }
        Ok(())
    }

    /// Appends one record as one line, written at once.
    pub fn append(&self, file: &str, record: &impl Serialize) -> Result<()> {
        let path = self.dir.join(file);
        let mut line = serde_json::to_string(record)?;
        line.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("{}: cannot append", path.display()))?;
        crate::killpoint::here("record", || {
            // A test kills the process here, half a line written.
            let _ = f.write_all(&line.as_bytes()[..line.len() / 2]);
        });
        f.write_all(line.as_bytes())
            .with_context(|| format!("{}: cannot append", path.display()))
    }

    /// Saves the model and the optimizer at `position`, both or neither
    /// (see the module's comment). `metadata` goes into the checkpoint.
    pub fn save_state<B: Backend>(
        &self,
        b: &B,
        ck: &Checkpoint<B>,
        opt: &AdamW<B>,
        objective: &ObjectiveState,
        position: Position,
        mut metadata: HashMap<String, String>,
    ) -> Result<()> {
        metadata.extend(position_metadata(position));
        let (checkpoint, optimizer) = (self.checkpoint(), self.optimizer());
        ck.save(b, &Self::next(&checkpoint), metadata)?;
        crate::killpoint::here("checkpoint", || {});
        save_optimizer(b, opt, objective, &Self::next(&optimizer), position)?;
        rename(&Self::next(&optimizer), &optimizer)?;
        crate::killpoint::here("commit", || {});
        rename(&Self::next(&checkpoint), &checkpoint)
    }

    /// Brings the folder back to its last saved state after any ending of
    /// the process that wrote it: finishes or removes an unfinished save,
    /// and drops every record written after the saved step (and a last line
    /// cut short). Returns the position to continue from.
    pub fn recover(&self) -> Result<Position> {
        let (checkpoint, optimizer) = (self.checkpoint(), self.optimizer());
        if !optimizer.is_file() {
            bail!(
                "{}: no saved state to resume from (it needs {CHECKPOINT} and {OPTIMIZER}); \
                 was this folder written by `captune train`? Start a new run with `--overwrite`",
                self.dir.display()
            );
        }
        let position = saved_position(&optimizer)?;
        let at_position =
            |path: &Path| path.is_file() && read_position(path).ok().flatten() == Some(position);
        if !at_position(&checkpoint) {
            // The optimizer was renamed into place, the checkpoint not yet.
            let next = Self::next(&checkpoint);
            if !at_position(&next) {
                bail!(
                    "{}: the optimizer is at step {} but no checkpoint of that step is there; \
                     start a new run with `--overwrite`",
                    self.dir.display(),
                    position.step
                );
            }
            rename(&next, &checkpoint)?;
        }
        self.remove_leftovers()?;
        for f in RECORDS {
            truncate_records(&self.dir.join(f), position.step)?;
        }
        Ok(position)
    }

    /// The position of the saved state, without changing anything.
    pub fn position(&self) -> Result<Position> {
        saved_position(&self.optimizer())
    }
}

/// The position a state file must record.
fn saved_position(path: &Path) -> Result<Position> {
    read_position(path)?.with_context(|| {
        format!(
            "{}: no {STEP_KEY:?} and {EPOCH_KEY:?} in its metadata; not written by `captune train`",
            path.display()
        )
    })
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to)
        .with_context(|| format!("cannot rename {} to {}", from.display(), to.display()))
}

fn position_metadata(p: Position) -> [(String, String); 2] {
    [
        (STEP_KEY.into(), p.step.to_string()),
        (EPOCH_KEY.into(), p.epoch.to_string()),
    ]
}

/// The position a state file records; `None` for a file without one (a
/// checkpoint written by an older captune).
fn read_position(path: &Path) -> Result<Option<Position>> {
    let meta = tensorfile::read_metadata(path)?;
    let number = |key: &str| -> Result<Option<usize>> {
        meta.get(key)
            .map(|v| {
                v.parse().with_context(|| {
                    format!("{}: metadata {key:?} is not a number", path.display())
                })
            })
            .transpose()
    };
    Ok(match (number(STEP_KEY)?, number(EPOCH_KEY)?) {
        (Some(step), Some(epoch)) => Some(Position { step, epoch }),
        _ => None,
    })
}

/// Keeps the complete records of `path` written at or before `step`.
fn truncate_records(path: &Path, step: usize) -> Result<()> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(());
    };
    // A damaged line may not even be UTF-8; it is dropped like any other.
    let text = String::from_utf8_lossy(&bytes);
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    let kept: String = text[..complete]
        .split_inclusive('\n')
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get(STEP_KEY).and_then(serde_json::Value::as_u64))
                .is_some_and(|s| s as usize <= step)
        })
        .collect();
    if kept.as_bytes() != bytes.as_slice() {
        tensorfile::write_atomic(path, kept.as_bytes())?;
    }
    Ok(())
}

fn save_optimizer<B: Backend>(
    b: &B,
    opt: &AdamW<B>,
    objective: &ObjectiveState,
    path: &Path,
    position: Position,
) -> Result<()> {
    let (t, m, v) = opt.state(b);
    let names: Vec<String> = (0..m.len())
        .flat_map(|i| [format!("m.{i}"), format!("v.{i}")])
        .collect();
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = names
        .iter()
        .zip(m.iter().zip(&v).flat_map(|(a, b)| [a, b]))
        .map(|(n, d)| (n.as_str(), vec![d.len()], d.as_slice()))
        .collect();
    let mut metadata: HashMap<String, String> = position_metadata(position).into();
    metadata.insert(ADAMW_STEP_KEY.into(), t.to_string());
    if *objective != ObjectiveState::default() {
        let json = serde_json::to_string(objective).expect("an objective state serialises");
        metadata.insert(OBJECTIVE_STATE_KEY.into(), json);
    }
    tensorfile::write(path, &tensors, metadata)
}

/// Restores AdamW's moments from the run's optimizer file, and returns
/// the objective's state saved with them, if any.
pub fn load_optimizer<B: Backend>(
    b: &B,
    opt: &mut AdamW<B>,
    path: &Path,
) -> Result<Option<ObjectiveState>> {
    let mut file = tensorfile::read(path)?;
    let t: u64 = file.meta(ADAMW_STEP_KEY, path)?.parse().with_context(|| {
        format!(
            "{}: metadata {ADAMW_STEP_KEY:?} is not a number",
            path.display()
        )
    })?;
    let (_, m0, _) = opt.state(b);
    let (mut m, mut v) = (Vec::new(), Vec::new());
    for (i, want) in m0.iter().enumerate() {
        for (name, into) in [(format!("m.{i}"), &mut m), (format!("v.{i}"), &mut v)] {
            let t = file.take(&name, path)?;
            if t.data.len() != want.len() {
                bail!(
                    "{}: tensor {name:?} has {} values but parameter {i} has {}; the optimizer \
                     state belongs to another model",
                    path.display(),
                    t.data.len(),
                    want.len()
                );
            }
            into.push(t.data);
        }
    }
    let objective = file
        .metadata
        .get(OBJECTIVE_STATE_KEY)
        .map(|json| {
            serde_json::from_str::<ObjectiveState>(json).map_err(|e| {
                anyhow::anyhow!(
                    "{}: metadata {OBJECTIVE_STATE_KEY:?} is not an objective's state ({e}); \
                     start a new run from its checkpoint (`captune train --init`)",
                    path.display()
                )
            })
        })
        .transpose()?;
    opt.restore(b, t, &m, &v);
    Ok(objective)
}
