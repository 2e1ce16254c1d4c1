//! Per-token scoring off the UI thread. A worker holds a CPU copy of the
//! captioner (a single caption is a few small matrix products, and the
//! training device stays free) and answers the newest request of each
//! asker, so typing never queues up stale work. A new model (a live
//! run's snapshot, or a followed run's rewritten checkpoint) rescores the
//! last requests. Asked to, it also explains the caption under an
//! objective that explains (`Objective::explain`), with the retriever the
//! app was given when the objective needs one.

use crate::captioner::explain::{ExplainContext, Explanation};
use crate::captioner::inspect::{TokenScore, score_caption};
use crate::captioner::objective::Objective;
use crate::captioner::objectives::{self, settings::Settings};
use crate::captioner::{CaptionVocab, Checkpoint};
use crate::cpu::CpuBackend;
use crate::data::tokenize::ptb_tokenize;
use crate::retriever::frozen::FrozenRetriever;
use crate::source::embeddings::CaptionData;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

/// Which panel asked: each keeps only its newest answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Asker {
    PerToken,
    Inspector,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub asker: Asker,
    /// The data set's item index.
    pub item: usize,
    pub caption: String,
    /// Also explain the caption under this objective (default settings),
    /// as the image's at a training step.
    pub explain_under: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub struct Scored {
    pub request: Request,
    pub result: Result<Vec<TokenScore>, String>,
    /// When asked for: why the caption would be rewarded or punished.
    pub explained: Option<Result<Explanation, String>>,
}

enum Message {
    Model(Box<Checkpoint<CpuBackend>>),
    Load(PathBuf),
    Retriever(PathBuf),
    Score(Request),
}

/// The UI side: send requests and models, collect answers without waiting.
pub struct Scorer {
    to_worker: Sender<Message>,
    from_worker: Receiver<Scored>,
    answers: HashMap<Asker, Scored>,
    asked: HashMap<Asker, Request>,
    model_note: Receiver<String>,
    /// What the worker last said about its model ("step 1200", or an error).
    pub model: Option<String>,
}

/// Hands models to the scorer from any thread (the live trainer's).
#[derive(Clone)]
pub struct ModelSink(Sender<Message>);

impl ModelSink {
    pub fn send(&self, model: Checkpoint<CpuBackend>) {
        let _ = self.0.send(Message::Model(Box::new(model)));
    }
}

impl Scorer {
    /// Starts the worker; `repaint` is called after each answer.
    pub fn start(data: Arc<CaptionData>, repaint: impl Fn() + Send + 'static) -> Scorer {
        let (to_worker, inbox) = channel();
        let (outbox, from_worker) = channel();
        let (note_out, model_note) = channel();
        std::thread::Builder::new()
            .name("captune-scorer".into())
            .spawn(move || work(&data, &inbox, &outbox, &note_out, &repaint))
            .expect("a thread for the scorer");
        Scorer {
            to_worker,
            from_worker,
            answers: HashMap::new(),
            asked: HashMap::new(),
            model_note,
            model: None,
        }
    }

    pub fn sink(&self) -> ModelSink {
        ModelSink(self.to_worker.clone())
    }

    /// Loads a checkpoint file (in the worker).
    pub fn load(&self, path: PathBuf) {
        let _ = self.to_worker.send(Message::Load(path));
    }

    /// The retriever that explanations needing one judge with (loaded in
    /// the worker when first needed).
    pub fn judge_with(&self, retriever: PathBuf) {
        let _ = self.to_worker.send(Message::Retriever(retriever));
    }

    /// Asks for a score unless the same request is already asked.
    pub fn ask(&mut self, request: Request) {
        if self.asked.get(&request.asker) == Some(&request) {
            return;
        }
        self.asked.insert(request.asker, request.clone());
        let _ = self.to_worker.send(Message::Score(request));
    }

    /// Takes in finished answers; call once per frame.
    pub fn collect(&mut self) {
        for scored in self.from_worker.try_iter() {
            self.answers.insert(scored.request.asker, scored);
        }
        if let Some(note) = self.model_note.try_iter().last() {
            self.model = Some(note);
        }
    }

    /// The newest answer for `asker` (possibly for an older request while
    /// the newest is being scored).
    pub fn answer(&self, asker: Asker) -> Option<&Scored> {
        self.answers.get(&asker)
    }

    /// Whether the answer shown is for the newest request.
    pub fn is_current(&self, asker: Asker) -> bool {
        match (self.answers.get(&asker), self.asked.get(&asker)) {
            (Some(a), Some(r)) => &a.request == r,
            _ => false,
        }
    }
}

/// The objective explaining captions, made again for another name or
/// another model's vocabulary (its reward statistics follow the vocabulary).
struct Explainer {
    name: &'static str,
    vocab: CaptionVocab,
    objective: Box<dyn Objective<CpuBackend>>,
}

/// The retriever explanations judge with: where it is, and once needed,
/// loaded (or why it could not be).
#[derive(Default)]
struct Judge {
    path: Option<PathBuf>,
    loaded: Option<Result<FrozenRetriever<CpuBackend>, String>>,
}

impl Judge {
    fn get(
        &mut self,
        cpu: &CpuBackend,
    ) -> Option<Result<&mut FrozenRetriever<CpuBackend>, String>> {
        let path = self.path.as_ref()?;
        let loaded = self.loaded.get_or_insert_with(|| {
            FrozenRetriever::load(cpu, path, 32).map_err(|e| format!("{e:#}"))
        });
        Some(loaded.as_mut().map_err(|e| e.clone()))
    }
}

fn work(
    data: &CaptionData,
    inbox: &Receiver<Message>,
    outbox: &Sender<Scored>,
    notes: &Sender<String>,
    repaint: &dyn Fn(),
) {
    let cpu = CpuBackend::new();
    let mut model: Option<Checkpoint<CpuBackend>> = None;
    let mut explainer: Option<Explainer> = None;
    let mut judge = Judge::default();
    let mut latest: HashMap<Asker, Request> = HashMap::new();
    while let Ok(first) = inbox.recv() {
        // Everything waiting: keep the newest model and each asker's newest request.
        let mut rescore_all = false;
        let mut fresh = Vec::new();
        for message in std::iter::once(first).chain(inbox.try_iter()) {
            match message {
                Message::Score(r) => {
                    fresh.push(r.asker);
                    latest.insert(r.asker, r);
                }
                Message::Model(ck) => {
                    model = install(*ck, notes);
                    rescore_all = true;
                }
                Message::Load(path) => {
                    match Checkpoint::load(&cpu, &path) {
                        Ok(ck) => model = install(ck, notes),
                        Err(e) => {
                            let _ = notes.send(format!("{e:#}"));
                        }
                    }
                    rescore_all = true;
                }
                Message::Retriever(path) => {
                    judge = Judge {
                        path: Some(path),
                        loaded: None,
                    };
                    rescore_all = true;
                }
            }
        }
        let due: Vec<Request> = latest
            .values()
            .filter(|r| rescore_all || fresh.contains(&r.asker))
            .cloned()
            .collect();
        for request in due {
            let (result, explained) = match model.as_mut() {
                None => (
                    Err("no model yet: it arrives after the first epoch".to_string()),
                    None,
                ),
                Some(ck) => {
                    let result = score(&cpu, ck, data, &request);
                    let explained = match (request.explain_under, &result) {
                        (Some(name), Ok(_)) => Some(explain(
                            &cpu,
                            ck,
                            data,
                            &request,
                            name,
                            &mut explainer,
                            &mut judge,
                        )),
                        _ => None,
                    };
                    (result, explained)
                }
            };
            let scored = Scored {
                request,
                result,
                explained,
            };
            if outbox.send(scored).is_err() {
                return;
            }
        }
        repaint();
    }
}

/// The model to score with from now on, announced in the notes.
fn install(ck: Checkpoint<CpuBackend>, notes: &Sender<String>) -> Option<Checkpoint<CpuBackend>> {
    let _ = notes.send(format!(
        "{} parameters, {} words",
        ck.model.params().count(),
        ck.vocab.len()
    ));
    Some(ck)
}

/// The request's caption explained under objective `name`, with the
/// explainer made (again) when it is another's or for another vocabulary.
fn explain(
    cpu: &CpuBackend,
    ck: &mut Checkpoint<CpuBackend>,
    data: &CaptionData,
    request: &Request,
    name: &'static str,
    explainer: &mut Option<Explainer>,
    judge: &mut Judge,
) -> Result<Explanation, String> {
    if explainer
        .as_ref()
        .is_none_or(|e| e.name != name || e.vocab != ck.vocab)
    {
        let objective = objectives::build(name, &Settings::new(), ck.vocab.len())
            .map_err(|e| format!("{e:#}"))?;
        *explainer = Some(Explainer {
            name,
            vocab: ck.vocab.clone(),
            objective,
        });
    }
    let explainer = explainer.as_mut().expect("made above");
    let needs = objectives::find(name).map_err(|e| format!("{e:#}"))?.needs;
    // Loaded only for an objective that reads it.
    let retriever = match needs(&Settings::new()).retriever {
        true => judge.get(cpu).transpose()?,
        false => None,
    };
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&request.caption), ck.model.config.max_len)
        .map_err(|e| format!("{e:#}"))?;
    let mut cx = ExplainContext {
        b: cpu,
        model: &mut ck.model,
        vocab: &ck.vocab,
        ids: &ids,
        data,
        item: request.item,
        retriever,
        batch_images: BATCH_IMAGES,
        seed: 0,
    };
    match explainer.objective.explain(&mut cx) {
        Ok(Some(e)) => Ok(e),
        Ok(None) => Err(format!("{name} explains no caption")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The images of a training batch an explanation ranks a caption among
/// (the shapes preset's batch).
const BATCH_IMAGES: usize = 64;

fn score(
    cpu: &CpuBackend,
    ck: &mut Checkpoint<CpuBackend>,
    data: &CaptionData,
    request: &Request,
) -> Result<Vec<TokenScore>, String> {
    (ck.model.config)
        .check_inputs(data, "the captioner")
        .map_err(|e| format!("{e:#}"))?;
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&request.caption), ck.model.config.max_len)
        .map_err(|e| format!("{e:#}"))?;
    let inputs = data
        .inputs_of(&[request.item], ck.model.config.embedding_reading())
        .map_err(|e| format!("{e:#}"))?;
    score_caption(cpu, &mut ck.model, &ck.vocab, &inputs, &ids).map_err(|e| format!("{e:#}"))
}
