//! The retriever on a tiny shapes world: training lowers the loss and
//! raises in-batch accuracy, one step agrees between GPU and CPU, and
//! checkpoints and features files round-trip.

use crate::common;

use captune::backend::Backend;
use captune::cpu::CpuBackend;
use captune::data::features::Features;
use captune::data::karpathy;
use captune::data::{Dataset, Split};
use captune::model::retriever::RetrieverConfig;
use captune::model::retriever::{Retriever, TextBatch};
use captune::model::transformer::TransformerConfig;
use captune::optim::{AdamW, AdamWConfig};
use captune::retriever::train::{self, Prepared, TrainOptions};
use captune::retriever::{Checkpoint, patchify};
use captune::shapes::{self, Domain, ShapesConfig};
use common::{assert_close, gpu};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn temp(name: &str) -> PathBuf {
    crate::common::fresh_temp(&format!("retriever-{name}"))
}

/// A 32-pixel shapes world: 64 train, 16 val, 16 test images (written once per test binary).
fn tiny_world() -> Dataset {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = temp("world");
        let config = ShapesConfig {
            seed: 5,
            image_size: 32,
            train: 64,
            val: 16,
            test: 16,
            domain: Domain::Default,
        };
        shapes::write(&config, &dir).unwrap();
        dir
    });
    karpathy::load(&dir.join(shapes::SPLIT_FILE), None).unwrap()
}

fn tiny_config(vocab_size: usize) -> RetrieverConfig {
    let tower = |causal| TransformerConfig::new(32, 1, 2, causal);
    RetrieverConfig {
        image_size: 32,
        patch: 8,
        image: tower(false),
        text: tower(true),
        max_len: 24,
        vocab_size,
        embed_dim: 32,
        image_pool: captune::model::retriever::ImagePool::Mean,
        biases: true,
    }
}

/// `c` with CLIP's architecture: a class vector pooled alone, a layer norm
/// before the image blocks, quick GELU, MLPs of another width than 4x, no
/// biases on the patch embedding and the projections.
fn clip_shaped(c: RetrieverConfig) -> RetrieverConfig {
    let clip = |t: TransformerConfig| TransformerConfig {
        mlp_width: Some(40),
        activation: captune::model::layers::Activation::QuickGelu,
        ..t
    };
    RetrieverConfig {
        image: TransformerConfig {
            pre_norm: true,
            ..clip(c.image)
        },
        text: clip(c.text),
        image_pool: captune::model::retriever::ImagePool::Class,
        biases: false,
        ..c
    }
}

fn tiny_checkpoint<B: Backend>(b: &B, data: &Dataset, batch: usize) -> Checkpoint<B> {
    checkpoint_of(b, data, batch, tiny_config)
}

fn checkpoint_of<B: Backend>(
    b: &B,
    data: &Dataset,
    batch: usize,
    config: impl Fn(usize) -> RetrieverConfig,
) -> Checkpoint<B> {
    let vocab = train::vocab_for(data, 1).unwrap();
    let model = Retriever::new(b, config(vocab.len()), batch, 11).unwrap();
    Checkpoint { model, vocab }
}

#[test]
fn training_lowers_the_loss_and_raises_in_batch_accuracy() {
    let b = CpuBackend::new();
    let data = tiny_world();
    let mut ck = tiny_checkpoint(&b, &data, 16);
    let prep = Prepared::new(data, 32).unwrap();
    let options = TrainOptions {
        epochs: 60,
        lr: 3e-3,
        weight_decay: 0.0,
        warmup: 10,
        seed: 1,
        checkpoint: temp("train.safetensors"),
        eval_each_epoch: false,
        log_every: 1,
    };
    let records = train::train(&b, &mut ck, &prep, &options, &HashMap::new(), |_| {}).unwrap();
    let (first, last) = (&records[0], records.last().unwrap());
    assert!(
        last.mean_loss < 0.5 * first.mean_loss,
        "loss {} -> {}",
        first.mean_loss,
        last.mean_loss
    );
    assert!(
        last.mean_in_batch_accuracy >= 0.3
            && last.mean_in_batch_accuracy > 2.0 * first.mean_in_batch_accuracy,
        "in-batch accuracy {} -> {}",
        first.mean_in_batch_accuracy,
        last.mean_in_batch_accuracy
    );

    // The checkpoint written after the last epoch reloads to the same recall.
    let recall = prep.evaluate(&b, &mut ck, Split::Train).unwrap();
    let mut reloaded = Checkpoint::load(&b, &options.checkpoint, 16).unwrap();
    assert_eq!(reloaded.vocab, ck.vocab);
    assert_eq!(
        prep.evaluate(&b, &mut reloaded, Split::Train).unwrap(),
        recall
    );
    assert!(
        recall.t2i_r10 > 10.0 / 64.0,
        "above chance on the training images: {recall:?}"
    );
    std::fs::remove_file(&options.checkpoint).unwrap();
}

/// One step from the same weights: (loss, accuracy, every gradient, every updated value).
fn one_step<B: Backend>(b: &B, config: impl Fn(usize) -> RetrieverConfig) -> Vec<Vec<f32>> {
    let data = tiny_world();
    let mut ck = checkpoint_of(b, &data, 8, config);
    let prep = Prepared::new(data, 32).unwrap();
    let items: Vec<usize> = prep.items(Split::Train)[..8].to_vec();
    let config = ck.model.config;
    let ids: Vec<Vec<u32>> = items
        .iter()
        .map(|&i| {
            ck.vocab
                .encode(&prep.data.items[i].captions[0].tokens, config.max_len)
        })
        .collect();
    let texts = TextBatch::new(b, &config, &ids).unwrap();
    ck.model
        .forward_backward(b, &patchify(&config, &prep.images, &items), &texts)
        .unwrap();
    let mut out = vec![vec![ck.model.loss.read_loss(b)]];
    out.extend(ck.model.params.grads.iter().map(|g| b.to_vec(g)));
    let params = &mut ck.model.params;
    let mut opt = AdamW::new(b, AdamWConfig::default(), &params.optimizer_layout());
    let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
    let grads: Vec<&B::Tensor> = params.grads.iter().collect();
    opt.step(b, &mut values, &grads);
    out.extend(params.values.iter().map(|v| b.to_vec(v)));
    out
}

#[test]
fn one_training_step_gives_the_same_numbers_on_gpu_and_cpu() {
    let Some(g) = gpu() else { return };
    let clip = |v| clip_shaped(tiny_config(v));
    for (what, config) in [
        (
            "captune's",
            &tiny_config as &dyn Fn(usize) -> RetrieverConfig,
        ),
        ("CLIP-shaped", &clip),
    ] {
        let want = one_step(&CpuBackend::new(), config);
        let got = one_step(&g, config);
        assert_eq!(got.len(), want.len());
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{what} output {i}"), got, want, 2e-3, 2e-5);
        }
    }
}

#[test]
fn features_round_trip_through_safetensors_and_npy() {
    // Raw rows: loading L2-normalises them (to 0.6 0.8, 0 1, 5/13 12/13).
    let features = Features {
        source: temp("f.safetensors"),
        ids: vec!["a".into(), "b".into(), "c".into()],
        dim: 2,
        embeddings: vec![3.0, 4.0, 0.0, 2.0, 5.0, 12.0],
        encoder: Some("my-encoder".into()),
        norms: None,
    };
    let unit = vec![0.6, 0.8, 0.0, 1.0, 5.0 / 13.0, 12.0 / 13.0];
    let path = temp("f.safetensors");
    features.save(&path, HashMap::new()).unwrap();
    let back = Features::load(&path, None).unwrap();
    assert_eq!((back.ids.clone(), back.dim), (features.ids.clone(), 2));
    assert_close("normalised", &back.embeddings, &unit, 1e-6, 0.0);
    assert_eq!(back.encoder.as_deref(), Some("my-encoder"));
    // The rows' norms as they came, kept for a captioner that reads them so.
    assert_eq!(back.norms.as_deref(), Some(&[5.0, 2.0, 13.0][..]));
    // Aligning with a data set keeps its items that have an embedding, in item order.
    let mut data = tiny_world();
    data.items.truncate(3);
    data.items[0].id = "c".into();
    data.items[1].id = "a".into();
    data.items[2].id = "zzz".into();
    let (aligned, norms) = back.align(&mut data).unwrap();
    assert_eq!(aligned, [&unit[4..6], &unit[0..2]].concat());
    assert_eq!(norms.as_deref(), Some(&[13.0, 5.0][..]));
    assert_eq!(data.items.len(), 2);
    assert_eq!(data.report.skipped_items, 1);
    assert!(
        data.report
            .to_string()
            .contains("no embedding for image zzz"),
        "{}",
        data.report
    );
    // .npy (numpy's format 1.0 header, float32 little-endian, C order) with an ids file.
    let npy = temp("f.npy");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
    let pad = 64 - (10 + header.len() + 1) % 64;
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend(((header.len() + pad + 1) as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes.push(b'\n');
    bytes.extend(features.embeddings.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&npy, bytes).unwrap();
    let ids = temp("ids.txt");
    std::fs::write(&ids, "a\nb\nc\n").unwrap();
    let back = Features::load(&npy, Some(&ids)).unwrap();
    assert_eq!(back.ids, features.ids);
    assert_close("npy normalised", &back.embeddings, &unit, 1e-6, 0.0);
    let err = Features::load(&npy, None).unwrap_err().to_string();
    assert!(err.contains("--features-ids"), "{err}");
    std::fs::write(&ids, "a\nb\n").unwrap();
    let err = Features::load(&npy, Some(&ids)).unwrap_err().to_string();
    assert!(err.contains("3 embeddings but 2 image ids"), "{err}");
    // Unit rows keep the norms the file records, and have none without.
    let unit_rows = Features {
        embeddings: unit.clone(),
        norms: Some(vec![5.0, 2.0, 13.0]),
        ..back
    };
    unit_rows.save(&path, HashMap::new()).unwrap();
    let again = Features::load(&path, None).unwrap();
    assert_eq!(again.embeddings, unit);
    assert_eq!(again.norms, unit_rows.norms);
    Features {
        norms: None,
        ..unit_rows
    }
    .save(&path, HashMap::new())
    .unwrap();
    assert_eq!(Features::load(&path, None).unwrap().norms, None);
    let ids_meta = HashMap::from([("image_ids".to_string(), r#"["a","b","c"]"#.to_string())]);
    let tensors = [
        ("embeddings", vec![3, 2], &unit[..]),
        ("norms", vec![2], &[5.0, 2.0][..]),
    ];
    captune::tensorfile::write(&path, &tensors, ids_meta).unwrap();
    let err = format!("{:#}", Features::load(&path, None).unwrap_err());
    assert!(err.contains("\"norms\" must be [3]"), "{err}");
    for f in [path, npy, ids] {
        std::fs::remove_file(f).unwrap();
    }
}

/// Writes `rows` as one safetensors tensor `embeddings` of `dtype`.
fn half_features(path: &Path, dtype: safetensors::Dtype, rows: &[f32]) {
    let bytes: Vec<u8> = rows
        .iter()
        .flat_map(|&x| match dtype {
            safetensors::Dtype::F16 => half::f16::from_f32(x).to_le_bytes(),
            _ => half::bf16::from_f32(x).to_le_bytes(),
        })
        .collect();
    let view = safetensors::tensor::TensorView::new(dtype, vec![2, 2], &bytes).unwrap();
    let metadata = HashMap::from([("image_ids".to_string(), r#"["a","b"]"#.to_string())]);
    let file = safetensors::serialize([("embeddings", view)], Some(metadata)).unwrap();
    std::fs::write(path, file).unwrap();
}

#[test]
fn half_precision_features_load_and_bad_values_are_refused_by_name() {
    for (dtype, name) in [
        (safetensors::Dtype::F16, "f16.safetensors"),
        (safetensors::Dtype::BF16, "bf16.safetensors"),
    ] {
        let path = temp(name);
        half_features(&path, dtype, &[3.0, 4.0, 0.0, -2.0]);
        let f = Features::load(&path, None).unwrap();
        assert_eq!(f.embeddings, vec![0.6, 0.8, 0.0, -1.0], "{name}");
        // A zero row cannot be normalised; an infinite value is named with its tensor.
        half_features(&path, dtype, &[0.0, 0.0, 1.0, 1.0]);
        let err = Features::load(&path, None).unwrap_err().to_string();
        assert!(
            err.contains(name) && err.contains("image a") && err.contains("zero"),
            "{err}"
        );
        half_features(&path, dtype, &[f32::INFINITY, 0.0, 1.0, 1.0]);
        let err = format!("{:#}", Features::load(&path, None).unwrap_err());
        assert!(
            err.contains(name) && err.contains("\"embeddings\"") && err.contains("inf"),
            "{err}"
        );
        std::fs::remove_file(path).unwrap();
    }
}

/// The retriever's whole backward against central differences: every
/// parameter (patch embedding, positions, both towers, the pooling of the
/// image tower, the end-token gather and projection of the text tower,
/// the contrastive loss's learned scale) at six random coordinates each,
/// on captions of different lengths so that padding and the key mask
/// take part.
#[test]
fn the_whole_backward_matches_finite_differences() {
    whole_backward_matches_finite_differences(tiny_config);
}

/// The same with CLIP's architecture: the class vector, the layer norm
/// before the image blocks, quick GELU, no biases.
#[test]
fn a_clip_shaped_backward_matches_finite_differences() {
    whole_backward_matches_finite_differences(|v| clip_shaped(tiny_config(v)));
}

fn whole_backward_matches_finite_differences(config: impl Fn(usize) -> RetrieverConfig) {
    let b = CpuBackend::new();
    let data = tiny_world();
    let mut ck = checkpoint_of(&b, &data, 4, config);
    assert_eq!(
        ck.model.config.parameter_count(),
        ck.model.params.count() as u128,
        "the formula loading checks files against"
    );
    let prep = Prepared::new(data, 32).unwrap();
    let config = ck.model.config;
    let items: Vec<usize> = prep.items(Split::Train)[..4].to_vec();
    let ids: Vec<Vec<u32>> = items
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let tokens = &prep.data.items[i].captions[0].tokens;
            // Lengths 2..5 words: the batch is padded differently per row.
            ck.vocab
                .encode(&tokens[..tokens.len().min(2 + k)], config.max_len)
        })
        .collect();
    assert!(
        ids.iter()
            .map(Vec::len)
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 1
    );
    let texts = TextBatch::new(&b, &config, &ids).unwrap();
    let patches = patchify(&config, &prep.images, &items);
    let model = &mut ck.model;
    model.forward_backward(&b, &patches, &texts).unwrap();
    let grads: Vec<Vec<f32>> = model.params.grads.iter().map(|g| b.to_vec(g)).collect();
    // Smaller than the captioner's: a patch-embedding bias moves all 16 patches
    // of every image at once, and at 1e-2 the curvature shows (7% off).
    let eps = 3e-3f32;
    common::check_parameter_gradients(
        model,
        |m| &mut m.params,
        &grads,
        eps,
        |m| {
            m.forward_backward(&b, &patches, &texts).unwrap();
            f64::from(m.loss.read_loss(&b))
        },
    );
}

/// The image embeddings and the gradient at the text tower's input (what
/// CLIP relevance reads) of a CLIP-shaped retriever, frozen or not, and
/// the frozen one's gradient buffers.
fn read_frozen<B: Backend>(b: &B, frozen: bool) -> (Vec<f32>, Vec<f32>, Vec<usize>) {
    let data = tiny_world();
    // Three image blocks: a frozen tower takes its stream's two buffers in turn.
    let config = |v| {
        let mut c = clip_shaped(tiny_config(v));
        c.image.layers = 3;
        c
    };
    let mut ck = checkpoint_of(b, &data, 4, config);
    if frozen {
        ck.model.freeze(b).unwrap();
    }
    let prep = Prepared::new(data, 32).unwrap();
    let items: Vec<usize> = prep.items(Split::Train)[..4].to_vec();
    let config = ck.model.config;
    ck.model
        .encode_images(b, &patchify(&config, &prep.images, &items))
        .unwrap();
    let images = b.to_vec(ck.model.image_embeddings());
    let ids: Vec<Vec<u32>> = items
        .iter()
        .map(|&i| {
            ck.vocab
                .encode(&prep.data.items[i].captions[0].tokens, config.max_len)
        })
        .collect();
    let texts = TextBatch::new(b, &config, &ids).unwrap();
    ck.model.encode_texts(b, &texts).unwrap();
    let d_text = common::random(4 * config.embed_dim, 3);
    let d_input = b.to_vec(ck.model.text_input_gradient(b, &texts, &d_text));
    let grads = ck
        .model
        .params
        .grads
        .iter()
        .map(|g| b.to_vec(g).len())
        .collect();
    (images, d_input, grads)
}

/// A frozen retriever (as every objective and evaluation uses one) holds
/// no parameter gradients and runs its image tower with one set of block
/// buffers, and embeds and passes gradients to its text tower's input
/// exactly as before, on both backends.
#[test]
fn a_frozen_retriever_computes_the_same_without_gradient_buffers() {
    let check = |what: &str,
                 (images, d_input, grads): (Vec<f32>, Vec<f32>, Vec<usize>),
                 want: &(Vec<f32>, Vec<f32>, Vec<usize>)| {
        assert_eq!(images, want.0, "{what}: image embeddings");
        assert_eq!(d_input, want.1, "{what}: input gradient");
        assert!(
            grads.iter().all(|&n| n == 0),
            "{what}: gradient buffers {grads:?}"
        );
        assert!(want.2.iter().all(|&n| n > 0));
    };
    let c = CpuBackend::new();
    check("cpu", read_frozen(&c, true), &read_frozen(&c, false));
    if let Some(g) = gpu() {
        check("gpu", read_frozen(&g, true), &read_frozen(&g, false));
    }
}
