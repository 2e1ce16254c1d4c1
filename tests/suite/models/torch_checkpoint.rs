//! PyTorch checkpoints read without running code, against the tensors
//! PyTorch itself saved (`scripts/torch_checkpoint_fixtures.py`,
//! tests/data/torch/): dtypes, strided and shared views, a module's state
//! dict nested in a training checkpoint; and the files it must refuse.

use captune::tensorfile::{self, TensorFile};
use captune::torch_checkpoint::read_state_dict;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(name)
}

/// The error reading `path` (with `key`) gives, in full.
fn refusal(path: &std::path::Path, key: Option<&str>) -> String {
    match read_state_dict(path, key) {
        Ok(_) => panic!("{} read", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

fn assert_same(got: &TensorFile, want: &TensorFile) {
    let mut names: Vec<&String> = got.tensors.keys().collect();
    names.sort();
    let mut wanted: Vec<&String> = want.tensors.keys().collect();
    wanted.sort();
    assert_eq!(names, wanted);
    for (name, w) in &want.tensors {
        let g = &got.tensors[name];
        assert_eq!(g.shape, w.shape, "{name}");
        assert_eq!(g.data, w.data, "{name}");
    }
}

#[test]
fn a_state_dict_reads_as_pytorch_saved_it() {
    let got = read_state_dict(&data("state_dict.pt"), None).unwrap();
    let want = tensorfile::read(&data("state_dict_expected.safetensors")).unwrap();
    assert_same(&got, &want);
    // The transposed view is not its storage's order.
    let (w, t) = (
        &got.tensors["encoder.weight"],
        &got.tensors["encoder.weight_t"],
    );
    assert_eq!(
        (w.shape.as_slice(), t.shape.as_slice()),
        ([4, 6].as_slice(), [6, 4].as_slice())
    );
    assert_eq!(t.data[1], w.data[6]);
}

#[test]
fn a_training_checkpoint_gives_the_state_dict_it_holds() {
    let want = tensorfile::read(&data("nested_expected.safetensors")).unwrap();
    assert_same(&read_state_dict(&data("nested.pt"), None).unwrap(), &want);
    assert_same(
        &read_state_dict(&data("nested.pt"), Some("model")).unwrap(),
        &want,
    );
    let message = refusal(&data("nested.pt"), Some("epoch"));
    assert!(
        message.contains("an int, not a dict of tensors"),
        "{message}"
    );
    let message = refusal(&data("nested.pt"), Some("optimizer"));
    assert!(
        message.contains("nested.pt")
            && message.contains("no entry \"optimizer\"")
            && message.contains("\"epoch\""),
        "{message}"
    );
}

/// A pickle that would run code when PyTorch loads it is refused by the
/// name of what it calls; so is a whole module.
#[test]
fn checkpoints_that_need_code_are_refused_by_name() {
    for (file, names) in [
        ("malicious.pt", "posix.system"),
        ("module.pt", "torch.nn.modules.linear.Linear"),
    ] {
        let message = refusal(&data(file), None);
        assert!(
            message.contains(file) && message.contains(names) && message.contains("state_dict()"),
            "{message}"
        );
    }
}

/// What a file claims is checked before it is believed: a storage's
/// element count against its entry, a view's reach against its storage,
/// an integer against what float32 holds exactly; and the format of
/// PyTorch before 1.6 is named.
#[test]
fn claims_a_file_cannot_back_are_refused_with_the_reason() {
    let w = &read_state_dict(&data("one_matrix.pt"), None)
        .unwrap()
        .tensors["w"];
    assert_eq!(w.shape, [4, 6]);
    assert_eq!(w.data, (0..24).map(|i| i as f32).collect::<Vec<_>>());
    for (file, reason) in [
        ("lying_storage.pt", "claims 99 elements, but"),
        ("past_storage.pt", "reaches past its storage of 24"),
        ("big_int.pt", "integer 16777217 has no exact float32"),
        ("legacy.pt", "saved by PyTorch before 1.6"),
    ] {
        let message = refusal(&data(file), None);
        assert!(
            message.contains(file) && message.contains(reason),
            "{message}"
        );
    }
}

#[test]
fn a_truncated_checkpoint_is_an_error_naming_it() {
    let dir = crate::common::fresh_temp("torch-truncated");
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(data("state_dict.pt")).unwrap();
    for keep in [0, 10, bytes.len() / 2, bytes.len() - 30] {
        let path = dir.join("cut.pt");
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let message = refusal(&path, None);
        assert!(
            message.contains("cut.pt") && !message.contains("before 1.6"),
            "{keep} bytes: {message}"
        );
    }
    // A plain pickle (`pickle.dump` of a dict) is neither format.
    let path = dir.join("plain.pkl");
    std::fs::write(&path, b"\x80\x02}q\x00.").unwrap();
    let message = refusal(&path, None);
    assert!(
        message.contains("plain.pkl: not a zip archive") && !message.contains("before 1.6"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
