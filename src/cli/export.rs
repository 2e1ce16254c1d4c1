//! `captune export`: a captioner as a Hugging Face folder.

use super::check_new_output;
use anyhow::Result;
use captune::captioner::run_folder::RunFolder;
use captune::captioner::{Checkpoint, export};
use captune::cpu::CpuBackend;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ExportArgs {
    /// A run folder (its checkpoint) or a captioner checkpoint file.
    #[arg(value_name = "RUN")]
    pub run: PathBuf,
    /// The folder to write: a GPT-2 that transformers'
    /// GPT2LMHeadModel.from_pretrained loads, its tokenizer, and the
    /// mapper in mapper.safetensors.
    #[arg(long, value_name = "OUT")]
    pub hf: PathBuf,
    /// Replace --hf if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: &ExportArgs) -> Result<()> {
    check_new_output(&args.hf, args.overwrite, "--hf")?;
    let path = if args.run.is_dir() {
        RunFolder::new(&args.run).checkpoint()
    } else {
        args.run.clone()
    };
    let b = CpuBackend::new();
    let ck = Checkpoint::load(&b, &path)?;
    export::to_hf(&b, &ck, &args.hf)?;
    eprintln!(
        "exported {} to {} (docs/checkpoints.md, \"Export to transformers\")",
        path.display(),
        args.hf.display()
    );
    Ok(())
}
