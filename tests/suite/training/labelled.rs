//! The labelled-fraction setting (`[train] labelled`): which images a run
//! trains on, what its batches carry, where an MLE mix reads its
//! captions, the vocabulary, and switches the setting refuses.

use crate::common;

use captune::backend::Backend;
use captune::captioner::CaptionVocab;
use captune::captioner::labelled::LabelledSplit;
use captune::captioner::objective::{Objective, StepContext};
use captune::captioner::records::Flow;
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::cpu::CpuBackend;
use captune::data::Split;
use captune::data::vocab::Vocab;
use captune::source::embeddings::CaptionData;
use common::{new_run, tiny_data};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// What one step's batch held: its images (corpus positions), its
/// reference sequences, and those of the batch an MLE mix reads.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    images: Vec<usize>,
    sequences: Vec<Vec<u32>>,
    reference_images: Vec<usize>,
    reference_sequences: Vec<Vec<u32>>,
    corpus_references: Vec<usize>,
}

/// Trains nothing; records each step's batch.
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl<B: Backend> Objective<B> for Recorder {
    fn describe(&self) -> String {
        "recorder".into()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> anyhow::Result<()> {
        let references = cx.batch.references();
        self.0.lock().unwrap().push(Seen {
            images: cx.batch.images.clone(),
            sequences: cx.batch.sequences.clone(),
            reference_images: references.images.clone(),
            reference_sequences: references.sequences.clone(),
            corpus_references: cx.corpus.references.iter().map(Vec::len).collect(),
        });
        Ok(())
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        Vec::new()
    }

    fn report(&self, _: &[f32]) -> Vec<(&'static str, f32)> {
        vec![("loss", 0.0)]
    }
}

fn config(objective: &str, labelled: f64) -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.objective = objective.into();
    config.train.labelled = labelled;
    config.train.batch = 8;
    config.train.epochs = 1;
    config.train.eval_images = 0;
    config.train.sample_images = 0;
    config
}

/// Every step's batch of one epoch of `config`'s run, with the objective
/// replaced by the recorder.
fn record(data: &CaptionData, config: &RunConfig, name: &str) -> Vec<Seen> {
    let b = CpuBackend::new();
    let mut ck = fresh_checkpoint(&b, data, config).unwrap();
    // The image objectives need a retriever, which the recorder never reads.
    let mut retriever = common::tiny_retriever(&b, data, 8);
    let name = format!("labelled-{name}");
    let (mut trainer, dir) = new_run(&b, &mut ck, data, config, &name, Some(&mut retriever));
    let seen = Arc::new(Mutex::new(Vec::new()));
    trainer.use_objective(Box::new(Recorder(seen.clone())));
    while !trainer.finished() {
        trainer.train_batch(&b, |_| Flow::Continue).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    seen.lock().unwrap().clone()
}

/// The corpus positions (indices among the training items) of `items`.
fn positions(data: &CaptionData, items: &[usize]) -> BTreeSet<usize> {
    let train = data.items(Split::Train);
    items
        .iter()
        .map(|i| train.iter().position(|t| t == i).unwrap())
        .collect()
}

#[test]
fn caption_objectives_train_on_the_labelled_images_alone() {
    let data = tiny_data();
    let split = LabelledSplit::new(&data.data, &data.items(Split::Train), 0.25);
    assert_eq!(split.labelled.len(), 24); // of 96
    let labelled = positions(&data, &split.labelled);
    let seen = record(&data, &config("mle", 0.25), "mle");
    // An epoch is one pass over the 24 labelled images: 3 batches of 8.
    assert_eq!(seen.len(), 3);
    let images: BTreeSet<usize> = seen.iter().flat_map(|s| s.images.clone()).collect();
    assert_eq!(images, labelled);
    for s in &seen {
        assert_eq!(s.sequences.len(), 8);
        assert_eq!(s.reference_images, s.images, "no second batch");
        // The unlabelled images' references are out of the corpus too
        // (a CIDEr-D reward's statistics come from it).
        for (p, &n) in s.corpus_references.iter().enumerate() {
            assert_eq!(n > 0, labelled.contains(&p), "corpus image {p}");
        }
    }
}

#[test]
fn image_objectives_train_on_the_unlabelled_images_and_mix_mle_on_labelled_ones() {
    let data = tiny_data();
    let train = data.items(Split::Train);
    let split = LabelledSplit::new(&data.data, &train, 0.25);
    let (labelled, unlabelled) = (
        positions(&data, &split.labelled),
        positions(&data, &split.unlabelled),
    );
    let config = config("clip-relevance", 0.25);
    let seen = record(&data, &config, "relevance");
    // An epoch is one pass over the 72 unlabelled images.
    assert_eq!(seen.len(), 9);
    let images: BTreeSet<usize> = seen.iter().flat_map(|s| s.images.clone()).collect();
    assert_eq!(images, unlabelled);
    let b = CpuBackend::new();
    let vocab = fresh_checkpoint(&b, &data, &config).unwrap().vocab;
    for s in &seen {
        assert!(s.sequences.is_empty(), "unlabelled images carry no caption");
        assert_eq!(s.reference_images.len(), 8);
        assert_eq!(s.reference_sequences.len(), 8);
        // Each labelled row's sequence is one of its own image's captions.
        for (&p, sequence) in s.reference_images.iter().zip(&s.reference_sequences) {
            assert!(labelled.contains(&p));
            let item = &data.data.items[train[p]];
            assert!(
                item.captions
                    .iter()
                    .any(|c| vocab.encode(&c.tokens, 24).unwrap() == *sequence)
            );
        }
    }
    // The MLE mix passes over every labelled image once per 3 steps.
    for pass in seen.chunks(3) {
        let once: Vec<usize> = pass
            .iter()
            .flat_map(|s| s.reference_images.clone())
            .collect();
        assert_eq!(once.iter().copied().collect::<BTreeSet<_>>(), labelled);
        assert_eq!(once.len(), labelled.len());
    }
    // Drawn by step and seed: a second run sees the same batches.
    assert_eq!(record(&data, &config, "relevance-again"), seen);
    // At fraction 1 (the default) the same objective reads its own rows'
    // references, as before the setting existed.
    let full = record(&data, &self::config("clip-relevance", 1.0), "full");
    assert_eq!(full.len(), 12);
    assert!(
        full.iter()
            .all(|s| s.sequences.len() == 8 && s.reference_images == s.images)
    );
}

#[test]
fn the_vocabulary_comes_from_the_labelled_captions() {
    let data = tiny_data();
    let b = CpuBackend::new();
    let split = LabelledSplit::new(&data.data, &data.items(Split::Train), 0.1);
    let words_of = |items: &[usize]| -> BTreeSet<String> {
        items
            .iter()
            .flat_map(|&i| &data.data.items[i].captions)
            .flat_map(|c| c.tokens.clone())
            .collect()
    };
    let labelled_words = words_of(&split.labelled);
    let all_words = words_of(&data.items(Split::Train));
    assert!(
        labelled_words.len() < all_words.len(),
        "a word only the rest uses"
    );
    let built = Vocab::build(&split.captioned(&data.data), 1);
    let built_words: BTreeSet<String> = built.words().iter().cloned().collect();
    assert_eq!(built_words, labelled_words);
    let vocab = fresh_checkpoint(&b, &data, &config("mle", 0.1))
        .unwrap()
        .vocab;
    let from_labelled = CaptionVocab::build(&split.captioned(&data.data), 1).unwrap();
    let from_all = CaptionVocab::build(&data.data, 1).unwrap();
    assert_eq!(vocab.len(), from_labelled.len());
    assert!(vocab.len() < from_all.len());
}

#[test]
fn a_run_refuses_to_switch_to_an_objective_that_trains_on_other_images() {
    let data = tiny_data();
    let b = CpuBackend::new();
    let config = config("mle", 0.25);
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let (mut trainer, dir) = new_run(&b, &mut ck, &data, &config, "labelled-switch", None);
    let settings = Default::default();
    let refused = trainer
        .set_objective("clip-relevance", &settings, 1e-3)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("--init"), "{refused}");
    trainer.set_objective("smile", &settings, 1e-3).unwrap();
    drop(trainer);
    std::fs::remove_dir_all(&dir).unwrap();
}
