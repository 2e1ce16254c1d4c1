//! `captune convert`: a published checkpoint in the folder `captune
//! export` writes, which `--decoder hf:DIR`, `caption`, `eval` and
//! `inspect` read.

use super::check_new_output;
use anyhow::Result;
use captune::captioner::{clipcap, export};
use captune::cpu::CpuBackend;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// ClipCap's own checkpoint (Mokady et al., 2021): the torch.save of a
    /// ClipCaptionModel's state dict, such as its released coco_weights.pt,
    /// MLP or transformer mapper. Read without running its pickle.
    #[arg(long, value_name = "FILE.pt")]
    pub clipcap: PathBuf,
    /// The Hugging Face GPT-2 folder it was trained with: its config.json
    /// and tokenizer.json (its weights are the checkpoint's).
    #[arg(long, value_name = "FOLDER")]
    pub gpt2: PathBuf,
    /// Caption positions, as [model] max_len counts them: ClipCap's own
    /// decoding takes at most 67 pieces.
    #[arg(long, default_value_t = 68, value_parser = clap::value_parser!(u32).range(3..))]
    pub max_len: u32,
    /// The folder to write (as `captune export --hf` writes one).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: &ConvertArgs) -> Result<()> {
    check_new_output(&args.out, args.overwrite, "--out")?;
    let b = CpuBackend::new();
    let ck = clipcap::read(&b, &args.clipcap, &args.gpt2, args.max_len as usize)?;
    export::to_hf(&b, &ck, &args.out, Some(&args.gpt2))?;
    eprintln!(
        "converted {} to {} (read it with --decoder hf:{} or --checkpoint hf:{})",
        args.clipcap.display(),
        args.out.display(),
        args.out.display(),
        args.out.display()
    );
    Ok(())
}
