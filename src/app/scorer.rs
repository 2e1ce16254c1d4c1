//! Per-token scoring off the UI thread. A worker holds a CPU copy of the
//! captioner (a single caption is a few small matrix products, and the
//! training device stays free) and answers the newest request of each
//! asker, so typing never queues up stale work. A new model (a live
//! run's snapshot, or a followed run's rewritten checkpoint) rescores the
//! last requests. Asked to, it also explains a caption's reward under a
//! sequence-level objective (`objectives::sequence::explain`).

use crate::captioner::inspect::{TokenScore, score_caption};
use crate::captioner::objective::TrainingCorpus;
use crate::captioner::objectives::sequence::{RewardExplanation, explain};
use crate::captioner::objectives::settings::Settings;
use crate::captioner::reward::CiderReward;
use crate::captioner::train::CaptionData;
use crate::captioner::{CaptionVocab, Checkpoint};
use crate::cpu::CpuBackend;
use crate::data::tokenize::ptb_tokenize;
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
    /// Also explain the caption's reward under this sequence-level
    /// objective (default settings), as a sample at a training step.
    pub reward_under: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub struct Scored {
    pub request: Request,
    pub result: Result<Vec<TokenScore>, String>,
    /// When asked for: why the caption would be rewarded or punished.
    pub reward: Option<Result<RewardExplanation, String>>,
}

enum Message {
    Model(Box<Checkpoint<CpuBackend>>),
    Load(PathBuf),
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

fn work(
    data: &CaptionData,
    inbox: &Receiver<Message>,
    outbox: &Sender<Scored>,
    notes: &Sender<String>,
    repaint: &dyn Fn(),
) {
    let cpu = CpuBackend::new();
    let mut model: Option<Checkpoint<CpuBackend>> = None;
    // The training references' CIDEr-D statistics for a vocabulary, made
    // on the first explanation and again only for a model with another.
    let mut reward: Option<(CaptionVocab, CiderReward)> = None;
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
                    let explained = match (request.reward_under, &result) {
                        (Some(name), Ok(_)) => {
                            if reward.as_ref().is_none_or(|(v, _)| *v != ck.vocab) {
                                let (corpus, _) = TrainingCorpus::training_split(&data.data);
                                let made = CiderReward::for_training(&corpus, &ck.vocab);
                                reward = Some((ck.vocab.clone(), made));
                            }
                            let (_, made) = reward.as_ref().expect("made above");
                            Some(explain_reward(&cpu, ck, data, made, &request, name))
                        }
                        _ => None,
                    };
                    (result, explained)
                }
            };
            let scored = Scored {
                request,
                result,
                reward: explained,
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
        ck.model.params.count(),
        ck.vocab.len()
    ));
    Some(ck)
}

fn explain_reward(
    cpu: &CpuBackend,
    ck: &mut Checkpoint<CpuBackend>,
    data: &CaptionData,
    reward: &CiderReward,
    request: &Request,
    objective: &str,
) -> Result<RewardExplanation, String> {
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&request.caption), ck.model.config.max_len);
    let references: Vec<Vec<String>> = data.data.items[request.item]
        .captions
        .iter()
        .map(|c| c.tokens.clone())
        .collect();
    explain(
        cpu,
        &mut ck.model,
        &ck.vocab,
        reward,
        &references,
        &data.features_of(&[request.item]),
        &ids,
        objective,
        &Settings::new(),
        0,
    )
    .map_err(|e| format!("{e:#}"))
}

fn score(
    cpu: &CpuBackend,
    ck: &mut Checkpoint<CpuBackend>,
    data: &CaptionData,
    request: &Request,
) -> Result<Vec<TokenScore>, String> {
    if ck.model.config.embed_dim != data.dim {
        return Err(format!(
            "the captioner reads {}-dimensional image embeddings but the data's features have {}",
            ck.model.config.embed_dim, data.dim
        ));
    }
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&request.caption), ck.model.config.max_len);
    score_caption(
        cpu,
        &mut ck.model,
        &ck.vocab,
        &data.features_of(&[request.item]),
        &ids,
    )
    .map_err(|e| format!("{e:#}"))
}
