//! Hugging Face GPT-2 as captune's decoder. The two have one shape:
//! pre-LN blocks, learned positions, tanh GELU, layer-norm epsilon 1e-5,
//! the fused qkv stored input-major (GPT-2's Conv1D `c_attn` is
//! `[in, out]`, as captune's dense layers are) and a tied output
//! embedding. So loading is renaming: [`BLOCK_NAMES`] is the whole map,
//! read one way by [`read`] and the other by [`gpt2_name`] (export).
//! Checkpoints saved from `GPT2LMHeadModel` prefix every name with
//! `transformer.`; those saved from `GPT2Model` (the hub's `gpt2`) do not.

use super::hf::HfFolder;
use super::transformer::TransformerConfig;
use crate::tensorfile::{Tensor, TensorFile};
use anyhow::{Result, bail};
use serde::Deserialize;
use std::path::Path;

/// captune's name within block i, and GPT-2's within `h.{i}`.
pub const BLOCK_NAMES: [(&str, &str); 12] = [
    ("ln1.weight", "ln_1.weight"),
    ("ln1.bias", "ln_1.bias"),
    ("attn.qkv.weight", "attn.c_attn.weight"),
    ("attn.qkv.bias", "attn.c_attn.bias"),
    ("attn.proj.weight", "attn.c_proj.weight"),
    ("attn.proj.bias", "attn.c_proj.bias"),
    ("ln2.weight", "ln_2.weight"),
    ("ln2.bias", "ln_2.bias"),
    ("mlp.fc1.weight", "mlp.c_fc.weight"),
    ("mlp.fc1.bias", "mlp.c_fc.bias"),
    ("mlp.fc2.weight", "mlp.c_proj.weight"),
    ("mlp.fc2.bias", "mlp.c_proj.bias"),
];

/// The fields of a GPT-2 `config.json` that decide the network; options
/// captune's block does not have are refused by [`Gpt2Config::check`].
#[derive(Clone, Debug, Deserialize)]
pub struct Gpt2Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "gelu_new")]
    pub activation_function: String,
    #[serde(default = "epsilon")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    pub add_cross_attention: bool,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
}

fn gelu_new() -> String {
    "gelu_new".into()
}

fn epsilon() -> f64 {
    1e-5
}

fn yes() -> bool {
    true
}

impl Gpt2Config {
    /// Refuses what captune's decoder cannot compute, naming the field.
    pub fn check(&self, path: &Path) -> Result<()> {
        let refuse = |field: &str, value: String, want: &str| {
            bail!(
                "{}: {field} is {value}; captune's decoder computes GPT-2 with {want} only",
                path.display()
            )
        };
        if self.model_type != "gpt2" {
            bail!(
                "{}: model_type {:?} is not a GPT-2; captune reads model_type \"gpt2\"",
                path.display(),
                self.model_type
            );
        }
        if !matches!(
            self.activation_function.as_str(),
            "gelu_new" | "gelu_pytorch_tanh"
        ) {
            return refuse(
                "activation_function",
                format!("{:?}", self.activation_function),
                "the tanh GELU (\"gelu_new\")",
            );
        }
        if (self.layer_norm_epsilon - 1e-5).abs() > 1e-12 {
            return refuse(
                "layer_norm_epsilon",
                self.layer_norm_epsilon.to_string(),
                "1e-5",
            );
        }
        if self.n_inner.is_some_and(|n| n != 4 * self.n_embd) {
            return refuse("n_inner", format!("{:?}", self.n_inner), "4 * n_embd");
        }
        if !self.scale_attn_weights || self.scale_attn_by_inverse_layer_idx {
            return refuse(
                "the attention scaling",
                "not 1/sqrt(head size)".into(),
                "1/sqrt(head size)",
            );
        }
        if self.add_cross_attention {
            return refuse("add_cross_attention", "true".into(), "no cross-attention");
        }
        if !self.tie_word_embeddings {
            return refuse(
                "tie_word_embeddings",
                "false".into(),
                "the output layer tied to wte",
            );
        }
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            bail!(
                "{}: n_embd {} is not a multiple of n_head {}",
                path.display(),
                self.n_embd,
                self.n_head
            );
        }
        Ok(())
    }

    pub fn transformer(&self) -> TransformerConfig {
        TransformerConfig::new(self.n_embd, self.n_layer, self.n_head, true)
    }
}

/// A GPT-2's weights under captune's names: `{prefix}.tokens` (wte,
/// `[vocab, width]`), `{prefix}.positions` (wpe, `[n_positions, width]`),
/// `{prefix}.blocks.{i}.*` and `{prefix}.ln_f.*`.
pub struct Gpt2 {
    pub config: Gpt2Config,
    pub weights: TensorFile,
}

/// Reads a GPT-2 folder, checking every tensor's presence and shape
/// against its config.json; `prefix` is the captune module name.
pub fn read(dir: &Path, prefix: &str) -> Result<Gpt2> {
    let (mut file, path) = HfFolder::open(dir)?.weights()?;
    from_tensors(dir, &mut file, &path, prefix)
}

/// A GPT-2 of the folder `dir`'s config.json whose tensors are taken out
/// of `file` (read from `path`) by the names `GPT2LMHeadModel` saves,
/// each checked against the config; what it does not name is left there.
pub fn from_tensors(dir: &Path, file: &mut TensorFile, path: &Path, prefix: &str) -> Result<Gpt2> {
    let folder = HfFolder::open(dir)?;
    let config: Gpt2Config = folder.config()?;
    config.check(&folder.config_path())?;
    let config_path = folder.config_path();
    let (w, v, n, layers) = (
        config.n_embd,
        config.vocab_size,
        config.n_positions,
        config.n_layer,
    );
    let mut take = |gpt2: &str, shape: &[usize]| -> Result<Tensor> {
        let tensor = file
            .tensors
            .remove(&format!("transformer.{gpt2}"))
            .or_else(|| file.tensors.remove(gpt2));
        let Some(tensor) = tensor else {
            bail!(
                "{}: no tensor {gpt2:?} (nor \"transformer.{gpt2}\"), which {} (n_layer {layers}) \
                 calls for",
                path.display(),
                config_path.display(),
            );
        };
        if tensor.shape != shape {
            bail!(
                "{}: tensor {gpt2:?} has shape {:?}, but {} ({w} n_embd, {v} vocab, {n} \
                 positions) makes it {shape:?}",
                path.display(),
                tensor.shape,
                config_path.display(),
            );
        }
        Ok(tensor)
    };
    let mut weights = TensorFile::new([]);
    let mut put = |name: String, tensor: Tensor| {
        weights.tensors.insert(format!("{prefix}.{name}"), tensor);
    };
    put("tokens".into(), take("wte.weight", &[v, w])?);
    put("positions".into(), take("wpe.weight", &[n, w])?);
    for i in 0..config.n_layer {
        for (ours, theirs) in BLOCK_NAMES {
            let shape = block_shape(ours, w);
            put(
                format!("blocks.{i}.{ours}"),
                take(&format!("h.{i}.{theirs}"), &shape)?,
            );
        }
    }
    put("ln_f.weight".into(), take("ln_f.weight", &[w])?);
    put("ln_f.bias".into(), take("ln_f.bias", &[w])?);
    Ok(Gpt2 { config, weights })
}

/// The shape of block tensor `name` at width `w`.
fn block_shape(name: &str, w: usize) -> Vec<usize> {
    match name {
        "attn.qkv.weight" => vec![w, 3 * w],
        "attn.qkv.bias" => vec![3 * w],
        "attn.proj.weight" => vec![w, w],
        "mlp.fc1.weight" => vec![w, 4 * w],
        "mlp.fc1.bias" => vec![4 * w],
        "mlp.fc2.weight" => vec![4 * w, w],
        _ => vec![w],
    }
}

/// GPT-2's name (as `GPT2LMHeadModel` saves it) of captune's decoder
/// tensor `name` (without the module prefix: `tokens`, `positions`,
/// `blocks.{i}.*`, `ln_f.*`); None for a name GPT-2 does not have.
pub fn gpt2_name(name: &str) -> Option<String> {
    let theirs = match name {
        "tokens" => "wte.weight".to_string(),
        "positions" => "wpe.weight".to_string(),
        "ln_f.weight" | "ln_f.bias" => name.to_string(),
        _ => {
            let rest = name.strip_prefix("blocks.")?;
            let (layer, ours) = rest.split_once('.')?;
            let (_, gpt2) = BLOCK_NAMES.iter().find(|(o, _)| *o == ours)?;
            format!("h.{layer}.{gpt2}")
        }
    };
    Some(format!("transformer.{theirs}"))
}

#[cfg(test)]
mod tests {
    use super::Gpt2Config;
    use std::path::Path;

    /// A config.json that leaves out the fields with defaults reads as
    /// transformers' GPT2Config fills them (the tanh GELU, epsilon 1e-5,
    /// attention scaled by 1/sqrt(head size), tied embeddings), which
    /// captune's decoder computes.
    #[test]
    fn a_config_without_its_defaulted_fields_reads_as_transformers_fills_them() {
        let json = r#"{"model_type": "gpt2", "vocab_size": 50, "n_positions": 16,
                       "n_embd": 8, "n_layer": 1, "n_head": 2}"#;
        let c: Gpt2Config = serde_json::from_str(json).unwrap();
        assert_eq!(c.activation_function, "gelu_new");
        assert_eq!(c.layer_norm_epsilon, 1e-5);
        assert!(c.scale_attn_weights && c.tie_word_embeddings);
        assert!(!c.scale_attn_by_inverse_layer_idx && !c.add_cross_attention);
        assert_eq!(c.n_inner, None);
        c.check(Path::new("config.json")).unwrap();
    }

    /// Each option captune's decoder does not compute is refused, naming
    /// its field; the values it does compute are not.
    #[test]
    fn each_option_the_decoder_lacks_is_refused_by_name() {
        let read = |extra: &str| -> Gpt2Config {
            let json = format!(
                r#"{{"model_type": "gpt2", "vocab_size": 50, "n_positions": 16,
                    "n_embd": 8, "n_layer": 1, "n_head": 2{extra}}}"#
            );
            serde_json::from_str(&json).unwrap()
        };
        let path = Path::new("config.json");
        for fine in [
            r#", "activation_function": "gelu_pytorch_tanh""#,
            r#", "layer_norm_epsilon": 1e-5, "n_inner": 32"#,
        ] {
            read(fine).check(path).unwrap();
        }
        for (extra, field) in [
            (r#", "activation_function": "relu""#, "activation_function"),
            (r#", "layer_norm_epsilon": 1e-6"#, "layer_norm_epsilon"),
            (r#", "layer_norm_epsilon": 1e-4"#, "layer_norm_epsilon"),
            (r#", "n_inner": 16"#, "n_inner"),
            (r#", "scale_attn_weights": false"#, "attention scaling"),
            (
                r#", "scale_attn_by_inverse_layer_idx": true"#,
                "attention scaling",
            ),
            (r#", "add_cross_attention": true"#, "add_cross_attention"),
            (r#", "tie_word_embeddings": false"#, "tie_word_embeddings"),
        ] {
            let e = read(extra).check(path).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
        for (json, field) in [
            (
                r#"{"model_type": "gpt_neo", "vocab_size": 50, "n_positions": 16,
                    "n_embd": 8, "n_layer": 1, "n_head": 2}"#,
                "model_type",
            ),
            (
                r#"{"model_type": "gpt2", "vocab_size": 50, "n_positions": 16,
                    "n_embd": 8, "n_layer": 1, "n_head": 3}"#,
                "n_head",
            ),
        ] {
            let c: Gpt2Config = serde_json::from_str(json).unwrap();
            let e = c.check(path).unwrap_err().to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
    }
}
