//! `captune embed`: a data set's image embeddings (a features file)
//! from a trained retriever, or from a Hugging Face CLIP's image tower.

use super::check_new_output;
use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::data::clip_image::ClipImageProcessor;
use captune::retriever::Checkpoint;
use captune::retriever::train::Prepared;
use captune::source::DataArgs;
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
    /// preprocessor_config.json, as CLIPModel and CLIPImageProcessor save
    /// them): its image tower embeds each image, preprocessed as CLIP's
    /// image processor does.
    #[arg(long, value_name = "FOLDER")]
    pub clip: Option<PathBuf>,
    /// Output features file (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

/// Refuses an existing --out before anything slow.
pub fn check(args: &EmbedArgs) -> Result<()> {
    check_new_output(&args.out, args.overwrite, "--out")
}

pub fn run<B: Backend>(b: &B, args: &EmbedArgs) -> Result<()> {
    let Some(checkpoint) = &args.checkpoint else {
        let dir = args
            .clip
            .as_deref()
            .expect("clap requires --checkpoint or --clip");
        return run_clip(b, args, dir);
    };
    let (data, checkpoint, out) = (&args.data, checkpoint.as_path(), args.out.as_path());
    let mut ck = Checkpoint::load(b, checkpoint, 128)?;
    let prep = Prepared::new(data.load()?, ck.model.config.image_size)?;
    let all: Vec<usize> = (0..prep.data.items.len()).collect();
    let bar = captune::progress::Progress::terminal()
        .start(&format!("embedding {} images", all.len()), all.len() as u64);
    let embeddings =
        captune::retriever::eval::embed_images(b, &mut ck.model, &prep.images, &all, &bar)?;
    bar.finish_and_clear();
    let bytes = std::fs::read(checkpoint)
        .with_context(|| format!("cannot read {}", checkpoint.display()))?;
    let features = captune::data::features::Features {
        source: out.to_path_buf(),
        ids: prep.data.items.iter().map(|i| i.id.clone()).collect(),
        dim: ck.model.config.embed_dim,
        embeddings,
        encoder: Some(captune::data::features::retriever_encoder_id(&bytes)),
    };
    let metadata = HashMap::from([
        (
            "encoder".to_string(),
            format!("captune retriever {}", checkpoint.display()),
        ),
        ("dataset".to_string(), prep.data.name.clone()),
    ]);
    features.save(out, metadata)?;
    report(&features, out);
    Ok(())
}

fn report(features: &captune::data::features::Features, out: &Path) {
    println!(
        "wrote {} embeddings of {} dimensions to {}",
        features.ids.len(),
        features.dim,
        out.display()
    );
}

/// Batch of images the CLIP image tower embeds at once.
const CLIP_BATCH: usize = 32;

fn run_clip<B: Backend>(b: &B, args: &EmbedArgs, dir: &Path) -> Result<()> {
    let clip = captune::model::clip::read(dir)?;
    let processor = ClipImageProcessor::load(dir)?;
    let mut model = clip.into_retriever(b, CLIP_BATCH)?;
    let data = args.data.load()?;
    let paths: Vec<&Path> = data.items.iter().map(|i| i.image.as_path()).collect();
    let bar = captune::progress::Progress::terminal().start(
        &format!("embedding {} images with CLIP", paths.len()),
        paths.len() as u64,
    );
    let embedded = captune::model::clip::embed_files(b, &mut model, &processor, &paths, &bar)?;
    bar.finish_and_clear();
    for why in &embedded.skipped {
        eprintln!("{why}");
    }
    if embedded.kept.is_empty() {
        bail!("{}: no image could be read", data.name);
    }
    let features = captune::data::features::Features {
        source: args.out.clone(),
        ids: embedded
            .kept
            .iter()
            .map(|&k| data.items[k].id.clone())
            .collect(),
        dim: model.config.embed_dim,
        embeddings: embedded.embeddings,
        encoder: Some(captune::model::clip::encoder_id(dir)?),
    };
    let metadata = HashMap::from([
        ("encoder".to_string(), format!("CLIP {}", dir.display())),
        ("dataset".to_string(), data.name.clone()),
    ]);
    features.save(&args.out, metadata)?;
    report(&features, &args.out);
    Ok(())
}
