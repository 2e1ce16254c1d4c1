//! The PyTorch package (`python/captune_torch`): its own test suite, run
//! where python3 imports torch (skipped, and counted as skipped,
//! elsewhere), with this build's captune binary; and its PTB tokenisation
//! against captune's on captions of every shape, Flickr8k's among them
//! when the data set is there.

use crate::common;

use captune::data::tokenize::ptb_tokenize;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn the_package_passes_its_tests() {
    let Some(python) = common::python_with_torch() else {
        return;
    };
    let out = Command::new(python)
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v"])
        .current_dir(common::python_dir())
        .env("CAPTUNE_BIN", env!("CARGO_BIN_EXE_captune"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "the package's tests failed");
    // A package test that skips (Flickr8k's CIDEr-D without
    // $CAPTUNE_FLICKR8K) says why in the output above.
    if text.contains("skipped") {
        common::skip("a part of the package's tests skipped (see its output)");
    }
}

/// Raw captions: every punctuation and clitic rule's case, random
/// strings over the characters the rules look at (and some beyond
/// ASCII, a control character Python calls a space and a no-break space
/// among them), and Flickr8k's when `$CAPTUNE_FLICKR8K` is set.
fn captions() -> Vec<String> {
    let mut out: Vec<String> = [
        "A Dog runs, jumps; and BARKS!",
        "\"Quoted\" words... here -- and `there'",
        "Don't, can't, won't; the dogs' bowls, I cannot, I'm gonna",
        "3.5 miles, 1,000 people at 12:30. costs $5 or 50%",
        "Mr. Smith in the U.S. army. a [big] dog (A cat.) {Maybe}",
        "a café's crème-brûlée... 'twas",
    ]
    .map(String::from)
    .to_vec();
    let alphabet: Vec<char> = "ab1 .,:;!?'\"-`$%()[]{}n'té\t\u{1c}\u{a0}"
        .chars()
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..2000 {
        let len = rng.random_range(0..24);
        out.push(
            (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect(),
        );
    }
    if let Some(dir) = std::env::var("CAPTUNE_FLICKR8K")
        .ok()
        .filter(|d| !d.is_empty())
    {
        let text = std::fs::read_to_string(format!("{dir}/dataset_flickr8k.json")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        for image in doc["images"].as_array().unwrap() {
            for s in image["sentences"].as_array().unwrap() {
                out.push(s["raw"].as_str().unwrap().to_string());
            }
        }
    }
    out
}

#[test]
fn the_package_tokenises_as_captune_does() {
    let Some(python) = common::python_with_torch() else {
        return;
    };
    let captions = captions();
    let mut child = Command::new(python)
        .args([
            "-c",
            "import json, sys\nfrom captune_torch.tokenize import ptb_tokenize\n\
             print(json.dumps([ptb_tokenize(c) for c in json.load(sys.stdin)]))",
        ])
        .current_dir(common::python_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = serde_json::to_vec(&captions).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let theirs: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), captions.len());
    for (raw, tokens) in captions.iter().zip(&theirs) {
        assert_eq!(&ptb_tokenize(raw), tokens, "{raw:?}");
    }
}
