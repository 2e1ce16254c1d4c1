//! The commands, one file each, and the command-line plumbing they share.

pub mod app;
pub mod bench;
pub mod caption;
pub mod captioner;
pub mod convert;
pub mod data;
pub mod demo;
pub mod embed;
pub mod eval;
pub mod export;
pub mod info;
pub mod inspect;
pub mod report;
pub mod retriever;
pub mod score;
pub mod train;

use anyhow::Result;
use std::path::Path;

/// Refuses to write over an existing file or folder unless `overwrite`
/// (`flag` names the option that chose the path, for the message).
pub fn check_new_output(path: &Path, overwrite: bool, flag: &str) -> Result<()> {
    let taken = match std::fs::read_dir(path) {
        Ok(mut entries) => entries.next().is_some(),
        Err(_) => path.exists(),
    };
    if taken && !overwrite {
        anyhow::bail!(
            "{} already exists; pass --overwrite to replace it, or choose another {flag}",
            path.display()
        );
    }
    Ok(())
}

/// The retriever's shape for a new one (`retriever train` without --init).
#[derive(clap::Args, Clone)]
pub struct RetrieverShape {
    /// Images are resized to this square size.
    #[arg(long, default_value_t = 64)]
    pub image_size: u32,
    #[arg(long, default_value_t = 8)]
    pub patch: u32,
    #[arg(long, default_value_t = 96)]
    pub width: usize,
    #[arg(long, default_value_t = 3)]
    pub image_layers: usize,
    #[arg(long, default_value_t = 2)]
    pub text_layers: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    #[arg(long, default_value_t = 128)]
    pub embed_dim: usize,
    /// Text positions, <bos> and <eos> included; longer captions are truncated.
    #[arg(long, default_value_t = 40)]
    pub max_len: usize,
    /// Words seen fewer times in the training captions become <unk>.
    #[arg(long, default_value_t = captune::data::vocab::DEFAULT_MIN_COUNT)]
    pub min_count: usize,
}

impl RetrieverShape {
    /// A retriever with fresh weights and a vocabulary from `data`.
    pub fn new_retriever<B: captune::backend::Backend>(
        &self,
        b: &B,
        data: &captune::data::Dataset,
        batch: usize,
        seed: u64,
    ) -> Result<captune::retriever::Checkpoint<B>> {
        use captune::model::transformer::TransformerConfig;
        let vocab = captune::retriever::train::vocab_for(data, self.min_count)?;
        let tower = |layers, causal| TransformerConfig::new(self.width, layers, self.heads, causal);
        let config = captune::model::retriever::RetrieverConfig {
            image_size: self.image_size,
            patch: self.patch,
            image: tower(self.image_layers, false),
            text: tower(self.text_layers, true),
            max_len: self.max_len,
            vocab_size: vocab.len(),
            embed_dim: self.embed_dim,
            image_pool: captune::model::retriever::ImagePool::Mean,
            biases: true,
        };
        Ok(captune::retriever::Checkpoint {
            model: captune::model::retriever::Retriever::new(b, config, batch, seed)?,
            vocab,
        })
    }
}
