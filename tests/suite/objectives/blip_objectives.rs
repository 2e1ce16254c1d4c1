//! Every objective of the registry trains a BLIP captioner (the tiny
//! random `BlipForConditionalGeneration` in tests/data/blip-tiny, with its
//! WordPiece tokenizer), started as `captune train --decoder hf:DIR`
//! starts it: the data's images go through the folder's vision tower once
//! into cached image tokens, the text decoder cross-attends to them, its
//! loss stays finite and it learns, and the run's checkpoint carries the
//! tokenizer back.

use crate::common;

use captune::captioner::objectives::settings::{SettingValue, Settings};
use captune::captioner::records::Flow;
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::captioner::{CaptionVocab, DecoderFamily};
use captune::cpu::CpuBackend;
use captune::data::image_processor::ImageProcessor;
use captune::model::blip::{self, BlipVision};
use captune::model::vision::patches_of_pixels;
use captune::progress::Progress;
use captune::source::embeddings::CaptionData;
use common::{new_run, tiny_data};
use std::path::PathBuf;

fn blip_folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/blip-tiny")
}

fn blip_run(objective: &str) -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.model.decoder = Some(format!("hf:{}", blip_folder().display()));
    config.train.objective = objective.to_string();
    config.train.settings = Settings::new();
    config.train.batch = 8;
    config.train.log_every = 1;
    config
}

/// The tiny world with the BLIP folder's image tokens.
fn blip_data(b: &CpuBackend) -> CaptionData {
    let mut data = tiny_data();
    data.attach_image_tokens(b, &blip_folder(), &Progress::hidden())
        .unwrap();
    data
}

#[test]
fn a_blip_folder_starts_a_run_with_its_wordpiece_tokenizer_and_network() {
    let b = CpuBackend::new();
    let ck = fresh_checkpoint(&b, &tiny_data(), &blip_run("mle")).unwrap();
    let c = ck.model.config;
    assert_eq!(c.family, DecoderFamily::Blip);
    assert_eq!((c.decoder.width, c.decoder.layers), (16, 2));
    // The vision tower's tokens: a class token and (32 / 8)^2 patches of 12.
    assert_eq!((c.image_tokens, c.embed_dim), (17, 12));
    assert!(matches!(ck.vocab, CaptionVocab::WordPieces(_)));
    assert_eq!(ck.vocab.len(), 50);
    // [DEC] starts, [SEP] ends, [PAD] pads: the folder's config's ids.
    let s = ck.vocab.specials();
    assert_eq!((s.start, s.end, s.pad), (47, 2, 0));
    assert_eq!(s, c.specials);
    // PTB words are encoded into pieces, a word the tokenizer splits into
    // a piece and its continuation, and decoded back.
    let words: Vec<String> = ["a", "dog", "runs", "in", "the", "park"]
        .map(String::from)
        .to_vec();
    let ids = ck.vocab.encode(&words, 12).unwrap();
    assert_eq!(ids.first(), Some(&47));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(ck.vocab.decode(&ids[1..]), "a dog runs in the park");
    assert_eq!(ck.vocab.decode_words(&ids[1..]), words);
    // Nothing after the end is part of the caption.
    assert_eq!(ck.vocab.decode(&[ids[1], 2, ids[2]]), "a");
    // The pieces show as the tokenizer lists them; the retriever reads
    // each as the text it spells.
    let dogs = ck.vocab.encode(&["dogs".to_string()], 12).unwrap();
    let labels: Vec<String> = dogs.iter().map(|&id| ck.vocab.label(id)).collect();
    assert_eq!(labels, ["[DEC]", "dog", "##s", "[SEP]"]);
    assert_eq!(ck.vocab.spelled(dogs[2]), "s");
    assert_eq!(ck.vocab.spelled(2), "<eos>");
    assert_eq!(ck.vocab.decode(&dogs[1..]), "dogs");
    // Truncated to the room a caption has, still ended.
    let short = ck.vocab.encode(&words, 4).unwrap();
    assert_eq!(short, [47, ids[1], ids[2], 2]);
    assert!(!ck.vocab.has_alternatives());
}

/// The image tokens a run reads are the vision tower's, rounded to
/// float16 (their storage), and the second time come from the cache.
#[test]
fn image_tokens_are_the_vision_tower_s_and_cached() {
    let b = CpuBackend::new();
    let data = blip_data(&b);
    let mut folder = blip::read(&blip_folder()).unwrap();
    let processor = ImageProcessor::load(&blip_folder()).unwrap();
    let mut vision = BlipVision::new(&b, &blip_folder(), &mut folder).unwrap();
    let items = [0, data.data.items.len() - 1];
    let mut pixels = Vec::new();
    for &i in &items {
        let image = image::open(&data.data.items[i].image).unwrap();
        pixels.extend(processor.pixels(&image.to_rgb8()));
    }
    let want = vision
        .image_tokens(&b, &patches_of_pixels(&pixels, 32, 8))
        .unwrap();
    let tokens = |d: &captune::source::embeddings::CaptionData| {
        d.image_tokens.as_ref().unwrap().of(&items).unwrap()
    };
    let got = tokens(&data);
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        // float16 keeps 11 significant bits.
        assert!(
            (g - w).abs() <= w.abs() / 2048.0 + 1e-7,
            "value {k}: {g} stored for {w}"
        );
    }
    assert_ne!(got[..want.len() / 2], got[want.len() / 2..]);
    let again = blip_data(&b);
    assert_eq!(tokens(&again), got);
}

/// Every objective trains a BLIP captioner for two tiny epochs (12
/// steps) on the tiny world's image tokens; its prediction head's layer
/// norm moves under each, and its checkpoint brings the WordPiece
/// tokenizer back.
#[test]
fn every_objective_trains_a_blip_captioner() {
    let data = blip_data(&CpuBackend::new());
    common::every_objective_trains(&data, blip_run, "head.ln.weight");
}

/// With `train_vision`, every objective trains the vision tower too: the
/// tiny world's images go through the folder's processor at every step,
/// and the tower's final layer norm moves under each objective.
#[test]
fn every_objective_trains_a_blip_vision_tower() {
    let mut data = tiny_data();
    data.attach_pixels(&blip_folder()).unwrap();
    let with_vision = |objective: &str| {
        let mut config = blip_run(objective);
        config.model.train_vision = true;
        config
    };
    common::every_objective_trains(&data, with_vision, "vision.ln_f.weight");
}

/// SMILE's first-token shift needs reserved alternatives, which
/// WordPiece pieces do not have: the run is refused, saying so.
#[test]
fn first_token_shift_is_refused_on_blip() {
    let b = CpuBackend::new();
    let data = blip_data(&b);
    let mut config = blip_run("smile");
    config
        .train
        .settings
        .insert("first_token".into(), SettingValue::Choice("shift".into()));
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let (mut trainer, dir) = new_run(&b, &mut ck, &data, &config, "blip-shift", None);
    let e = trainer
        .train_batch(&b, |_| Flow::Continue)
        .map(|_| ())
        .unwrap_err();
    drop(trainer);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(format!("{e:#}").contains("shift"), "{e:#}");
}

/// `train_vision` trains a BLIP decoder's tower: without a BLIP decoder,
/// or beside `freeze_decoder` (the cross-attention only), it is refused,
/// saying why.
#[test]
fn train_vision_is_refused_where_there_is_no_tower_to_train() {
    let b = CpuBackend::new();
    let mut config = RunConfig::preset("tiny").unwrap();
    config.model.train_vision = true;
    let Err(e) = fresh_checkpoint(&b, &tiny_data(), &config) else {
        panic!("a prefix decoder has no tower to train")
    };
    assert!(format!("{e:#}").contains("only a BLIP decoder"), "{e:#}");
    let mut config = blip_run("mle");
    config.model.train_vision = true;
    config.train.freeze_decoder = true;
    let e = RunConfig::parse(&config.to_toml(), "run.toml").unwrap_err();
    assert!(format!("{e:#}").contains("choose one"), "{e:#}");
}
