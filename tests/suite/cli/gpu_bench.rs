//! `scripts/gpu_bench.sh`, which takes every real-GPU figure in one call
//! of the device machine, rehearsed here: `--rehearse --quick` runs its
//! steps on lavapipe with this build's binary, and leaves its four files
//! with a record for every step; on a machine with no hardware GPU the
//! real run stops at its preflight, measuring nothing. (Linux only: the
//! script is for the device machine, a Linux one.)
#![cfg(target_os = "linux")]

use crate::common;

use captune::gpu::adapter;
use std::path::{Path, PathBuf};
use std::process::Command;

fn temp(name: &str) -> PathBuf {
    crate::common::fresh_temp(&format!("gpu-bench-{name}"))
}

fn gpu_bench(out: &Path, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg("scripts/gpu_bench.sh")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CAPTUNE", env!("CARGO_BIN_EXE_captune"))
        .env("OUT", out)
        .output()
        .unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_rehearsal_records_every_step_and_sums_up_each_pair() {
    if common::gpu().is_none() {
        return;
    }
    let out = temp("rehearsal");
    let _ = std::fs::remove_dir_all(&out);
    let done = gpu_bench(&out, &["--rehearse", "--quick"]);
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(
        files(&out),
        ["adapter.txt", "log.txt", "records.json", "summary.txt"]
    );
    let adapter = std::fs::read_to_string(out.join("adapter.txt")).unwrap();
    assert!(adapter.contains("device type:"), "{adapter}");
    let records: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("records.json")).unwrap()).unwrap();
    let names: Vec<&str> = records
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        names,
        [
            "decode-shapes-captune-1",
            "decode-shapes-torch-1",
            "kernels-captune",
            "kernels-torch",
            "matmuls-captune",
            "train-shapes-captune-1",
            "train-shapes-torch-1"
        ],
        "serde_json's map is sorted"
    );
    // Each captune step ran on the GPU and measured something.
    for (name, key) in [
        ("kernels-captune", "gflops"),
        ("train-shapes-captune-1", "tokens_per_s"),
        ("decode-shapes-captune-1", "tokens_per_s"),
    ] {
        let r = &records[name];
        assert_eq!(r["exit"], 0, "{name}: {r}");
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{name}: {r}");
        let first = &r["output"][0];
        assert_eq!(first["backend"], "gpu", "{name}: {r}");
        assert!(first[key].as_f64().unwrap() > 0.0, "{name}: {r}");
    }
    // The first alternation profiles one more step kernel by kernel: one
    // time per dispatch, so the profile's dispatches are the step's.
    let synthetic = &records["train-shapes-captune-1"]["output"][0];
    assert_eq!(synthetic["workload"], "synthetic");
    let profile = &synthetic["kernels"];
    let kernels = profile["kernels"].as_array().unwrap();
    let dispatches: u64 = kernels
        .iter()
        .map(|k| k["dispatches"].as_u64().unwrap())
        .sum();
    assert_eq!(
        dispatches,
        synthetic["per_step"]["dispatches"].as_u64().unwrap(),
        "{profile}"
    );
    let seconds: f64 = kernels.iter().map(|k| k["seconds"].as_f64().unwrap()).sum();
    assert!(
        seconds > 0.0 && (seconds - profile["seconds"].as_f64().unwrap()).abs() < 1e-9,
        "{profile}"
    );
    assert!(
        kernels
            .iter()
            .any(|k| k["kernel"].as_str().unwrap().starts_with("matmul/")),
        "{profile}"
    );
    // Every matmul kernel on every product, each right, one of them the plan's.
    let variants = records["matmuls-captune"]["output"].as_array().unwrap();
    let kernels = captune::gpu::MatmulTile::ALL.len();
    assert_eq!(variants.len(), 19 * kernels, "19 products, every kernel");
    for v in variants {
        assert!(v["relative_error"].as_f64().unwrap() < 1e-5, "{v}");
    }
    for product in variants.chunks(kernels) {
        let planned = product.iter().filter(|v| v["planned"] == true).count();
        assert_eq!(planned, 1, "{product:?}");
    }
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(
        said.contains(summary.trim_end()),
        "the summary is printed: {said}"
    );
    let pairs = ["train-shapes", "decode-shapes"];
    if common::python_with_torch().is_some() {
        for pair in pairs {
            let line = summary.lines().find(|l| l.starts_with(pair)).unwrap();
            let ratio: f64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
            let (ours, theirs): (f64, f64) = {
                let f: Vec<f64> = (line.split_whitespace().skip(2).take(2))
                    .map(|x| x.parse().unwrap())
                    .collect();
                (f[0], f[1])
            };
            assert!(
                (ratio - ours / theirs).abs() < 1e-3 * ratio.max(1.0),
                "{line}"
            );
        }
        assert!(summary.contains("matmul 256^3"), "{summary}");
        assert!(
            summary.ends_with("7 steps, 0 failed or skipped\n"),
            "{summary}"
        );
    } else {
        // Without PyTorch its steps fail, and their pairs say so.
        for pair in pairs {
            let line = summary.lines().find(|l| l.starts_with(pair)).unwrap();
            assert!(line.contains("failed"), "{line}");
        }
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The real run, here, where the only adapter is software: it stops at
/// the preflight and says why, with the adapter's description kept.
#[test]
fn without_a_hardware_gpu_the_run_stops_before_measuring() {
    let backends = adapter::backends_from_env().unwrap();
    if (adapter::adapters(backends).iter()).any(|a| adapter::is_hardware(&a.get_info())) {
        common::skip("a hardware GPU is here: the real run would measure it, minutes long");
        return;
    }
    let out = temp("preflight");
    let _ = std::fs::remove_dir_all(&out);
    let done = gpu_bench(&out, &[]);
    let said = String::from_utf8_lossy(&done.stdout);
    assert_eq!(done.status.code(), Some(3), "{said}");
    assert!(said.contains("found no usable GPU adapter"), "{said}");
    assert_eq!(files(&out), ["adapter.txt", "log.txt"]);
    std::fs::remove_dir_all(&out).unwrap();
}
