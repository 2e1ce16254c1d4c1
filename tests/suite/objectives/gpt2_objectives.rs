//! Every objective of the registry trains a captioner whose decoder is a
//! pretrained GPT-2 (the tiny random one in tests/data/gpt2-tiny, with its
//! byte-level BPE tokenizer), started as `captune train --decoder hf:DIR`
//! starts it: its loss stays finite, the decoder learns, captions decode
//! to text, and the run's checkpoint carries the tokenizer back.

use crate::common;

use captune::captioner::explain::ExplainContext;
use captune::captioner::objectives::{self, settings::Settings};
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::captioner::{CaptionVocab, Checkpoint};
use captune::cpu::CpuBackend;
use captune::data::bpe::BpeVocab;
use captune::data::vocab::SPECIALS;
use common::{tiny_data, tiny_retriever};
use std::path::PathBuf;

fn gpt2_folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny")
}

fn gpt2_run(objective: &str) -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.model.decoder = Some(format!("hf:{}", gpt2_folder().display()));
    config.train.objective = objective.to_string();
    config.train.settings = Settings::new();
    config.train.batch = 8;
    config.train.log_every = 1;
    config
}

#[test]
fn a_gpt2_folder_starts_a_run_with_its_tokenizer_and_network() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let ck = fresh_checkpoint(&b, &data, &gpt2_run("mle")).unwrap();
    let bpe = BpeVocab::load(&gpt2_folder()).unwrap();
    let c = ck.model.config;
    assert_eq!(c.decoder.width, 32);
    assert_eq!(c.decoder.layers, 2);
    // GPT-2's ids and the padding after them.
    assert_eq!(c.vocab_size, bpe.len() + 1);
    assert_eq!(ck.vocab.len(), c.vocab_size);
    assert_eq!((c.specials.start, c.specials.end), (bpe.end(), bpe.end()));
    assert_eq!(c.specials.pad as usize, bpe.len());
    assert_eq!(ck.vocab.specials(), c.specials);
    // A caption is encoded from its PTB words into pieces, and back.
    let words: Vec<String> = ["a", "skateboarder", "jumps"].map(String::from).to_vec();
    let ids = ck.vocab.encode(&words, 24).unwrap();
    assert_eq!(ids.first(), Some(&bpe.end()));
    assert_eq!(ids.last(), Some(&bpe.end()));
    assert_eq!(ck.vocab.decode(&ids[1..]), "a skateboarder jumps");
    // A caption that ends at once is empty, whatever follows its end.
    assert_eq!(ck.vocab.decode(&[bpe.end(), ids[1], ids[2]]), "");
    assert_eq!(ck.vocab.decode_words(&ids[1..]), words);
    // The pieces show as themselves; the retriever reads each as the word
    // it spells.
    let labels: Vec<String> = ids[1..ids.len() - 1]
        .iter()
        .map(|&id| ck.vocab.label(id))
        .collect();
    assert_eq!(labels.concat(), "a skateboarder jumps");
    assert_eq!(ck.vocab.spelled(ids[1]), "a");
    assert_eq!(ck.vocab.spelled(bpe.end()), SPECIALS[2]);
    assert!(!ck.vocab.has_alternatives());
}

/// Every objective trains a GPT-2 captioner for two tiny epochs (12
/// steps); its final layer norm's scale moves under each, and its
/// checkpoint brings the BPE tokenizer back. (The random GPT-2's captions
/// earn next to no reward, too little for a direction to show:
/// `a_caption_earns_the_same_reward_from_gpt2_pieces_as_from_words`
/// checks the rewards themselves.)
#[test]
fn every_objective_trains_a_gpt2_captioner() {
    let data = tiny_data();
    let ck = fresh_checkpoint(&CpuBackend::new(), &data, &gpt2_run("mle")).unwrap();
    assert!(matches!(ck.vocab, CaptionVocab::Pieces(_)));
    common::every_objective_trains(&data, gpt2_run, "decoder.ln_f.weight");
}

/// What a caption earns does not depend on the decoder's vocabulary: each
/// objective that explains a caption gives a reference of a tiny-world
/// image the same reward on a GPT-2 captioner, which reads it as
/// byte-level pieces, as on captune's own decoder, which reads it as
/// words (CIDEr-D of its words; DiscriTune's listener reading its words
/// among the same candidate images). A reward read from piece ids, or a
/// listener fed pieces, would differ.
#[test]
fn a_caption_earns_the_same_reward_from_gpt2_pieces_as_from_words() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut native = RunConfig::preset("tiny").unwrap();
    native.train.settings = Settings::new();
    let mut words = fresh_checkpoint(&b, &data, &native).unwrap();
    let mut pieces = fresh_checkpoint(&b, &data, &gpt2_run("mle")).unwrap();
    let mut listener = tiny_retriever(&b, &data, 8);
    // A short reference, which GPT-2's pieces also hold whole.
    let (item, caption) = (data.data.items.iter().enumerate())
        .find_map(|(i, it)| {
            let c = it.captions.iter().find(|c| c.tokens.len() <= 6)?;
            Some((i, c.tokens.clone()))
        })
        .unwrap();
    let mut compared = 0;
    for info in objectives::OBJECTIVES.iter().filter(|o| o.explains) {
        let mut reward = |ck: &mut Checkpoint<CpuBackend>| {
            let mut objective =
                objectives::build::<CpuBackend>(info.name, &Settings::new(), ck.vocab.len())
                    .unwrap();
            let ids = ck.vocab.encode(&caption, ck.model.config.max_len).unwrap();
            let mut cx = ExplainContext {
                b: &b,
                model: &mut ck.model,
                vocab: &ck.vocab,
                ids: &ids,
                data: &data,
                item,
                retriever: Some(&mut listener),
                batch_images: 4,
                seed: 7,
            };
            let e = objective.explain(&mut cx).unwrap().unwrap();
            assert_eq!(e.caption, caption.join(" "), "{}", info.name);
            e.reward
        };
        let (from_words, from_pieces) = (reward(&mut words), reward(&mut pieces));
        assert!(
            from_words.abs() > 1e-3,
            "{}: a reference earns a reward: {from_words}",
            info.name
        );
        assert!(
            (from_words - from_pieces).abs() <= 1e-6 * from_words.abs(),
            "{}: {from_words} from words, {from_pieces} from pieces",
            info.name
        );
        compared += 1;
    }
    assert_eq!(compared, 4, "SCST, SLL-ME, SLE and DiscriTune explain");
}
