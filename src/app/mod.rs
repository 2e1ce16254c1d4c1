//! The desktop app (`captune app`): a live view of caption training and a
//! per-token inspector of why MLE and SMILE punish a caption.
//!
//! Three sources feed the same panels: a run trained inside the app (a
//! background thread, [`live`]), a headless run folder followed as it
//! grows ([`follow`]), or a checkpoint opened for inspection only. Either
//! way the panels read a run folder's files into a [`History`], and a
//! worker thread scores captions on a CPU copy of the model
//! ([`scorer`]), so the UI thread never waits on training or on the GPU.

pub mod follow;
pub mod history;
pub mod live;
pub mod panels;
pub mod scorer;
mod thumbnails;
pub mod window;

use crate::captioner::explain::Explanation;
use crate::captioner::inspect::TokenScore;
use crate::captioner::run::RunConfig;
use crate::captioner::run_folder::RunFolder;
use crate::data::Split;
use crate::device::DeviceChoice;
use crate::source::embeddings::CaptionData;
use follow::RunFiles;
use history::History;
use live::{LiveRun, LiveSetup};
use panels::training::{Knobs, TrainingAction, TrainingPanel};
use panels::{InspectorPanel, Panels, View};
use scorer::{Asker, Scorer};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thumbnails::Thumbnails;

/// How often the run folder is read while a run is followed or trained.
const POLL: Duration = Duration::from_millis(250);

/// Training inside the app: the knobs start from `config`.
pub struct TrainSetup {
    pub device: DeviceChoice,
    pub config: RunConfig,
    pub out: PathBuf,
    pub init: Option<PathBuf>,
    pub retriever: Option<PathBuf>,
    /// Start at once instead of waiting for the Start button.
    pub autostart: bool,
}

pub enum Source {
    Train(Box<TrainSetup>),
    /// A run folder written by `captune train` (or by the app).
    Follow(PathBuf),
    /// A captioner checkpoint, for the per-token views only.
    Checkpoint(PathBuf),
}

/// The panels, one shown at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Losses,
    PerToken,
    Samples,
    Metrics,
    Inspector,
}

impl Tab {
    pub const ALL: [Tab; 5] = [
        Tab::Losses,
        Tab::PerToken,
        Tab::Samples,
        Tab::Metrics,
        Tab::Inspector,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Tab::Losses => "Loss curves",
            Tab::PerToken => "Per-token view",
            Tab::Samples => "Samples",
            Tab::Metrics => "Metrics over time",
            Tab::Inspector => "Inspector",
        }
    }

    /// `losses`, `per-token`, `samples`, `metrics` or `inspector`.
    pub fn parse(name: &str) -> Option<Tab> {
        Tab::ALL.into_iter().find(|t| t.key() == name)
    }

    pub fn key(self) -> &'static str {
        match self {
            Tab::Losses => "losses",
            Tab::PerToken => "per-token",
            Tab::Samples => "samples",
            Tab::Metrics => "metrics",
            Tab::Inspector => "inspector",
        }
    }
}

pub struct CaptuneApp {
    data: Arc<CaptionData>,
    /// The validation images' item indices.
    val: Vec<usize>,
    /// Item index by image id (records name images by id).
    by_id: HashMap<String, usize>,
    train: Option<TrainSetup>,
    pub training: TrainingPanel,
    live: Option<LiveRun>,
    files: Option<RunFiles>,
    pub history: History,
    last_poll: Option<Instant>,
    /// A problem reading the followed run folder, shown until it goes away.
    problem: Option<String>,
    scorer: Scorer,
    pub tab: Tab,
    thumbnails: Thumbnails,
    pub panels: Panels,
    /// Whether the panels paint their background. The window clears to
    /// the panel colour instead: a software renderer then shades each
    /// pixel once less per frame.
    pub paint_background: bool,
}

impl CaptuneApp {
    pub fn new(ctx: &egui::Context, data: Arc<CaptionData>, source: Source) -> CaptuneApp {
        let mut val = data.items(Split::Val);
        if val.is_empty() {
            val = (0..data.data.items.len()).collect();
        }
        let repaint = ctx.clone();
        let scorer = Scorer::start(Arc::clone(&data), move || repaint.request_repaint());
        let inspector = InspectorPanel {
            image: 0,
            text: val
                .first()
                .and_then(|&i| data.data.items[i].captions.first())
                .map(|c| c.raw.clone())
                .unwrap_or_default(),
        };
        let mut app = CaptuneApp {
            training: TrainingPanel {
                knobs: Knobs::of(
                    &RunConfig::preset("shapes").expect("the shapes preset parses"),
                    false,
                ),
            },
            by_id: (0..data.data.items.len())
                .map(|i| (data.data.items[i].id.clone(), i))
                .collect(),
            data,
            val,
            train: None,
            live: None,
            files: None,
            history: History::default(),
            last_poll: None,
            problem: None,
            scorer,
            tab: Tab::Losses,
            thumbnails: Thumbnails::default(),
            panels: Panels {
                inspector,
                ..Panels::default()
            },
            paint_background: true,
        };
        match source {
            Source::Train(setup) => {
                app.training.knobs = Knobs::of(&setup.config, setup.init.is_some());
                let autostart = setup.autostart;
                app.train = Some(*setup);
                if autostart {
                    app.start_training(ctx);
                }
            }
            Source::Follow(dir) => app.files = Some(RunFiles::new(&dir)),
            Source::Checkpoint(path) => {
                app.scorer.load(path);
                app.tab = Tab::Inspector;
            }
        }
        app
    }

    /// The live run's status, when one was started.
    pub fn live_status(&self) -> Option<live::LiveStatus> {
        self.live.as_ref().map(LiveRun::status)
    }

    /// The per-token scores a panel shows, once the scorer has answered
    /// its newest request.
    pub fn scored(&self, asker: Asker) -> Option<&[TokenScore]> {
        if !self.scorer.is_current(asker) {
            return None;
        }
        self.scorer
            .answer(asker)?
            .result
            .as_ref()
            .ok()
            .map(Vec::as_slice)
    }

    /// The explanation a panel shows (when it asked for one), once the
    /// scorer has answered its newest request.
    pub fn explained(&self, asker: Asker) -> Option<&Explanation> {
        if !self.scorer.is_current(asker) {
            return None;
        }
        self.scorer.answer(asker)?.explained.as_ref()?.as_ref().ok()
    }

    /// Why the newest explanation a panel asked for could not be made.
    pub fn scorer_error(&self, asker: Asker) -> Option<&str> {
        if !self.scorer.is_current(asker) {
            return None;
        }
        let explained = self.scorer.answer(asker)?.explained.as_ref()?;
        explained.as_ref().err().map(String::as_str)
    }

    /// The retriever that explanations needing one judge with: the one
    /// that made the app's image embeddings.
    pub fn judge_with(&self, retriever: PathBuf) {
        self.scorer.judge_with(retriever);
    }

    /// Whether a run is training or followed (the app then keeps polling).
    fn is_active(&self) -> bool {
        self.files.is_some()
    }

    fn start_training(&mut self, ctx: &egui::Context) {
        let Some(setup) = &self.train else {
            return;
        };
        let mut config = setup.config.clone();
        let k = &self.training.knobs;
        let t = &mut config.train;
        (t.objective, t.settings, t.lr, t.batch, t.epochs) = (
            k.objective.clone(),
            k.objective_settings(),
            k.lr,
            k.batch,
            k.epochs,
        );
        let repaint = ctx.clone();
        let run = LiveRun::start(
            LiveSetup {
                device: setup.device,
                data: Arc::clone(&self.data),
                retriever: setup.retriever.clone(),
                config,
                // A second Start after a run ended trains into a new folder.
                out: if RunFolder::new(&setup.out).holds_run() {
                    RunFolder::free(&setup.out)
                } else {
                    setup.out.clone()
                },
                init: setup.init.clone(),
            },
            self.scorer.sink(),
            move || repaint.request_repaint(),
        );
        self.history = History::default();
        self.files = Some(RunFiles::new(&run.dir));
        self.live = Some(run);
    }

    /// Reads what the run folder gained and what the scorer finished.
    fn refresh(&mut self, ctx: &egui::Context) {
        self.scorer.collect();
        if !self.is_active() {
            return;
        }
        if self.last_poll.is_some_and(|t| t.elapsed() < POLL) {
            ctx.request_repaint_after(POLL);
            return;
        }
        self.last_poll = Some(Instant::now());
        let files = self.files.as_mut().expect("active");
        self.problem = files
            .poll(&mut self.history)
            .err()
            .map(|e| format!("{e:#}"));
        // A live run hands its models over directly; a followed one writes checkpoints.
        if self.live.is_none()
            && let Some(path) = files.new_checkpoint()
        {
            self.scorer.load(path);
        }
        ctx.request_repaint_after(POLL);
    }

    /// Draws the whole app into `ui` (the window's, or a test harness's).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        self.refresh(&ctx);
        let paint = self.paint_background;
        let frame = move |f: egui::Frame| {
            if paint {
                f
            } else {
                f.fill(egui::Color32::TRANSPARENT)
            }
        };
        let style = ui.style().clone();
        egui::Panel::top("captune-tabs")
            .frame(frame(egui::Frame::side_top_panel(&style)))
            .show(ui, |ui| {
                ui.horizontal_wrapped(|ui| {
                    ui.strong("captune");
                    ui.label(self.source_line());
                    ui.separator();
                    for tab in Tab::ALL {
                        ui.selectable_value(&mut self.tab, tab, tab.title());
                    }
                });
                if let Some(problem) = &self.problem {
                    ui.colored_label(ui.visuals().error_fg_color, problem);
                }
            });
        if self.train.is_some() {
            let status = self.live_status();
            let action = egui::Panel::left("captune-training")
                .frame(frame(egui::Frame::side_top_panel(&style)))
                .default_size(230.0)
                .show(ui, |ui| self.training.ui(ui, status))
                .inner;
            match (action, &self.live) {
                (Some(TrainingAction::Start), _) => self.start_training(&ctx),
                (Some(TrainingAction::Send(command)), Some(run)) => run.send(command),
                _ => {}
            }
        }
        let mut view = View {
            data: &self.data,
            val: &self.val,
            by_id: &self.by_id,
            history: &self.history,
            scorer: &mut self.scorer,
            thumbnails: &mut self.thumbnails,
            active: self.files.is_some(),
        };
        let panel = self.panels.get(self.tab);
        egui::CentralPanel::default_margins()
            .frame(frame(egui::Frame::central_panel(&style)))
            .show(ui, |ui| panel.ui(ui, &mut view));
    }

    fn source_line(&self) -> String {
        let data = &self.data.data.name;
        match (&self.live, &self.files, &self.scorer.model) {
            (Some(run), _, _) => {
                let s = run.status();
                format!(
                    "{data} | training in the app ({}) | {:?} | step {}/{} | {}",
                    run.dir.display(),
                    s.state,
                    s.step,
                    s.total,
                    s.objective
                )
            }
            (None, Some(files), _) => format!(
                "{data} | following {} | {} log lines",
                files.dir().display(),
                self.history.losses.len()
            ),
            (None, None, Some(model)) => format!("{data} | checkpoint: {model}"),
            (None, None, None) if self.train.is_some() => format!("{data} | not started"),
            (None, None, None) => format!("{data} | loading the checkpoint"),
        }
    }
}
