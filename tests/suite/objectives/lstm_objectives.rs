//! Every objective of the registry trains an LSTM captioner (`--decoder
//! lstm:fc`, fed the image either way, and `lstm:updown` and `lstm:att2in`
//! over the tiny BLIP folder's image tokens): its loss stays finite, its recurrent weights
//! move, a caption-only objective's loss falls, and the checkpoint loads
//! back with its config.

use crate::common;

use captune::captioner::objectives::settings::Settings;
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::captioner::{DecoderFamily, ImageFeed, LstmModel};
use captune::cpu::CpuBackend;
use captune::progress::Progress;
use captune::source::embeddings::CaptionData;
use common::tiny_data;
use std::path::PathBuf;

fn blip_folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/blip-tiny")
}

/// The tiny world with the tiny BLIP folder's image tokens.
fn token_data(b: &CpuBackend) -> CaptionData {
    let mut data = tiny_data();
    data.attach_image_tokens(b, &blip_folder(), &Progress::hidden())
        .unwrap();
    data
}

fn updown_run(objective: &str) -> RunConfig {
    let mut config = lstm_run(objective, ImageFeed::Hidden);
    config.model.decoder = Some("lstm:updown".into());
    config.model.image_feed = None;
    config.model.image_tokens = Some(format!("hf:{}", blip_folder().display()));
    config
}

fn lstm_run(objective: &str, feed: ImageFeed) -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.model.decoder = Some("lstm:fc".into());
    config.model.image_feed = Some(feed);
    config.train.objective = objective.to_string();
    config.train.settings = Settings::new();
    config.train.batch = 8;
    config.train.log_every = 1;
    // Twelve steps are the whole run: no warm-up eats them, and the
    // LSTM, whose small initial states give small gradients, takes a
    // higher rate than the transformer (at 1e-2 SMILE's loss falls by
    // less than its noise from batch to batch in twelve steps).
    config.train.warmup = 0;
    config.train.lr = 3e-2;
    config
}

#[test]
fn a_run_config_names_an_lstm_of_its_width_and_layers() {
    let data = tiny_data();
    let mut config = lstm_run("mle", ImageFeed::Input);
    config.model.layers = 2;
    let ck = fresh_checkpoint(&CpuBackend::new(), &data, &config).unwrap();
    let c = ck.model.config;
    assert_eq!(c.family, DecoderFamily::Lstm);
    let lstm = c.lstm.unwrap();
    assert_eq!(
        (lstm.model, lstm.image_feed),
        (LstmModel::Fc, ImageFeed::Input)
    );
    assert_eq!(
        (c.decoder.width, c.decoder.layers, c.prefix_len),
        (32, 2, 0)
    );
    let names: Vec<&str> = ck
        .model
        .params()
        .specs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert!(names.contains(&"core.lstm.weight_hh_l1"), "{names:?}");
    let count: usize = ck.model.params().specs.iter().map(|s| s.len()).sum();
    assert_eq!(count as u128, c.parameter_count());

    let mut bad = lstm_run("mle", ImageFeed::Hidden);
    bad.model.decoder = Some("lstm:gru".into());
    let e = RunConfig::parse(&bad.to_toml(), "my.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("my.toml") && e.contains("lstm:fc"), "{e}");
    bad.model.decoder = None;
    let e = RunConfig::parse(&bad.to_toml(), "my.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("image_feed is an LSTM decoder's setting"), "{e}");
}

#[test]
fn a_top_down_model_reads_the_tokens_of_the_vision_tower_it_names() {
    let b = CpuBackend::new();
    let ck = fresh_checkpoint(&b, &token_data(&b), &updown_run("mle")).unwrap();
    let c = ck.model.config;
    assert_eq!(c.lstm.unwrap().model, LstmModel::UpDown);
    let shape = token_data(&b).image_tokens.unwrap().shape();
    assert_eq!((c.image_tokens, c.embed_dim), (shape.tokens, shape.dim));
    let count: usize = ck.model.params().specs.iter().map(|s| s.len()).sum();
    assert_eq!(count as u128, c.parameter_count());
    // Without the tokens, the run says where they come from.
    let e = fresh_checkpoint(&b, &tiny_data(), &updown_run("mle"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--image-tokens"), "{e}");
    let refused = |edit: &dyn Fn(&mut RunConfig)| {
        let mut bad = updown_run("mle");
        edit(&mut bad);
        RunConfig::parse(&bad.to_toml(), "my.toml")
            .unwrap_err()
            .to_string()
    };
    let e = refused(&|c| c.model.image_feed = Some(ImageFeed::Input));
    assert!(
        e.contains("my.toml") && e.contains("FC model's setting"),
        "{e}"
    );
    let e = refused(&|c| c.model.layers = 2);
    assert!(e.contains("layers must be 1"), "{e}");
    // A token source for a decoder that reads none is refused, not used.
    let e = refused(&|c| c.model.decoder = None);
    assert!(e.contains("this decoder is not one"), "{e}");
    let e = refused(&|c| c.model.decoder = Some("lstm:fc".into()));
    assert!(e.contains("lstm:fc reads one image embedding"), "{e}");
}

#[test]
fn every_objective_trains_a_top_down_captioner() {
    let data = token_data(&CpuBackend::new());
    common::every_objective_trains(&data, updown_run, "core.lang_lstm.weight_hh");
}

#[test]
fn every_objective_trains_an_att2in_captioner() {
    let data = token_data(&CpuBackend::new());
    let att2in_run = |objective: &str| {
        let mut config = updown_run(objective);
        config.model.decoder = Some("lstm:att2in".into());
        config
    };
    let ck = fresh_checkpoint(&CpuBackend::new(), &data, &att2in_run("mle")).unwrap();
    let count: usize = ck.model.params().specs.iter().map(|s| s.len()).sum();
    assert_eq!(count as u128, ck.model.config.parameter_count());
    common::every_objective_trains(&data, att2in_run, "core.a2c.weight");
}

#[test]
fn every_objective_trains_an_lstm_captioner() {
    let data = tiny_data();
    for feed in [ImageFeed::Hidden, ImageFeed::Input] {
        let run = |objective: &str| lstm_run(objective, feed);
        common::every_objective_trains(&data, run, "core.lstm.weight_hh_l0");
    }
}
