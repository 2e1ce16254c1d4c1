//! Progress of long jobs (loading images, embedding, decoding, validation):
//! a bar on the terminal for the commands, or hidden bars whose position
//! the desktop app reads and draws while it loads.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::{Arc, Mutex};

/// Hands out one bar per job; the latest one is the job in progress.
#[derive(Clone)]
pub struct Progress {
    /// Terminal bars share one display, so a validation bar can show below
    /// the training bar; `None` hides every bar.
    multi: Option<MultiProgress>,
    current: Arc<Mutex<Option<ProgressBar>>>,
}

/// A job's state, as the app shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobState {
    pub what: String,
    pub done: u64,
    pub total: u64,
}

impl Progress {
    /// Bars on standard error (drawn only when it is a terminal).
    pub fn terminal() -> Progress {
        Progress {
            multi: Some(MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            current: Arc::default(),
        }
    }

    /// Bars that are never drawn; `current` still reports them.
    pub fn hidden() -> Progress {
        Progress {
            multi: None,
            current: Arc::default(),
        }
    }

    /// A new bar of `total` units for the job `what` (e.g. "embedding 22000 images").
    pub fn start(&self, what: &str, total: u64) -> ProgressBar {
        let bar = match &self.multi {
            Some(multi) => multi.add(ProgressBar::new(total)),
            None => ProgressBar::hidden(),
        };
        // A hidden bar starts without a length.
        bar.set_length(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} {bar:30} {pos}/{len} {elapsed_precise} (eta {eta})",
            )
            .expect("a valid template"),
        );
        bar.set_message(what.to_string());
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar.clone());
        bar
    }

    /// The latest job and how far it got.
    pub fn current(&self) -> Option<JobState> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().map(|bar| JobState {
            what: bar.message(),
            done: bar.position(),
            total: bar.length().unwrap_or(0),
        })
    }

    /// Runs `f` with the bars cleared from the terminal, for printing lines.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.multi {
            Some(multi) => multi.suspend(f),
            None => f(),
        }
    }
}
