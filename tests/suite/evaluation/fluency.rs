//! GPT-2 perplexity of captions against transformers
//! (`tests/data/gpt2_tiny_perplexity.json`, made by
//! `scripts/perplexity_fixtures.py` in float64 from `tests/data/gpt2-tiny`):
//! each caption's negative log-likelihood and scored tokens, and the mean
//! and corpus perplexities, on both backends.

use crate::common;

use captune::backend::Backend;
use captune::cpu::CpuBackend;
use captune::metrics::fluency::perplexity;
use captune::model::gpt2_lm::Gpt2Lm;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn agrees_with_transformers<B: Backend>(b: &B, backend: &str) {
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("gpt2_tiny_perplexity.json")).unwrap())
            .unwrap();
    let cases = fixture["captions"].as_array().unwrap();
    let texts: Vec<String> = cases
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    let lm = Gpt2Lm::load(b, &data("gpt2-tiny")).unwrap();
    let got = lm.score(b, &texts).unwrap();
    for (case, l) in cases.iter().zip(&got) {
        let (nll, tokens) = (
            case["nll"].as_f64().unwrap(),
            case["tokens"].as_u64().unwrap(),
        );
        assert_eq!(
            l.tokens as u64, tokens,
            "{backend}: tokens of {:?}",
            case["text"]
        );
        assert!(
            (l.nll - nll).abs() <= 1e-5 * nll.max(1.0),
            "{backend}: {:?} has NLL {} against transformers' {nll}",
            case["text"],
            l.nll
        );
    }
    let ppl = perplexity(&got).unwrap();
    for (name, value) in [("mean", ppl.mean), ("corpus", ppl.corpus)] {
        let want = fixture[name].as_f64().unwrap();
        assert!(
            (value - want).abs() <= 1e-5 * want,
            "{backend}: {name} perplexity {value} against transformers' {want}"
        );
    }
    assert_eq!(
        ppl.captions,
        texts.len() - 1,
        "the empty caption is not scored"
    );
}

#[test]
fn gpt2_perplexity_equals_transformers() {
    agrees_with_transformers(&CpuBackend::new(), "CPU");
    if let Some(g) = common::gpu() {
        agrees_with_transformers(&g, "GPU");
    }
}
