//! METEOR against the jar itself (`tests/data/meteor_reference.json`,
//! made by `scripts/meteor_reference.py` through pycocoevalcap): written
//! cases, Flickr8k's test split with leave-one-out human captions, and
//! captions captune generated for it; then METEOR in `score` and in
//! validation. METEOR's data comes from pycocoevalcap where it is
//! installed, and those tests skip without it; one runs everywhere, on
//! made-up data scored by the jar.

use crate::common;

use captune::captioner::Checkpoint;
use captune::captioner::decode::{DecodeOptions, Decoding};
use captune::captioner::evaluate::{caption_items, score_captions};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::{CaptionVocab, model::Captioner};
use captune::cpu::CpuBackend;
use captune::data::Split;
use captune::data::tokenize::ptb_tokenize;
use captune::metrics::meteor::{Meteor, MeteorData, MeteorScores};
use serde_json::Value;
use std::collections::HashMap;

/// pycocoevalcap's METEOR data, or a skip.
fn meteor_data() -> Option<MeteorData> {
    let why = match MeteorData::installed() {
        Ok(Some(data)) => return Some(data),
        Ok(None) => {
            "pycocoevalcap is not installed: METEOR's data (its jar and paraphrase table) is not there"
                .to_string()
        }
        Err(e) => format!("{e:#}"),
    };
    common::skip(&why);
    None
}

fn reference() -> Value {
    serde_json::from_str(include_str!("../../data/meteor_reference.json")).unwrap()
}

/// The scores equal the jar's: every segment to 1e-6 (the fixture keeps
/// nine decimals), the corpus to 1e-12.
fn assert_jar_scores(what: &str, got: &MeteorScores, want: &Value) {
    let segments = want["segments"].as_array().unwrap();
    assert_eq!(got.segments.len(), segments.len(), "{what}: segments");
    for (i, (g, w)) in got.segments.iter().zip(segments).enumerate() {
        let w = w.as_f64().unwrap();
        assert!(
            (g - w).abs() <= 1e-6,
            "{what}: segment {i}: captune {g}, the jar {w}"
        );
    }
    let w = want["corpus"].as_f64().unwrap();
    assert!(
        (got.corpus - w).abs() <= 1e-12,
        "{what}: corpus captune {}, the jar {w}",
        got.corpus
    );
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Written segments' METEOR with `data`, the segments as the fixture
/// holds them: `[{"candidate", "references"}]`.
fn score_pairs(data: &MeteorData, pairs: &Value) -> MeteorScores {
    let pairs = pairs.as_array().unwrap();
    let candidates: Vec<String> = pairs
        .iter()
        .map(|p| p["candidate"].as_str().unwrap().to_string())
        .collect();
    let references: Vec<Vec<String>> = pairs.iter().map(|p| strings(&p["references"])).collect();
    Meteor::load(data)
        .unwrap()
        .score(&candidates, &references)
        .unwrap()
}

#[test]
fn meteor_equals_the_jar_on_written_cases() {
    let Some(data) = meteor_data() else {
        return;
    };
    let cases = &reference()["cases"];
    let got = score_pairs(&data, &cases["pairs"]);
    assert_jar_scores("written cases", &got, cases);
}

/// Runs everywhere: a made-up data folder in METEOR's layout
/// (`scripts/meteor_tiny_data.py`), scored by the real jar with the same
/// function words, synonyms and paraphrases: stems, irregular and regular
/// base forms, synonyms, paraphrases both ways, repeated and crossing
/// words for the search, an identical pair and an empty caption.
#[test]
fn meteor_equals_the_jar_on_made_up_data() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/meteor/tiny");
    let expected: Value =
        serde_json::from_str(include_str!("../../data/meteor/tiny_expected.json")).unwrap();
    let got = score_pairs(&MeteorData::at(&dir).unwrap(), &expected["pairs"]);
    assert_jar_scores("made-up data", &got, &expected);
}

/// Flickr8k's test images: their id and their captions, PTB-tokenised as
/// pycocoevalcap tokenises them.
fn flickr8k_test(dir: &std::path::Path) -> Vec<(u64, Vec<Vec<String>>)> {
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dataset_flickr8k.json")).unwrap())
            .unwrap();
    data["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["split"] == "test")
        .map(|i| {
            let captions = i["sentences"].as_array().unwrap();
            let tokens = captions
                .iter()
                .map(|s| ptb_tokenize(s["raw"].as_str().unwrap()))
                .collect();
            (i["imgid"].as_u64().unwrap(), tokens)
        })
        .collect()
}

#[test]
fn meteor_equals_the_jar_on_flickr8k_human_and_generated_captions() {
    let (Some(data), Some(flickr8k)) = (meteor_data(), common::flickr8k()) else {
        return;
    };
    let test = flickr8k_test(&flickr8k);
    let expected = reference();
    let mut meteor = Meteor::load(&data).unwrap();
    for fold in expected["flickr8k_folds"].as_array().unwrap() {
        let j = fold["fold"].as_u64().unwrap() as usize;
        let (mut candidates, mut references) = (Vec::new(), Vec::new());
        for (_, caps) in test.iter().filter(|(_, c)| c.len() > j) {
            candidates.push(caps[j].clone());
            let others = caps.iter().enumerate().filter(|&(k, _)| k != j);
            references.push(others.map(|(_, c)| c.clone()).collect::<Vec<_>>());
        }
        let got = meteor.score_tokens(&candidates, &references).unwrap();
        assert_jar_scores(&format!("Flickr8k fold {j}"), &got, fold);
    }
    let by_id: HashMap<u64, &Vec<Vec<String>>> = test.iter().map(|(id, c)| (*id, c)).collect();
    for set in expected["generated"].as_array().unwrap() {
        let captions = set["captions"].as_array().unwrap();
        let candidates: Vec<Vec<String>> = captions
            .iter()
            .map(|c| ptb_tokenize(c[1].as_str().unwrap()))
            .collect();
        let references: Vec<Vec<Vec<String>>> = captions
            .iter()
            .map(|c| by_id[&c[0].as_u64().unwrap()].clone())
            .collect();
        let got = meteor.score_tokens(&candidates, &references).unwrap();
        assert_jar_scores(set["name"].as_str().unwrap(), &got, set);
    }
}

fn captune(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu"])
        .args(args)
        .env_remove("CAPTUNE_METEOR")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn score_reports_the_jars_meteor_and_says_where_its_data_is_missing() {
    let (Some(data), Some(flickr8k)) = (meteor_data(), common::flickr8k()) else {
        return;
    };
    let dir = common::fresh_temp("meteor-score");
    std::fs::create_dir_all(&dir).unwrap();
    let set = &reference()["generated"][0];
    let results: Vec<Value> = set["captions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| serde_json::json!({"image_id": c[0], "caption": c[1]}))
        .collect();
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string(&results).unwrap()).unwrap();
    let dataset = format!(
        "karpathy:{}",
        flickr8k.join("dataset_flickr8k.json").display()
    );
    let args = [
        "score",
        "--data",
        &dataset,
        "--results",
        path.to_str().unwrap(),
        "--json",
    ];
    let meteor_dir = data.dir.to_str().unwrap();
    for extra in [&["--meteor", meteor_dir][..], &[]] {
        let out = captune(&[&args[..], extra].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let scores: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (got, want) = (scores["METEOR"].as_f64(), set["corpus"].as_f64().unwrap());
        assert!(
            got.is_some_and(|g| (g - want).abs() <= 1e-12),
            "score {extra:?}: METEOR {got:?}, the jar {want}"
        );
    }
    // `none` leaves it out; a folder without the data is refused by name.
    let out = captune(&[&args[..], &["--meteor", "none"]].concat());
    let scores: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(scores.get("METEOR").is_none(), "{scores}");
    let empty = dir.join("no-meteor");
    std::fs::create_dir_all(&empty).unwrap();
    let out = captune(&[&args[..], &["--meteor", empty.to_str().unwrap()]].concat());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no-meteor") && err.contains("meteor-1.5.jar"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn validation_scores_its_greedy_captions_by_meteor() {
    let Some(meteor_data) = meteor_data() else {
        return;
    };
    let b = CpuBackend::new();
    let data = common::tiny_data();
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.eval_images = 6;
    let vocab = CaptionVocab::build(&data.data, config.train.min_count).unwrap();
    let mut ck = Checkpoint {
        model: Captioner::new(&b, config.captioner(common::TINY_DIM, vocab.len()), 4).unwrap(),
        vocab,
    };
    let (mut trainer, dir) =
        common::new_run(&b, &mut ck, &data, &config, "meteor-validation", None);
    trainer
        .score_meteor(Meteor::load(&meteor_data).unwrap())
        .unwrap();
    let mut reported = None;
    trainer
        .validate_now(&b, |e| {
            if let Event::Metrics(m) = e {
                reported = m.metrics.meteor;
            }
            Flow::Continue
        })
        .unwrap();
    drop(trainer);
    let items: Vec<usize> = data.items(Split::Val).into_iter().take(6).collect();
    let captions = caption_items(
        &b,
        &ck,
        &data,
        &items,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let mut meteor = Meteor::load(&meteor_data).unwrap();
    let apart = score_captions(&b, &data, &items, &captions, None, Some(&mut meteor)).unwrap();
    assert!(apart.meteor.is_some());
    assert_eq!(reported, apart.meteor);
    std::fs::remove_dir_all(dir).unwrap();
}
