//! BLEU, CIDEr-D and ROUGE-L against pycocoevalcap's own values
//! (`tests/data/coco_reference_flickr8k.json`, made by
//! `scripts/coco_reference.py`) on Flickr8k test with leave-one-out human
//! captions as candidates, and the diversity metrics on hand-made sets.

use crate::common;

use captune::data::tokenize::ptb_tokenize;
use captune::metrics::diversity::{diversity, mean_length, vocabulary_usage};
use captune::metrics::{bleu, cider::CiderD, coco_scores, rouge};

#[test]
fn coco_metrics_equal_pycocoevalcap_on_flickr8k_test() {
    let Some(flickr8k) = common::flickr8k() else {
        return;
    };
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(flickr8k.join("dataset_flickr8k.json")).unwrap(),
    )
    .unwrap();
    let test: Vec<Vec<Vec<String>>> = data["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["split"] == "test")
        .map(|i| {
            i["sentences"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| ptb_tokenize(s["raw"].as_str().unwrap()))
                .collect()
        })
        .collect();
    let expected: serde_json::Value =
        serde_json::from_str(include_str!("../../data/coco_reference_flickr8k.json")).unwrap();
    for fold in expected["folds"].as_array().unwrap() {
        let j = fold["fold"].as_u64().unwrap() as usize;
        let mut candidates = Vec::new();
        let mut references = Vec::new();
        for caps in test.iter().filter(|c| c.len() > j) {
            candidates.push(caps[j].clone());
            references.push(
                caps.iter()
                    .enumerate()
                    .filter(|&(k, _)| k != j)
                    .map(|(_, c)| c.clone())
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(candidates.len() as u64, fold["images"].as_u64().unwrap());
        let got = serde_json::to_value(coco_scores(&candidates, &references)).unwrap();
        for key in ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr-D", "ROUGE-L"] {
            let (g, w) = (got[key].as_f64().unwrap(), fold[key].as_f64().unwrap());
            assert!(
                (g - w).abs() <= 1e-6,
                "fold {j} {key}: captune {g}, pycocoevalcap {w}"
            );
        }
    }
}

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

#[test]
fn bleu_cider_and_rouge_on_cases_with_known_answers() {
    let refs = vec![words("a red circle on the left"), words("a circle")];
    // A candidate equal to a reference: every BLEU is 1.
    let exact = bleu::sentence_bleu(&words("a red circle on the left"), &refs);
    assert!(exact.iter().all(|&b| (b - 1.0).abs() < 1e-9), "{exact:?}");
    // "a circle" (2 words, closest reference 2): p1 = p2 = 1. It has no
    // 3-grams, so p3 = 1e-15 / 1e-9 (pycocoevalcap's smoothing) and
    // BLEU-3 = (1e-6)^(1/3).
    let short = bleu::sentence_bleu(&words("a circle"), &refs);
    assert!((short[0] - 1.0).abs() < 1e-8 && (short[1] - 1.0).abs() < 1e-8);
    assert!((short[2] - 0.01).abs() < 1e-8, "{short:?}");
    // Brevity: "red" vs closest reference length 2 gives exp(1 - 2) for BLEU-1.
    let brief = bleu::sentence_bleu(&words("red"), &[words("red circle")]);
    assert!((brief[0] - (-1.0f64).exp()).abs() < 1e-6, "{brief:?}");
    // ROUGE-L: LCS("a blue circle", "a red circle on the left") = 2;
    // P = 2/3 (max over refs: "a circle" also gives 2/3), R = max(2/6, 2/2) = 1.
    let r = rouge::rouge_l(&words("a blue circle"), &refs);
    let (p, rc, b2) = (2.0 / 3.0, 1.0, 1.44);
    assert!((r - (1.0 + b2) * p * rc / (rc + b2 * p)).abs() < 1e-12);
    // CIDEr-D is 10 for a candidate identical to the only reference of one
    // image among two that differ (cosine 1 at every n), 7.5 when it is
    // only 3 words long (no 4-grams: that order scores 0), and 0 when
    // nothing matches.
    let corpus = vec![
        vec![words("a big red circle")],
        vec![words("two blue squares")],
    ];
    let cider = CiderD::new(&corpus);
    assert!((cider.score(&words("a big red circle"), &corpus[0]) - 10.0).abs() < 1e-9);
    let three = CiderD::new(&[vec![words("a red circle")], vec![words("two blue squares")]]);
    assert!((three.score(&words("a red circle"), &[words("a red circle")]) - 7.5).abs() < 1e-9);
    assert_eq!(cider.score(&words("green star"), &corpus[0]), 0.0);
    let ranked = [
        cider.score(&words("a big red circle"), &corpus[0]),
        cider.score(&words("a big red circle on a mat"), &corpus[0]),
        cider.score(&words("a red circle"), &corpus[0]),
    ];
    assert!(ranked[0] > ranked[1] && ranked[1] > 0.0 && ranked[2] > 0.0);
}

#[test]
fn diversity_metrics_count_what_they_say() {
    let same = vec![vec![words("a red circle"); 5]];
    let d = diversity(&same);
    assert!((d.div1 - 3.0 / 15.0).abs() < 1e-12);
    assert!((d.div2 - 2.0 / 15.0).abs() < 1e-12);
    // Identical 3-word captions: p1..p3 = 1 and, with no 4-grams,
    // p4 = 1e-6 as pycocoevalcap smooths it.
    assert!((d.mbleu4 - 1e-6f64.powf(0.25)).abs() < 1e-8, "{d:?}");
    let long_same = vec![vec![words("a big red circle on the left"); 5]];
    assert!(
        (diversity(&long_same).mbleu4 - 1.0).abs() < 1e-9,
        "identical captions: mBLEU-4 = 1"
    );
    let varied = vec![vec![
        words("a big red circle on the left"),
        words("two small blue squares at the top"),
        words("one green star"),
        words("a yellow triangle below a circle"),
        words("striped shapes on grey"),
    ]];
    let v = diversity(&varied);
    assert!(v.div1 > 0.8 && v.mbleu4 < 0.1, "{v:?}");
    let all: Vec<Vec<&str>> = varied[0].clone();
    assert_eq!(vocabulary_usage(&all), 22);
    assert!((mean_length(&all) - 27.0 / 5.0).abs() < 1e-12);
    // An image whose captions are all empty has no n-grams: it counts as
    // 0 in the mean over images, not as 0 / 0.
    let with_empty = vec![vec![words(""), words("")], vec![words("a b"), words("a c")]];
    let e = diversity(&with_empty);
    assert_eq!(
        (e.div1, e.div2),
        (3.0 / 4.0 / 2.0, 2.0 / 4.0 / 2.0),
        "{e:?}"
    );
    assert!(e.mbleu4.is_finite(), "{e:?}");
}

/// Asserts `got` within 1e-9 of pycocoevalcap's `want`, relatively: a
/// BLEU of 3e-16 (nothing matched) must not be 9e-16.
fn assert_near(got: f64, want: &serde_json::Value, what: &str) {
    let want = want.as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-9 * want.abs() + 1e-30,
        "{what}: captune {got}, pycocoevalcap {want}"
    );
}

#[test]
fn metrics_equal_pycocoevalcap_on_brevity_tied_lengths_repeats_and_an_empty_reference() {
    // tests/data/metric_cases_reference.json, from scripts/metric_cases_reference.py.
    let expected: serde_json::Value =
        serde_json::from_str(include_str!("../../data/metric_cases_reference.json")).unwrap();
    for (name, case) in expected["corpora"].as_object().unwrap() {
        let candidates: Vec<Vec<&str>> = case["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| words(c.as_str().unwrap()))
            .collect();
        let references: Vec<Vec<Vec<&str>>> = case["references"]
            .as_array()
            .unwrap()
            .iter()
            .map(|refs| {
                refs.as_array()
                    .unwrap()
                    .iter()
                    .map(|r| words(r.as_str().unwrap()))
                    .collect()
            })
            .collect();
        let scores = coco_scores(&candidates, &references);
        let bleu = [scores.bleu1, scores.bleu2, scores.bleu3, scores.bleu4];
        for n in 0..4 {
            assert_near(
                bleu[n],
                &case["bleu"][n],
                &format!("{name}: BLEU-{}", n + 1),
            );
        }
        assert_near(scores.cider_d, &case["cider"], &format!("{name}: CIDEr-D"));
        assert_near(scores.rouge_l, &case["rouge"], &format!("{name}: ROUGE-L"));
        let cider = CiderD::new(&references);
        for (k, (c, refs)) in candidates.iter().zip(&references).enumerate() {
            let sentence = bleu::sentence_bleu(c, refs);
            for n in 0..4 {
                assert_near(
                    sentence[n],
                    &case["sentence_bleu"][k][n],
                    &format!("{name}: candidate {k}'s BLEU-{}", n + 1),
                );
            }
            assert_near(
                cider.score(c, refs),
                &case["cider_sentences"][k],
                &format!("{name}: candidate {k}'s CIDEr-D"),
            );
            assert_near(
                rouge::rouge_l(c, refs),
                &case["rouge_sentences"][k],
                &format!("{name}: candidate {k}'s ROUGE-L"),
            );
        }
    }
    // The cases reach the branches they are for: a brevity penalty on
    // the first corpus, and none on the tied one (its first candidate's
    // words all appear in its references, so its BLEU-1 is 1 unless a
    // penalty applies).
    let brevity = &expected["corpora"]["brevity"]["bleu"][0];
    assert!(brevity.as_f64().unwrap() < 0.5, "{brevity}");
    let tied = &expected["corpora"]["tied_lengths"]["sentence_bleu"][0][0];
    assert!((tied.as_f64().unwrap() - 1.0).abs() < 1e-6, "{tied}");
}

#[test]
fn diversity_equals_a_reference_computation() {
    let expected: serde_json::Value =
        serde_json::from_str(include_str!("../../data/metric_cases_reference.json")).unwrap();
    let div = &expected["diversity"];
    let sets: Vec<Vec<Vec<&str>>> = div["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|set| {
            set.as_array()
                .unwrap()
                .iter()
                .map(|c| words(c.as_str().unwrap()))
                .collect()
        })
        .collect();
    let d = diversity(&sets);
    assert_near(d.div1, &div["div1"], "Div-1");
    assert_near(d.div2, &div["div2"], "Div-2");
    assert_near(d.mbleu4, &div["mbleu4"], "mBLEU-4");
}
