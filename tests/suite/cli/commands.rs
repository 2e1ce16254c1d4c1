//! The `captune` binary: device selection, its errors, `info` and `bench kernels --json`.

use crate::common;

use std::process::{Command, Output};

fn captune(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_captune"));
    cmd.args(args)
        .env_remove("CAPTUNE_DEVICE")
        .env_remove("CAPTUNE_WGPU_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the captune binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn cpu_device_is_chosen_when_asked_for_and_explained() {
    let out = captune(&["--device", "cpu", "info"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("backend: cpu"), "{stdout}");
    assert!(stdout.contains("why: --device cpu"), "{stdout}");
}

/// Without a display (an ssh session), listing the GPU adapters prints
/// no display errors: Mesa's device-selection layer would print
/// libwayland's two `XDG_RUNTIME_DIR` lines on every enumeration.
#[test]
fn a_machine_without_a_display_gets_no_display_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu", "info"])
        .env_remove("CAPTUNE_DEVICE")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("XDG_RUNTIME_DIR"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn device_can_come_from_the_environment() {
    let out = captune(&["info", "--json"], &[("CAPTUNE_DEVICE", "cpu")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["backend"], "cpu");
}

#[test]
fn auto_says_which_backend_it_chose_and_why() {
    let out = captune(&["info", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let adapters = info["adapters"].as_array().unwrap();
    let hardware = adapters
        .iter()
        .any(|a| a["device_type"] != "Cpu" && a["device_type"] != "Other");
    assert_eq!(
        info["backend"],
        if hardware { "gpu" } else { "cpu" },
        "{info}"
    );
    assert!(!info["reason"].as_str().unwrap().is_empty());
    for a in adapters {
        for key in [
            "name",
            "backend",
            "driver",
            "max_storage_buffers_per_shader_stage",
            "timestamp_query",
        ] {
            assert!(a.get(key).is_some(), "adapter report lacks {key}: {a}");
        }
    }
}

#[test]
fn gpu_without_an_adapter_is_a_clear_error_with_the_fix() {
    // No DX12 on Linux, so no adapter can be found on it.
    if !cfg!(target_os = "linux") {
        return;
    }
    let out = captune(
        &["--device", "gpu", "info"],
        &[("CAPTUNE_WGPU_BACKEND", "dx12")],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no GPU adapter found"), "{stderr}");
    assert!(stderr.contains("mesa-vulkan-drivers"), "{stderr}");
    assert!(stderr.contains("--device cpu"), "{stderr}");
}

#[test]
fn unknown_wgpu_backend_names_the_valid_ones() {
    let out = captune(&["info"], &[("CAPTUNE_WGPU_BACKEND", "cuda")]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("CAPTUNE_WGPU_BACKEND=cuda")
            && stderr.contains("vulkan, metal, dx12 or gl"),
        "{stderr}"
    );
}

/// The devices a bench test asks for: the GPU whenever an adapter exists,
/// so that a failing GPU path fails the test rather than falling back to
/// the CPU unseen.
fn bench_devices() -> &'static str {
    if common::gpu().is_some() {
        "cpu,gpu"
    } else {
        "cpu"
    }
}

#[test]
fn bench_kernels_json_has_the_documented_records() {
    let devices = bench_devices();
    let out = captune(
        &[
            "--device",
            devices,
            "bench",
            "kernels",
            "--json",
            "--sizes",
            "64,96",
            "--elementwise-len",
            "10000",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let records: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let backends: Vec<&str> = devices.split(',').collect();
    assert_eq!(records.len(), 3 * backends.len(), "{records:?}");
    for r in &records {
        assert!(backends.contains(&r["backend"].as_str().unwrap()), "{r}");
        assert!(!r["adapter"].as_str().unwrap().is_empty());
        match r["op"].as_str().unwrap() {
            "matmul" => {
                assert_eq!(r["m"], r["n"]);
                assert_eq!(r["n"], r["k"]);
                assert!(r["gflops"].as_f64().unwrap() > 0.0, "{r}");
            }
            "axpby" => assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}"),
            other => panic!("unexpected op {other}"),
        }
    }
}

/// `bench matmuls` compares the GPU's kernels; asked of the CPU it says so.
#[test]
fn bench_matmuls_needs_a_gpu() {
    let out = captune(
        &["--device", "cpu", "bench", "matmuls", "--sizes", "tiny"],
        &[],
    );
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains("bench matmuls compares the GPU's matmul kernels")
            && said.contains("--device gpu"),
        "{said}"
    );
}

/// `bench decode` and `bench train` report their speed, and on the GPU
/// what a real GPU pays for (dispatches, submissions, readbacks, buffer
/// and bind-group creations) per decoded batch and per training step.
#[test]
fn bench_decode_and_train_count_what_a_gpu_pays_for() {
    let devices = bench_devices();
    for (what, args, counters) in [
        (
            "decode",
            vec!["decode", "--preset", "tiny", "--images", "8"],
            "per_batch",
        ),
        (
            "decode",
            vec![
                "decode", "--preset", "tiny", "--images", "8", "--decode", "beam:3",
            ],
            "per_batch",
        ),
        (
            "train",
            vec![
                "train",
                "--preset",
                "tiny",
                "--objectives",
                "mle",
                "--steps",
                "2",
                "--warmup",
                "2",
                "--captions",
                "synthetic",
            ],
            "per_step",
        ),
        (
            "scst",
            vec!["scst", "--preset", "tiny", "--steps", "1", "--warmup", "2"],
            "per_step",
        ),
    ] {
        let mut full = vec!["--device", devices, "bench"];
        full.extend(&args);
        full.extend(["--profile", "--json"]);
        let out = captune(&full, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let records: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(records.len(), devices.split(',').count(), "{records:?}");
        for r in &records {
            assert_eq!(r["op"], what, "{r}");
            let speed = match what {
                "decode" => "captions_per_s",
                "scst" => "steps_per_s",
                _ => "tokens_per_s",
            };
            if what == "scst" {
                let share = |k: &str| r[k].as_f64().unwrap();
                let shares = ["sampling_share", "rewards_share", "update_share"];
                assert!(
                    shares.iter().all(|k| share(k) > 0.0),
                    "every phase takes time: {r}"
                );
                let total: f64 = shares.iter().map(|k| share(k)).sum();
                assert!((total - 1.0).abs() < 1e-9, "{r}");
            }
            assert!(r[speed].as_f64().unwrap() > 0.0, "{r}");
            if r["backend"] == "gpu" {
                let c = &r[counters];
                let count = |key: &str| c[key].as_u64().unwrap();
                assert!(count("dispatches") > 0, "{r}");
                // `--profile`: one more step or batch, timed dispatch by
                // dispatch: the same dispatches as a timed one (an SCST
                // step's samples may end elsewhere), and a time for each.
                let profiled = &r["kernels"]["kernels"].as_array().unwrap();
                let dispatches: u64 = profiled
                    .iter()
                    .map(|k| k["dispatches"].as_u64().unwrap())
                    .sum();
                if what == "scst" {
                    assert!(dispatches > 0, "{r}");
                } else {
                    assert_eq!(dispatches, count("dispatches"), "{r}");
                }
                assert!(
                    profiled
                        .iter()
                        .all(|k| k["seconds"].as_f64().unwrap() > 0.0),
                    "{r}"
                );
                // Every matmul dispatch counted, with its workgroups.
                let min = r["matmul_workgroups_min"].as_u64().unwrap_or(0);
                let median = r["matmul_workgroups_median"].as_u64().unwrap_or(0);
                assert!(min >= 1 && median >= min, "{r}");
                assert!(r["matmul_dispatches"].as_u64().unwrap_or(0) >= 1, "{r}");
                // Pooled buffers: a step or a batch like the one before
                // creates none.
                assert_eq!(count("buffers_created"), 0, "{what}: {r}");
                if what == "train" {
                    // Cached bind groups: the same step binds the same buffers.
                    assert!(
                        count("bind_groups_created") * 10 <= count("dispatches"),
                        "{r}"
                    );
                    // One submission per step, nothing read back when not logging.
                    assert_eq!((count("submissions"), count("readbacks")), (1, 0), "{r}");
                    // Fused kernels: 23 dispatches per decoder layer (the
                    // tiny preset has one) and 31 around them, besides the
                    // second passes of split-K products
                    // (docs/internals.md, "Fused where a GPU pays").
                    let second_passes: u64 = profiled
                        .iter()
                        .filter(|k| {
                            let name = k["kernel"].as_str().unwrap();
                            name.ends_with("/split_sum") || name.ends_with("/split_epilogue")
                        })
                        .map(|k| k["dispatches"].as_u64().unwrap())
                        .sum();
                    assert!(count("dispatches") - second_passes <= 54, "{r}");
                } else if what == "scst" {
                    // Only the samples' and the greedy captions' decoding
                    // read back (and wait), twice each; the update reads
                    // nothing.
                    assert_eq!(count("readbacks"), 4, "{r}");
                } else {
                    // Greedy: the ids and their log-probabilities; beam
                    // search: the search's record. The end checks (23
                    // steps, every 4) are read without waiting.
                    let beam = args.contains(&"beam:3");
                    assert_eq!(count("readbacks"), if beam { 1 } else { 2 }, "{r}");
                    assert!((1..=5).contains(&count("async_reads")), "{r}");
                    // Parameter blocks sit at dynamic offsets: a batch binds
                    // the buffers of the one before, with few new groups.
                    assert!(
                        count("bind_groups_created") * 5 <= count("dispatches"),
                        "{r}"
                    );
                }
            } else {
                assert!(r[counters].is_null(), "the CPU counts nothing: {r}");
                // `--profile` on the CPU: each op's wall time, summing to
                // the profile's, products among them, and every group
                // sized by its work (a product's multiply-adds).
                let profile = &r["kernels"];
                let ops = profile["kernels"].as_array().unwrap();
                let seconds = |k: &serde_json::Value| k["seconds"].as_f64().unwrap();
                let sum: f64 = ops.iter().map(seconds).sum();
                assert!((sum - seconds(profile)).abs() <= 1e-9 * sum.max(1.0), "{r}");
                let matmuls: Vec<_> = (ops.iter())
                    .filter(|k| k["kernel"].as_str().unwrap().starts_with("matmul/"))
                    .collect();
                assert!(!matmuls.is_empty(), "a step has products: {r}");
                assert!(
                    (profile["groups"].as_array().unwrap().iter()).all(|g| g["work"]
                        .as_u64()
                        .unwrap()
                        > 0
                        && g["workgroups"].is_null()),
                    "{r}"
                );
            }
        }
    }
}

#[test]
fn bench_train_takes_the_registry_objectives_that_train_on_captions_alone() {
    let bench = |objective: &str| {
        let args = ["--device", "cpu", "bench", "train", "--preset", "tiny"];
        let mut args = args.to_vec();
        args.extend(["--objectives", objective, "--steps", "1", "--warmup", "0"]);
        args.extend(["--captions", "synthetic", "--json"]);
        captune(&args, &[])
    };
    let out = bench("no-such");
    assert!(!out.status.success());
    let why = text(&out.stderr);
    assert!(
        why.contains("no-such") && why.contains("smile-reverse"),
        "{why}"
    );
    let out = bench("discritune");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("needs a retriever"),
        "{}",
        text(&out.stderr)
    );
    // A rewarding objective scores each synthetic caption against itself.
    let out = bench("sle");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let records: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let objective = records[0]["objective"].as_str().unwrap();
    assert!(objective.starts_with("sle ("), "{}", records[0]);
}

/// The benchmarks time a config file's network over a synthetic
/// vocabulary of any size, at a batch given on the command line, and
/// report the process's peak memory; the parameter count is the one the
/// PyTorch scripts build from the same file.
#[test]
fn bench_takes_a_config_file_a_vocabulary_size_and_a_batch() {
    let dir = crate::common::fresh_temp("bench-config");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bench.toml");
    let tiny = std::fs::read_to_string("assets/presets/tiny.toml").unwrap();
    let model = |key: &str| -> usize {
        let line = tiny
            .lines()
            .find(|l| l.starts_with(&format!("{key} =")))
            .unwrap();
        line.split('=').nth(1).unwrap().trim().parse().unwrap()
    };
    let (k, hidden, w, layers, max_len) = (
        model("prefix_len"),
        model("mapper_hidden"),
        model("width"),
        model("layers"),
        model("max_len"),
    );
    std::fs::write(&config, &tiny).unwrap();
    let vocab = 300;
    let path = config.to_str().unwrap();
    for what in ["train", "decode", "scst"] {
        let mut args = vec!["--device", "cpu", "bench", what, "--config", path];
        args.extend(["--vocab", "300", "--json"]);
        if what != "decode" {
            args.extend(["--batch", "3"]);
        }
        args.extend(match what {
            "train" => vec![
                "--objectives",
                "mle",
                "--captions",
                "synthetic",
                "--steps",
                "1",
            ],
            "decode" => vec!["--images", "4"],
            _ => vec!["--steps", "1", "--warmup", "1"],
        });
        let out = captune(&args, &[]);
        assert!(out.status.success(), "{what}: {}", text(&out.stderr));
        let records: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        let r = &records[0];
        assert_eq!(r["preset"], path, "{r}");
        assert!(r["peak_memory_mib"].as_f64().unwrap() > 1.0, "{r}");
        match what {
            "train" => {
                assert_eq!(r["batch"], 3, "{r}");
                assert_eq!(r["tokens_per_step"], (3 * (max_len - 1)) as f64, "{r}");
                // The mapper, the tied embedding, the positions, the
                // blocks and the final layer norm, as PyTorch counts them.
                let block = 2 * 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + 8 * w * w + 5 * w;
                let expected = (128 * hidden + hidden)
                    + (hidden * k * w + k * w)
                    + vocab * w
                    + (k + max_len - 1) * w
                    + layers * block
                    + 2 * w;
                assert_eq!(r["parameters"], expected, "{r}");
            }
            "decode" => assert_eq!(r["captions"], 4, "{r}"),
            _ => assert_eq!(r["batch"], 3, "{r}"),
        }
    }
    let refused = |vocab: &str, why: &str| {
        let args = [
            "--device", "cpu", "bench", "train", "--config", path, "--vocab", vocab,
        ];
        let out = captune(&args, &[]);
        assert!(!out.status.success(), "--vocab {vocab}");
        assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
    };
    refused("4", "--vocab 4");
    // The shapes workload has its own words: a vocabulary size is refused there.
    refused("300", "--captions synthetic");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `data shapes`, then `retriever train`, `retriever eval --json` and
/// `embed` on a tiny shapes world in a private cache.
#[test]
fn shapes_data_retriever_train_eval_and_embed_from_the_command_line() {
    let dir = crate::common::fresh_temp("cli");
    let cache = dir.join("cache");
    let env = [("CAPTUNE_CACHE", cache.to_str().unwrap())];
    let shapes: &[&str] = &common::TINY_WORLD_ARGS;

    let out_dir = dir.join("look");
    let mut args = vec!["data", "shapes", "--out", out_dir.to_str().unwrap()];
    args.extend(shapes);
    let out = captune(&args, &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out_dir.join("dataset_shapes.json").is_file()
            && out_dir.join("images/test/00015.png").is_file()
    );
    assert!(
        text(&out.stdout).contains("\"oracle_t2i_r1\""),
        "{}",
        text(&out.stdout)
    );

    let ckpt = dir.join("r.safetensors");
    let mut args = vec![
        "--device",
        "cpu",
        "retriever",
        "train",
        "--data",
        "shapes",
        "--out",
        ckpt.to_str().unwrap(),
        "--epochs",
        "2",
        "--batch",
        "16",
        "--image-size",
        "32",
        "--width",
        "32",
        "--image-layers",
        "1",
        "--text-layers",
        "1",
        "--heads",
        "2",
        "--embed-dim",
        "16",
        "--warmup",
        "2",
    ];
    args.extend(shapes);
    let out = captune(&args, &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("epoch 2 loss"),
        "{}",
        text(&out.stderr)
    );

    let mut args = vec![
        "--device",
        "cpu",
        "retriever",
        "eval",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--split",
        "test",
        "--json",
    ];
    args.extend(shapes);
    let out = captune(&args, &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let recall: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10"] {
        let v = recall[key].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{key} = {v}");
    }
    assert!(recall["t2i_r1"].as_f64() <= recall["t2i_r10"].as_f64());

    let features = dir.join("f.safetensors");
    let mut args = vec![
        "--device",
        "cpu",
        "embed",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        features.to_str().unwrap(),
    ];
    args.extend(shapes);
    let out = captune(&args, &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let f = captune::data::features::Features::load(&features, None).unwrap();
    assert_eq!((f.ids.len(), f.dim), (80, 16));

    // A checkpoint that is not one: the file is named.
    let out = captune(
        &[
            "--device",
            "cpu",
            "retriever",
            "eval",
            "--checkpoint",
            features.to_str().unwrap(),
        ],
        &env,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("f.safetensors")
            && text(&out.stderr).contains("retriever_config"),
        "{}",
        text(&out.stderr)
    );
    captioner_commands(&dir, &ckpt, &out_dir, shapes, &env);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `train`, `eval`, `score`, `inspect` and `caption` with the retriever
/// `retriever` on the same tiny world (`look` holds its Karpathy file).
fn captioner_commands(
    dir: &std::path::Path,
    retriever: &std::path::Path,
    look: &std::path::Path,
    shapes: &[&str],
    env: &[(&str, &str)],
) {
    let run = dir.join("run");
    let r = retriever.to_str().unwrap();
    let mut args = vec![
        "--device",
        "cpu",
        "train",
        "--preset",
        "tiny",
        "--retriever",
        r,
        "--epochs",
        "2",
        "--objective",
        "smile",
        "--mle-weight",
        "0.1",
        "--batch",
        "12",
        "--out",
        run.to_str().unwrap(),
    ];
    args.extend(shapes);
    let out = captune(&args, env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("epoch 2 val"),
        "{}",
        text(&out.stderr)
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("objective = \"smile\"")
            && config.contains("mle_weight = 0.1")
            && config.contains("batch = 12"),
        "{config}"
    );

    let ck = run.join("checkpoint.safetensors");
    // `bench decode` with the captioner's own features: all its images,
    // fewer than the 1000 asked for.
    let features = dir.join("f.safetensors");
    let items = captune::data::features::Features::load(&features, None)
        .unwrap()
        .ids
        .len();
    let out = captune(
        &[
            "--device",
            "cpu",
            "bench",
            "decode",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--features",
            features.to_str().unwrap(),
            "--images",
            "1000",
            "--json",
        ],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(items < 1000);
    assert_eq!(record[0]["images"], items, "{record}");
    // `bench scst` with the captioner on the data and embeddings it was
    // trained on, from its record.
    let out = captune(
        &[
            "--device",
            "cpu",
            "bench",
            "scst",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--batch",
            "8",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--json",
        ],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record[0]["preset"], ck.to_str().unwrap(), "{record}");
    assert_eq!(record[0]["batch"], 8, "{record}");
    assert!(record[0]["steps_per_s"].as_f64().unwrap() > 0.0, "{record}");
    let gpt2 = format!(
        "hf:{}",
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/gpt2-tiny")
            .display()
    );
    // eval of the test split with the retriever into `results`, with `extra`.
    let eval = |results: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["--device", "cpu", "eval", "--checkpoint"];
        args.extend([ck.to_str().unwrap(), "--retriever", r, "--split", "test"]);
        args.extend(["--results", results.to_str().unwrap(), "--json"]);
        args.extend(extra);
        args.extend(shapes);
        captune(&args, env)
    };
    let results = dir.join("results.json");
    let out = eval(&results, &["--fluency", &gpt2]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "BLEU-1",
        "BLEU-4",
        "CIDEr-D",
        "ROUGE-L",
        "self_retrieval_r1",
        "self_retrieval_r5",
        "p1_among_100",
        "clipscore",
        "refcompare",
    ] {
        assert!(
            metrics[key].is_number(),
            "eval --json lacks {key}: {metrics}"
        );
    }
    // 16 images, fewer than 100: P@1 among 100 is the own image first
    // among all of them, as R@1 is.
    let share = |k: &str| metrics[k].as_f64().unwrap();
    assert_eq!(
        share("p1_among_100"),
        share("self_retrieval_r1"),
        "{metrics}"
    );
    assert!(
        share("self_retrieval_r1") <= share("self_retrieval_r5"),
        "{metrics}"
    );
    // Again: the retriever's embeddings of the references come from the
    // cache, the metrics are the same, and --timings says where time went.
    let out = eval(&dir.join("again.json"), &["--timings"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("reference embeddings from the cache"),
        "{stderr}"
    );
    assert!(
        stderr.contains("timings:") && stderr.contains("s  decoding"),
        "{stderr}"
    );
    let repeated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "self_retrieval_r1",
        "p1_among_100",
        "clipscore",
        "refcompare",
    ] {
        assert_eq!(repeated[key], metrics[key], "{key}");
    }
    let written: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(written.len(), 16);
    assert_caption_metrics(&look.join("dataset_shapes.json"), &written, &metrics);
    // Numeric ids are written as numbers, as pycocotools' loadRes expects.
    assert!(written[0]["image_id"].is_u64() && written[0]["caption"].is_string());

    // Five samples per image: the diversity metrics appear.
    let sample_results = dir.join("samples.json");
    let out = eval(&sample_results, &["--decode", "sample:5:t=1.2,seed=3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sampled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["div1", "div2", "mbleu4"] {
        let v = sampled[key].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{key} = {v}: {sampled}");
    }
    assert!(
        metrics["div1"].is_null(),
        "one greedy caption per image has no diversity"
    );

    // Scoring eval's own results reproduces eval's reference-based scores.
    let data = format!("karpathy:{}", look.join("dataset_shapes.json").display());
    let out = captune(
        &[
            "score",
            "--data",
            &data,
            "--split",
            "test",
            "--results",
            results.to_str().unwrap(),
            "--fluency",
            &gpt2,
            "--json",
        ],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let scores: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The GPT-2 reads the same captions in both: eval's, and score's of
    // eval's results file.
    for key in ["perplexity", "corpus_perplexity"] {
        let e = metrics[key].as_f64().unwrap_or(0.0);
        assert!(e > 1.0, "eval's {key} is {e}: {metrics}");
        assert_eq!(scores[key].as_f64(), Some(e), "score's {key}: {scores}");
    }
    for key in ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr-D", "ROUGE-L"] {
        let (s, e) = (
            scores[key].as_f64().unwrap(),
            metrics[key].as_f64().unwrap(),
        );
        assert!((s - e).abs() < 1e-9, "{key}: score {s}, eval {e}");
    }
    coco_tools_accept(look, &results, &metrics);
    // A results file naming an image outside the split is refused by name.
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"[{"image_id": "no-such-image", "caption": "a circle"}]"#,
    )
    .unwrap();
    let out = captune(
        &["score", "--data", &data, "--results", bad.to_str().unwrap()],
        env,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no-such-image"),
        "{}",
        text(&out.stderr)
    );
    // So is a --fluency folder that holds no GPT-2.
    let nowhere = dir.join("no-gpt2");
    let nowhere = format!("hf:{}", nowhere.display());
    let args = [
        "score",
        "--data",
        &data,
        "--results",
        results.to_str().unwrap(),
    ];
    let out = captune(&[&args[..], &["--fluency", &nowhere]].concat(), env);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--fluency") && text(&out.stderr).contains("no-gpt2"),
        "{}",
        text(&out.stderr)
    );

    let image = written[0]["image_id"].to_string();
    let image = image.as_str();
    // `inspect` of "A red circle." on that image, with `extra` options.
    let inspect = |extra: &[&str]| {
        let mut args = vec![
            "--device",
            "cpu",
            "inspect",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--retriever",
            r,
            "--image",
            image,
            "--caption",
            "A red circle.",
        ];
        args.extend(extra);
        args.extend(shapes);
        captune(&args, env)
    };
    let out = inspect(&["--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tokens: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let labels: Vec<&str> = tokens
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["a", "red", "circle", "<eos>"]);
    for t in &tokens {
        let (p_full, p_sub) = (
            t["p_full"].as_f64().unwrap(),
            t["p_subset"].as_f64().unwrap(),
        );
        assert!(
            p_sub >= p_full - 1e-6,
            "a subset never lowers the label's probability: {t}"
        );
        assert_eq!(t["top5_full"].as_array().unwrap().len(), 5);
        assert!(
            t["top5_subset"].as_array().unwrap().len() <= 4,
            "the subset has 4 tokens"
        );
    }
    // As an SLL-ME sample with the mean baseline: the reward, what it is
    // measured against, and each token's terms, which sum to its loss.
    let out = inspect(&[
        "--objective",
        "sll-me",
        "--baseline",
        "mean",
        "--samples",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(both["tokens"].as_array().unwrap().len(), 4);
    let e = &both["explanation"];
    let f = |k: &str| e[k].as_f64().unwrap();
    let others = e["compared_with"].as_array().unwrap();
    assert_eq!(others.len(), 2, "samples - 1 other samples: {e}");
    assert!(others.iter().all(|o| o["kind"] == "sample"), "{e}");
    let mean: f64 = others
        .iter()
        .map(|o| o["figures"]["reward"].as_f64().unwrap())
        .sum::<f64>()
        / 2.0;
    assert!((f("baseline") - mean).abs() < 1e-9, "{e}");
    for t in e["tokens"].as_array().unwrap() {
        // Each token's term carries the reward less the others' mean.
        let term = t["likelihood_term"].as_f64().unwrap();
        let want = -(f("reward") - mean) * t["logprob"].as_f64().unwrap();
        assert!((term - want).abs() < 1e-4 * want.abs().max(1.0), "{t}");
        assert!(
            t["entropy_term"].as_f64().unwrap() < 0.0,
            "a bonus lowers the loss: {t}"
        );
    }
    // A token-level objective has no reward to explain.
    let out = inspect(&["--objective", "smile"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--objective smile"),
        "{}",
        text(&out.stderr)
    );

    // As DiscriTune's caption: its rank among 8 candidates and up to 2
    // hard negatives, the reward that makes and each token's share of it.
    let out = inspect(&[
        "--objective",
        "discritune",
        "--hard-negatives",
        "2",
        "--candidates",
        "8",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &both["explanation"];
    let f = |k: &str| e[k].as_f64().unwrap();
    let candidates = e["figures"]["candidates"].as_f64().unwrap();
    // A hard negative already drawn counts once.
    assert!((8.0..=10.0).contains(&candidates), "{e}");
    common::assert_discritune_explanation(e);
    // Among 4 candidates all are shown, and their probabilities are the
    // whole softmax the reward is the log of.
    let few = inspect(&[
        "--objective",
        "discritune",
        "--hard-negatives",
        "0",
        "--candidates",
        "4",
        "--json",
    ]);
    assert!(few.status.success(), "{}", text(&few.stderr));
    let few: serde_json::Value = serde_json::from_slice(&few.stdout).unwrap();
    assert_eq!(few["explanation"]["figures"]["candidates"], 4.0, "{few}");
    common::assert_discritune_explanation(&few["explanation"]);
    if let Some(own) = e["compared_with"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "own image")
    {
        assert_eq!(own["what"].as_str(), Some(image.trim_matches('"')), "{e}");
    }
    let steps = e["tokens"].as_array().unwrap().len() as f64;
    for t in e["tokens"].as_array().unwrap() {
        let term = t["likelihood_term"].as_f64().unwrap();
        let want = -f("advantage") / steps * t["logprob"].as_f64().unwrap();
        assert!((term - want).abs() < 1e-4 * want.abs().max(1.0), "{t}");
    }
    discritune_run(dir, &ck, r, shapes, env);
    labelled_stages(dir, r, shapes, env);

    let png = look.join("images/test/00000.png");
    let out = captune(
        &[
            "--device",
            "cpu",
            "caption",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--retriever",
            r,
            png.to_str().unwrap(),
        ],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(
        line.starts_with(png.to_str().unwrap())
            && line
                .trim_end()
                .split('\t')
                .nth(1)
                .is_some_and(|c| !c.is_empty()),
        "{line}"
    );

    caption_takes_folders(dir, &ck, r, &look.join("images/test"), env);
    scoring_needs_only_references(dir, look, &results, &sample_results, env);
    features_must_be_the_captioners(dir, &ck, r, &png, &metrics, env);
    switching_to_scst_on_resume(&run, r, shapes, env);
    validating_the_saved_state(&run, r, shapes, env);
}

/// `train --resume --validate-only` appends the saved state's samples and
/// metrics records (its epoch and step) and changes nothing else; without
/// `--resume` it is refused.
fn validating_the_saved_state(
    run: &std::path::Path,
    retriever: &str,
    shapes: &[&str],
    env: &[(&str, &str)],
) {
    let read = |f: &str| std::fs::read(run.join(f)).unwrap();
    let records = |f: &str| -> Vec<serde_json::Value> {
        String::from_utf8(read(f))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (log, checkpoint, optimizer) = (
        read("log.jsonl"),
        read("checkpoint.safetensors"),
        read("optimizer.safetensors"),
    );
    let (metrics, samples) = (records("metrics.jsonl"), records("samples.jsonl"));
    let mut args = vec!["--device", "cpu", "train", "--resume", "--out"];
    args.extend([
        run.to_str().unwrap(),
        "--retriever",
        retriever,
        "--validate-only",
    ]);
    args.extend(shapes);
    let out = captune(&args, env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(read("log.jsonl"), log);
    assert_eq!(read("checkpoint.safetensors"), checkpoint);
    assert_eq!(read("optimizer.safetensors"), optimizer);
    let position = |r: &serde_json::Value| (r["epoch"].clone(), r["step"].clone());
    let (now, last) = (records("metrics.jsonl"), metrics.last().unwrap());
    assert_eq!(now.len(), metrics.len() + 1);
    assert_eq!(position(now.last().unwrap()), position(last));
    assert_eq!(now.last().unwrap()["CIDEr-D"], last["CIDEr-D"]);
    let new_samples = &records("samples.jsonl")[samples.len()..];
    assert!(!new_samples.is_empty());
    assert!(new_samples.iter().all(|r| position(r) == position(last)));
    let fresh = captune(
        &["train", "--out", run.to_str().unwrap(), "--validate-only"],
        env,
    );
    assert!(!fresh.status.success());
    assert!(
        text(&fresh.stderr).contains("--resume"),
        "{}",
        text(&fresh.stderr)
    );
}

/// `caption FOLDER` captions every PNG and JPEG file in the folder, in
/// name order; a folder without one is refused, naming it.
fn caption_takes_folders(
    dir: &std::path::Path,
    ck: &std::path::Path,
    retriever: &str,
    folder: &std::path::Path,
    env: &[(&str, &str)],
) {
    let mut want: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .map(|p| p.display().to_string())
        .collect();
    want.sort();
    assert!(want.len() > 1);
    let caption = |what: &std::path::Path| {
        let args = ["--device", "cpu", "caption", "--checkpoint"];
        let mut args: Vec<&str> = args.to_vec();
        args.extend([ck.to_str().unwrap(), "--retriever", retriever]);
        args.push(what.to_str().unwrap());
        captune(&args, env)
    };
    let out = caption(folder);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let captioned: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect();
    assert_eq!(captioned, want);
    let empty = dir.join("no-images");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "not an image").unwrap();
    let out = caption(&empty);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no-images") && text(&out.stderr).contains("no PNG or JPEG"),
        "{}",
        text(&out.stderr)
    );
}

/// `train --resume --objective scst` continues a SMILE run with SCST:
/// the folder's config says so, and the new log lines carry the rewards.
fn switching_to_scst_on_resume(
    run: &std::path::Path,
    retriever: &str,
    shapes: &[&str],
    env: &[(&str, &str)],
) {
    let mut args = vec![
        "--device",
        "cpu",
        "train",
        "--resume",
        "--out",
        run.to_str().unwrap(),
        "--retriever",
        retriever,
        "--objective",
        "scst",
        "--baseline",
        "mean",
        "--epochs",
        "1",
    ];
    args.extend(shapes);
    // A resumed run keeps its batch size.
    let mut other_batch = args.clone();
    other_batch.extend(["--batch", "8"]);
    let out = captune(&other_batch, env);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--batch 8") && text(&out.stderr).contains("batch 12"),
        "{}",
        text(&out.stderr)
    );
    let out = captune(&args, env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("objective = \"scst\"") && config.contains("baseline = \"mean\""),
        "{config}"
    );
    let log = std::fs::read_to_string(run.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert!(
        last["objective"].as_str().unwrap().starts_with("scst"),
        "{last}"
    );
    for key in ["reward", "baseline", "advantage_spread", "div2", "entropy"] {
        assert!(
            last[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {last}"
        );
    }
}

/// `train --init --objective discritune`: the log carries the reward,
/// its baseline and the rank of each caption's image.
fn discritune_run(
    dir: &std::path::Path,
    ck: &std::path::Path,
    retriever: &str,
    shapes: &[&str],
    env: &[(&str, &str)],
) {
    let run = dir.join("run-discritune");
    let mut args = vec![
        "--device",
        "cpu",
        "train",
        "--preset",
        "tiny",
        "--init",
        ck.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--retriever",
        retriever,
        "--objective",
        "discritune",
        "--hard-negatives",
        "3",
        "--epochs",
        "1",
    ];
    args.extend(shapes);
    let out = captune(&args, env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // From a checkpoint without --lr: DiscriTune's own rate, said, and
    // the starting weights validated as epoch 0.
    assert!(
        text(&out.stderr).contains("learning rate 2e-5: discritune's fine-tuning rate"),
        "{}",
        text(&out.stderr)
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("lr = 0.00002"), "{config}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(
        (first["epoch"].as_u64(), first["step"].as_u64()),
        (Some(0), Some(0))
    );
    let log = std::fs::read_to_string(run.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert!(
        last["objective"]
            .as_str()
            .unwrap()
            .starts_with("discritune (hard negatives: 3"),
        "{last}"
    );
    for key in ["reward", "baseline", "rank", "accuracy", "entropy"] {
        assert!(
            last[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {last}"
        );
    }
    assert!(last["rank"].as_f64().unwrap() >= 1.0, "{last}");
}

/// The labelled-fraction setting's two stages from the command line: MLE
/// on a third of the tiny world's 48 training images (one batch of 16 an
/// epoch), then CLIP relevance with an MLE mix from its checkpoint on the
/// other 32 (two batches); a resume that would change the images a run
/// trains on is refused with the command to use instead.
fn labelled_stages(dir: &std::path::Path, retriever: &str, shapes: &[&str], env: &[(&str, &str)]) {
    let few = dir.join("run-few");
    let train = |extra: &[&str]| {
        let mut args = vec!["--device", "cpu", "train", "--retriever", retriever];
        args.extend(extra);
        args.extend(shapes);
        captune(&args, env)
    };
    let out = train(&[
        "--preset",
        "tiny",
        "--labelled",
        "0.34",
        "--epochs",
        "2",
        "--out",
        few.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = std::fs::read_to_string(few.join("config.toml")).unwrap();
    assert!(config.contains("labelled = 0.34"), "{config}");
    let log = std::fs::read_to_string(few.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 2, "one step an epoch: {last}");

    for refused in [
        &["--labelled", "0.5"][..],
        &["--objective", "clip-relevance"][..],
    ] {
        let mut args = vec!["--resume", "--out", few.to_str().unwrap(), "--epochs", "1"];
        args.extend(refused);
        let out = train(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{refused:?} was accepted");
        assert!(err.contains("--init") && err.contains("run-few"), "{err}");
    }

    let relevance = dir.join("run-few-relevance");
    let ck = few.join("checkpoint.safetensors");
    let out = train(&[
        "--preset",
        "tiny",
        "--init",
        ck.to_str().unwrap(),
        "--labelled",
        "0.34",
        "--objective",
        "clip-relevance",
        "--mle-weight",
        "0.5",
        "--lr",
        "1e-4",
        "--epochs",
        "1",
        "--out",
        relevance.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = std::fs::read_to_string(relevance.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["step"], 2,
        "two steps over 32 unlabelled images: {last}"
    );
    for key in ["cosine", "mle", "tau"] {
        assert!(
            last[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {last}"
        );
    }
}

/// `score` reads only the captions: the split file alone, its images
/// gone, is enough; several captions per image score as eval scores them.
fn scoring_needs_only_references(
    dir: &std::path::Path,
    look: &std::path::Path,
    results: &std::path::Path,
    sample_results: &std::path::Path,
    env: &[(&str, &str)],
) {
    let alone = dir.join("references-only");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(
        look.join("dataset_shapes.json"),
        alone.join("dataset_shapes.json"),
    )
    .unwrap();
    let data = format!("karpathy:{}", alone.join("dataset_shapes.json").display());
    let score = |results: &std::path::Path| {
        let out = captune(
            &[
                "score",
                "--data",
                &data,
                "--results",
                results.to_str().unwrap(),
                "--json",
            ],
            env,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let one = score(results);
    assert_eq!(
        (one["images"].as_u64(), one["captions_per_image"].as_u64()),
        (Some(16), Some(1))
    );
    assert!(one["div1"].is_null(), "{one}");
    let five = score(sample_results);
    assert_eq!(five["captions_per_image"], 5, "{five}");
    assert!(five["CIDEr-D"].is_number(), "{five}");
    // The diversity of each image's five captions, as the file gives them.
    let written: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(sample_results).unwrap()).unwrap();
    let mut sets: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for r in &written {
        let id = r["image_id"].to_string();
        let words = r["caption"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        match sets.iter_mut().find(|(i, _)| *i == id) {
            Some((_, set)) => set.push(words),
            None => sets.push((id, vec![words])),
        }
    }
    let sets: Vec<Vec<Vec<String>>> = sets.into_iter().map(|(_, set)| set).collect();
    assert!(sets.len() == 16 && sets.iter().all(|s| s.len() == 5));
    let d = captune::metrics::diversity::diversity(&sets);
    for (key, want) in [("div1", d.div1), ("div2", d.div2), ("mbleu4", d.mbleu4)] {
        let got = five[key].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "{key}: score {got}, recomputed {want}"
        );
    }
}

/// Commands on a captioner default to the data and retriever it was
/// trained with (from any working folder), and refuse embeddings of
/// another size or from another encoder, naming both.
fn features_must_be_the_captioners(
    dir: &std::path::Path,
    ck: &std::path::Path,
    retriever: &str,
    png: &std::path::Path,
    metrics: &serde_json::Value,
    env: &[(&str, &str)],
) {
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let in_elsewhere = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_captune"));
        cmd.args(["--device", "cpu"])
            .args(args)
            .current_dir(&elsewhere);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // No --data, no --retriever, no shapes settings: all from the checkpoint.
    let out = in_elsewhere(&[
        "eval",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--results",
        "r.json",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["CIDEr-D", "self_retrieval_r1", "fact_precision"] {
        assert_eq!(
            again[key], metrics[key],
            "{key} with the recorded data and retriever"
        );
    }
    let out = in_elsewhere(&[
        "caption",
        "--checkpoint",
        ck.to_str().unwrap(),
        png.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Another retriever: the shapes retriever carried in the binary.
    let shapes = dir.join("shapes.safetensors");
    std::fs::write(&shapes, captune::cache::SHAPES_RETRIEVER).unwrap();
    let out = in_elsewhere(&[
        "caption",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--retriever",
        shapes.to_str().unwrap(),
        png.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("checkpoint.safetensors")
            && err.contains("shapes.safetensors"),
        "{err}"
    );
    // Another size: eval with the carried retriever's 128-dimensional embeddings.
    let out = in_elsewhere(&[
        "eval",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--retriever",
        shapes.to_str().unwrap(),
        "--results",
        "r3.json",
    ]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("16-dimensional") && err.contains("128"),
        "{err}"
    );

    // Same size, another encoder: a features file that says so.
    let mut f = captune::data::features::Features::load(&dir.join("f.safetensors"), None).unwrap();
    f.encoder = Some("another-encoder".into());
    let other = dir.join("other.safetensors");
    f.save(&other, Default::default()).unwrap();
    let out = in_elsewhere(&[
        "eval",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--features",
        other.to_str().unwrap(),
        "--results",
        "r2.json",
    ]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("checkpoint.safetensors")
            && err.contains("other.safetensors")
            && err.contains("another-encoder")
            && err.contains(retriever),
        "{err}"
    );
}

/// eval's length, lexical diversity and fact metrics are those of the
/// captions it wrote (`results`), on the scenes of the shapes world's
/// split file: each caption's facts checked against its own image.
fn assert_caption_metrics(
    split_file: &std::path::Path,
    results: &[serde_json::Value],
    metrics: &serde_json::Value,
) {
    use captune::shapes::{self, facts};
    let data = captune::data::karpathy::load_references(split_file).unwrap();
    let (mut words, mut distinct) = (0, std::collections::HashSet::new());
    let (mut precision, mut stating, mut recall) = (0.0, 0, 0.0);
    let (mut objects, mut attributes) = (0, 0);
    for r in results {
        let id = r["image_id"].to_string();
        let item = data.items.iter().find(|i| i.id == id).unwrap();
        let caption = r["caption"].as_str().unwrap();
        words += caption.split_whitespace().count();
        distinct.extend(caption.split_whitespace());
        let statements = facts::parse(caption);
        let checked = statements.check(&shapes::scene(item).unwrap());
        if let Some(p) = checked.precision() {
            (precision, stating) = (precision + p, stating + 1);
        }
        recall += checked.recall();
        let (o, a) = statements.described();
        (objects, attributes) = (objects + o, attributes + a);
    }
    let n = results.len() as f64;
    let near = |key: &str, want: f64| {
        let got = metrics[key].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "{key}: eval {got}, recomputed {want}"
        );
    };
    near("mean_length", words as f64 / n);
    near("lexical_diversity", distinct.len() as f64);
    near("fact_recall", recall / n);
    near("objects_named", objects as f64 / n);
    near(
        "attributes_per_object",
        attributes as f64 / objects.max(1) as f64,
    );
    // Precision is undefined (null) where no caption states a fact, as a
    // barely trained captioner's repeated word does.
    match stating {
        0 => assert!(metrics["fact_precision"].is_null(), "{metrics}"),
        _ => near("fact_precision", precision / stating as f64),
    }
}

/// pycocotools' `loadRes` accepts `eval`'s results file and pycocoevalcap
/// scores it as captune did (scripts/coco_interop.py). Skipped, with a
/// line saying so, where pycocoevalcap is not installed.
fn coco_tools_accept(
    look: &std::path::Path,
    results: &std::path::Path,
    metrics: &serde_json::Value,
) {
    let has = Command::new("python3")
        .args(["-c", "import pycocoevalcap, pycocotools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        common::skip(
            "pycocoevalcap is not installed (pip install pycocoevalcap): eval's results unchecked with the COCO tools",
        );
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/coco_interop.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(look.join("dataset_shapes.json"))
        .arg("test")
        .arg(results)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let coco: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    assert_eq!(coco["images"], 16, "{coco}");
    for key in ["BLEU-1", "BLEU-4", "CIDEr-D", "ROUGE-L"] {
        let (c, e) = (coco[key].as_f64().unwrap(), metrics[key].as_f64().unwrap());
        assert!(
            (c - e).abs() < 1e-6,
            "{key}: pycocoevalcap {c}, captune {e}"
        );
    }
}

/// `demo` on a tiny world with the tiny preset: the table, three images'
/// captions, and the JSON file with every documented key.
#[test]
fn demo_prints_the_comparison_and_writes_its_json() {
    let dir = crate::common::fresh_temp("demo");
    let cache = dir.join("cache");
    let env = [("CAPTUNE_CACHE", cache.to_str().unwrap())];
    let json = dir.join("demo.json");
    let runs = dir.join("runs");
    let mut args = vec![
        "--device",
        "cpu",
        "demo",
        "--preset",
        "tiny",
        "--mle-epochs",
        "1",
        "--smile-epochs",
        "1",
        "--eval-images",
        "16",
        "--out",
        runs.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend(common::TINY_WORLD_ARGS);
    let out = captune(&args, &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("MLE") && stdout.contains("SMILE") && stdout.contains("fact recall"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("\nimage ").count(), 3, "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in ["t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10"] {
        assert!(
            v["retriever"][key].is_number(),
            "retriever lacks {key}: {v}"
        );
    }
    // The table shows the figures of the JSON record, MLE then SMILE:
    // (label, key, digits), and "–" for an undefined one.
    for (label, key, digits) in [
        ("mean length", "mean_length", 2),
        ("lexical diversity", "lexical_diversity", 0),
        ("self-retrieval R@1", "self_retrieval_r1", 3),
        ("self-retrieval R@5", "self_retrieval_r5", 3),
        ("CLIPScore-style", "clipscore", 2),
        ("fact precision", "fact_precision", 3),
        ("fact recall", "fact_recall", 3),
        ("BLEU-4", "BLEU-4", 3),
        ("CIDEr-D", "CIDEr-D", 3),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row: {stdout}"));
        let cells: Vec<&str> = line[label.len()..].split_whitespace().collect();
        let want: Vec<String> = ["mle", "smile"]
            .iter()
            .map(|side| match &v[side][key] {
                serde_json::Value::Null if key == "fact_precision" => "–".to_string(),
                value => format!("{:.digits$}", value.as_f64().unwrap()),
            })
            .collect();
        assert_eq!(cells, want, "{label}: {stdout}\n{v}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The objective's settings reach the command line from their
/// declaration: listed in the help, refused for an objective that does
/// not take them, and checked against their range.
#[test]
fn objective_settings_are_flags_from_their_declarations() {
    let help = text(&captune(&["train", "--help"], &[]).stdout);
    for flag in [
        "--objective <NAME>",
        "--mle-weight <X>",
        "--first-token <NAME>",
    ] {
        assert!(help.contains(flag), "{flag} missing from\n{help}");
    }
    let dir = crate::common::fresh_temp("cli-settings");
    let out_dir = dir.to_str().unwrap();
    let out = captune(
        &[
            "--device",
            "cpu",
            "train",
            "--preset",
            "tiny",
            "--objective",
            "mle",
            "--mle-weight",
            "0.3",
            "--out",
            out_dir,
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--mle-weight is not a setting of objective mle; its settings are: none"),
        "{err}"
    );
    let out = captune(
        &[
            "train",
            "--objective",
            "smile",
            "--mle-weight",
            "1.5",
            "--out",
            out_dir,
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--mle-weight: 1.5 is outside [0, 1]"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
