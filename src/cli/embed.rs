//! `captune embed`: a data set's image embeddings (a features file)
//! from a trained retriever.

use super::check_new_output;
use anyhow::{Context, Result};
use captune::backend::Backend;
use captune::retriever::Checkpoint;
use captune::retriever::train::Prepared;
use captune::source::DataArgs;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// The retriever checkpoint.
    #[arg(long)]
    pub checkpoint: PathBuf,
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
    let (data, checkpoint, out) = (&args.data, args.checkpoint.as_path(), args.out.as_path());
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
    println!(
        "wrote {} embeddings of {} dimensions to {}",
        features.ids.len(),
        features.dim,
        out.display()
    );
    Ok(())
}
