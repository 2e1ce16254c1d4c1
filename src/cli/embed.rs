//! `captune embed`: a data set's image embeddings (a features file)
//! from a trained retriever, or from a Hugging Face CLIP's image tower;
//! with `--image-tokens`, a BLIP or CLIP vision tower's image tokens
//! beside them.

use super::check_new_output;
use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::data::Dataset;
use captune::data::features::{ENCODER_ID, Features};
use captune::model::token_tower::TowerKind;
use captune::progress::Progress;
use captune::retriever::Checkpoint;
use captune::retriever::eval::unit_rows_and_norms;
use captune::retriever::frozen::{CLIP_BATCH, FrozenRetriever, clip_folder};
use captune::retriever::train::Prepared;
use captune::source::{DataArgs, image_tokens};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// The retriever checkpoint.
    #[arg(long, required_unless_present = "clip", conflicts_with = "clip")]
    pub checkpoint: Option<PathBuf>,
    /// A Hugging Face CLIP folder instead (config.json, model.safetensors,
    /// preprocessor_config.json or processor_config.json, as CLIPModel and
    /// CLIP's processor save them): its image tower embeds each image,
    /// preprocessed as CLIP's image processor does.
    #[arg(long, value_name = "FOLDER")]
    pub clip: Option<PathBuf>,
    /// Also write every image's tokens from this BLIP or CLIP folder's
    /// vision tower (hf:FOLDER) into the file, in float16 after the
    /// embeddings: a BLIP decoder (or an attention LSTM reading that
    /// tower's tokens) trained on the file reads them instead of computing
    /// them into the cache. BLIP-base's are 0.9 MB an image.
    #[arg(long, value_name = "hf:FOLDER")]
    pub image_tokens: Option<String>,
    /// Output features file (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

/// Refuses an existing --out, or an --image-tokens that names no BLIP or
/// CLIP folder, before anything slow.
pub fn check(args: &EmbedArgs) -> Result<()> {
    check_new_output(&args.out, args.overwrite, "--out")?;
    if let Some(spec) = &args.image_tokens {
        let dir = token_folder(spec)?;
        TowerKind::of_folder(&dir)?.patcher(&dir)?;
    }
    Ok(())
}

/// The BLIP or CLIP folder `--image-tokens hf:FOLDER` names.
fn token_folder(spec: &str) -> Result<PathBuf> {
    match spec.strip_prefix("hf:").filter(|d| !d.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => {
            bail!("--image-tokens {spec:?}: name a Hugging Face BLIP or CLIP folder as hf:PATH")
        }
    }
}

pub fn run<B: Backend>(b: &B, args: &EmbedArgs) -> Result<()> {
    let Some(checkpoint) = &args.checkpoint else {
        let dir = args
            .clip
            .as_deref()
            .expect("clap requires --checkpoint or --clip");
        return run_clip(b, args, dir);
    };
    if clip_folder(checkpoint).is_some() {
        bail!("--checkpoint takes a retriever checkpoint; for a CLIP folder pass --clip FOLDER");
    }
    let (data, checkpoint, out) = (&args.data, checkpoint.as_path(), args.out.as_path());
    let mut ck = Checkpoint::load(b, checkpoint, 128)?;
    let prep = Prepared::new(data.load()?, ck.model.config.image_size)?;
    let all: Vec<usize> = (0..prep.data.items.len()).collect();
    let bar = captune::progress::Progress::terminal()
        .start(&format!("embedding {} images", all.len()), all.len() as u64);
    let raw =
        captune::retriever::eval::embed_images_raw(b, &mut ck.model, &prep.images, &all, &bar)?;
    bar.finish_and_clear();
    let (embeddings, norms) = unit_rows_and_norms(raw, ck.model.config.embed_dim);
    let bytes = std::fs::read(checkpoint)
        .with_context(|| format!("cannot read {}", checkpoint.display()))?;
    let features = Features {
        source: out.to_path_buf(),
        ids: prep.data.items.iter().map(|i| i.id.clone()).collect(),
        dim: ck.model.config.embed_dim,
        embeddings,
        encoder: Some(captune::data::features::retriever_encoder_id(&bytes)),
        norms: Some(norms),
    };
    let metadata = HashMap::from([
        (
            "encoder".to_string(),
            format!("captune retriever {}", checkpoint.display()),
        ),
        ("dataset".to_string(), prep.data.name.clone()),
    ]);
    write(b, args, &prep.data, &features, metadata)
}

/// Writes the features file: the embeddings, and the image tokens
/// `--image-tokens` asks for after them.
fn write<B: Backend>(
    b: &B,
    args: &EmbedArgs,
    data: &Dataset,
    features: &Features,
    mut metadata: HashMap<String, String>,
) -> Result<()> {
    match &args.image_tokens {
        None => features.save(&args.out, metadata)?,
        Some(spec) => {
            let folder = token_folder(spec)?;
            if let Some(encoder) = &features.encoder {
                metadata.insert(ENCODER_ID.into(), encoder.clone());
            }
            let embeddings = (&features.embeddings[..], features.dim);
            let progress = Progress::terminal();
            image_tokens::write_with_embeddings(
                b, data, &folder, &args.out, embeddings, metadata, &progress,
            )?;
        }
    }
    report(features, &args.out);
    Ok(())
}

fn report(features: &Features, out: &Path) {
    println!(
        "wrote {} embeddings of {} dimensions to {}",
        features.ids.len(),
        features.dim,
        out.display()
    );
}

fn run_clip<B: Backend>(b: &B, args: &EmbedArgs, dir: &Path) -> Result<()> {
    // As --retriever takes it, too.
    let dir = clip_folder(dir).unwrap_or(dir);
    let mut clip = FrozenRetriever::clip(b, dir, CLIP_BATCH)?;
    let mut data = args.data.load()?;
    let (embeddings, norms) = clip.embed_dataset(b, &mut data, &Progress::terminal())?;
    if !data.report.is_clean() {
        eprintln!("{}", data.report);
    }
    let features = Features {
        source: args.out.clone(),
        ids: data.items.iter().map(|i| i.id.clone()).collect(),
        dim: clip.model.config.embed_dim,
        embeddings,
        encoder: Some(captune::model::clip::encoder_id(dir)?),
        norms: Some(norms),
    };
    let metadata = HashMap::from([
        ("encoder".to_string(), format!("CLIP {}", dir.display())),
        ("dataset".to_string(), data.name.clone()),
    ]);
    write(b, args, &data, &features, metadata)
}
