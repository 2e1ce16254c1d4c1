//! Training inside the app: a background thread steps a [`Trainer`] on
//! the backend `--device` picks and writes an ordinary run folder, which
//! the panels follow like any headless run. The UI talks to the thread
//! only through a command channel and a status it reads without waiting.

use super::scorer::ModelSink;
use crate::backend::Backend;
use crate::captioner::Checkpoint;
use crate::captioner::objectives::{self, settings::Settings};
use crate::captioner::records::{Event, Flow};
use crate::captioner::run::RunConfig;
use crate::captioner::run_folder::{Begin, RunFolder};
use crate::captioner::train::{Trainer, fresh_checkpoint};
use crate::device::{self, DeviceChoice};
use crate::retriever::frozen::FrozenRetriever;
use crate::source::embeddings::CaptionData;
use anyhow::Result;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a running trainer captions the sample images and hands the
/// inspector a fresh copy of the model, besides each epoch's end.
const REFRESH: Duration = Duration::from_secs(15);

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Pause,
    Resume,
    Stop,
    /// Train on with this objective, its settings and peak learning rate.
    Switch {
        objective: String,
        settings: Settings,
        lr: f32,
    },
    /// Write the weights now to `step-N.safetensors` in the run folder.
    Save,
}

#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Starting,
    Running,
    Paused,
    Finished,
    Stopped,
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct LiveStatus {
    pub state: State,
    pub step: usize,
    pub total: usize,
    pub objective: String,
    pub backend: String,
    /// The last thing worth telling (a saved checkpoint's path, a
    /// refused objective switch).
    pub note: String,
}

/// What a live run needs.
pub struct LiveSetup {
    pub device: DeviceChoice,
    pub data: Arc<CaptionData>,
    /// Adds self-retrieval and relevance to the per-epoch metrics.
    pub retriever: Option<PathBuf>,
    pub config: RunConfig,
    pub out: PathBuf,
    /// Start from these weights instead of fresh ones.
    pub init: Option<PathBuf>,
}

pub struct LiveRun {
    commands: Sender<Command>,
    status: Arc<Mutex<LiveStatus>>,
    pub dir: PathBuf,
}

impl LiveRun {
    /// Starts the training thread. `repaint` is called when there is news.
    pub fn start(
        setup: LiveSetup,
        models: ModelSink,
        repaint: impl Fn() + Send + Sync + 'static,
    ) -> LiveRun {
        let (commands, inbox) = channel();
        let status = Arc::new(Mutex::new(LiveStatus {
            state: State::Starting,
            step: 0,
            total: 0,
            objective: objectives::describe(
                &setup.config.train.objective,
                &setup.config.train.settings,
            ),
            backend: String::new(),
            note: String::new(),
        }));
        let dir = setup.out.clone();
        let shared = Arc::clone(&status);
        std::thread::Builder::new()
            .name("captune-trainer".into())
            .spawn(move || {
                // One core stays with the UI (and a software renderer).
                let threads = std::thread::available_parallelism()
                    .map_or(1, |n| n.get().saturating_sub(1).max(1));
                let (setup, status, models, repaint) = (&setup, &shared, &models, &repaint);
                let outcome = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .start_handler(|_| yield_to_the_window())
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|pool| {
                        pool.install(move || {
                            let link = Link {
                                inbox: &inbox,
                                status,
                                models,
                                repaint,
                            };
                            run(setup, &link)
                        })
                    });
                shared.lock().expect("status lock").state = match outcome {
                    Ok(state) => state,
                    Err(e) => State::Failed(format!("{e:#}")),
                };
                repaint();
            })
            .expect("a thread for training");
        LiveRun {
            commands,
            status,
            dir,
        }
    }

    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    pub fn status(&self) -> LiveStatus {
        self.status.lock().expect("status lock").clone()
    }
}

/// The training thread's ties to the UI.
struct Link<'a> {
    inbox: &'a Receiver<Command>,
    status: &'a Mutex<LiveStatus>,
    models: &'a ModelSink,
    repaint: &'a dyn Fn(),
}

fn run(setup: &LiveSetup, link: &Link<'_>) -> Result<State> {
    let selection = device::select(setup.device)?;
    crate::with_backend!(&selection.backend, b => train_live(b, setup, link))
}

fn train_live<B: Backend>(b: &B, setup: &LiveSetup, link: &Link<'_>) -> Result<State> {
    let Link {
        inbox,
        status,
        models,
        repaint,
    } = *link;
    let data = &*setup.data;
    let config = &setup.config;
    let mut ck = match &setup.init {
        Some(path) => Checkpoint::load(b, path)?,
        None => fresh_checkpoint(b, data, config)?,
    };
    let mut retriever = match &setup.retriever {
        // Batch 32: the per-epoch metrics embed a few hundred captions,
        // and a smaller batch keeps the app's memory down.
        Some(path) => Some(FrozenRetriever::load(b, path, 32)?),
        None => None,
    };
    let folder = RunFolder::new(&setup.out);
    let mut trainer = Trainer::new(
        b,
        &mut ck,
        data,
        config,
        folder,
        Begin::New,
        retriever.as_mut(),
    )?;
    models.send(trainer.ck.to_cpu(b)?);
    let update = |f: &dyn Fn(&mut LiveStatus)| f(&mut status.lock().expect("status lock"));
    let backend = format!("{:?} on {}", b.kind(), b.adapter_name());
    update(&|s| {
        s.state = State::Running;
        s.backend = backend.clone();
        s.total = trainer.total_steps();
    });
    repaint();
    if setup.init.is_some() {
        // Metrics of the weights the run starts from: the "before" point.
        trainer.validate_now(b, |_| Flow::Continue)?;
        repaint();
    }
    let mut paused = false;
    let mut refreshed = Instant::now();
    loop {
        loop {
            let command = if paused {
                inbox.recv().ok()
            } else {
                match inbox.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            // The app closed: stop as Stop would.
            let Some(command) = command else {
                return Ok(State::Stopped);
            };
            match command {
                Command::Pause => {
                    paused = true;
                    models.send(trainer.ck.to_cpu(b)?);
                    update(&|s| s.state = State::Paused);
                }
                Command::Resume => {
                    paused = false;
                    update(&|s| s.state = State::Running);
                }
                Command::Stop => return Ok(State::Stopped),
                Command::Switch {
                    objective,
                    settings,
                    lr,
                } => {
                    // A switch the run refuses (another labelled fraction's
                    // images) is said, and training goes on as it was.
                    match trainer.set_objective(&objective, &settings, lr) {
                        Ok(()) => {
                            update(&|s| s.objective = objectives::describe(&objective, &settings))
                        }
                        Err(e) => {
                            let note = format!("{e:#}");
                            update(&|s| s.note = note.clone());
                        }
                    }
                }
                Command::Save => {
                    let path = trainer
                        .run_folder()
                        .dir
                        .join(format!("step-{}.safetensors", trainer.step()));
                    trainer.save(b, &path)?;
                    let note = format!("saved {}", path.display());
                    update(&|s| s.note = note.clone());
                }
            }
            repaint();
        }
        if trainer.finished() {
            models.send(trainer.ck.to_cpu(b)?);
            return Ok(State::Finished);
        }
        let mut epoch_ended = false;
        let mut logged = false;
        let mut warning = None;
        trainer.train_batch(b, |e| {
            match e {
                Event::Log(_) => logged = true,
                Event::Warning(w) => warning = Some(w.to_string()),
                Event::Sample(_) | Event::Metrics(_) => epoch_ended = true,
            }
            Flow::Continue
        })?;
        if let Some(w) = warning {
            update(&|s| s.note = w.clone());
            repaint();
        }
        if epoch_ended || refreshed.elapsed() > REFRESH {
            if !epoch_ended {
                trainer.write_samples(b, |_| Flow::Continue)?;
            }
            models.send(trainer.ck.to_cpu(b)?);
            refreshed = Instant::now();
        }
        let step = trainer.step();
        update(&|s| s.step = step);
        if logged || epoch_ended {
            repaint();
        }
    }
}

/// Lowers the calling thread's scheduling priority (nice 4) where the OS
/// keeps one per thread (Linux), so that a training step never delays a
/// frame: training and drawing share the cores, and a step can wait.
fn yield_to_the_window() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority with PRIO_PROCESS and id 0 changes only the
    // calling thread's nice value on Linux; a failure leaves it as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 4);
    }
}
