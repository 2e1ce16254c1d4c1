//! `captune export`: a captioner as a Hugging Face folder.

use super::check_new_output;
use anyhow::{Result, bail};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::RunFolder;
use captune::captioner::{CaptionVocab, Checkpoint, export, trained_on};
use captune::cpu::CpuBackend;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ExportArgs {
    /// A run folder (its checkpoint) or a captioner checkpoint file.
    #[arg(value_name = "RUN")]
    pub run: PathBuf,
    /// The folder to write: a GPT-2 that transformers'
    /// GPT2LMHeadModel.from_pretrained loads, its tokenizer, and the
    /// mapper in mapper.safetensors; or, for a BLIP captioner, the BLIP
    /// folder it came from with the trained text decoder.
    #[arg(long, value_name = "OUT")]
    pub hf: PathBuf,
    /// The GPT-2 or BLIP folder the captioner's decoder came from
    /// (default: the run's own `decoder = "hf:FOLDER"`, or a BLIP
    /// checkpoint's record of its image tokens): the export keeps its
    /// config and its positions past the captioner's (and BLIP's vision
    /// tower and processor).
    #[arg(long, value_name = "hf:FOLDER")]
    pub decoder: Option<String>,
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
    let base = match ck.vocab {
        CaptionVocab::WordPieces(_) => Some(blip_folder(args, &path)?),
        _ => base_folder(args, &ck)?,
    };
    export::to_hf(&b, &ck, &args.hf, base.as_deref())?;
    eprintln!(
        "exported {} to {} (docs/checkpoints.md, \"Export to transformers\")",
        path.display(),
        args.hf.display()
    );
    Ok(())
}

/// The BLIP folder a BLIP captioner came from: `--decoder`, else the
/// checkpoint's record of the folder whose image tokens (or, for a
/// trained vision tower, pixels) it read.
fn blip_folder(args: &ExportArgs, checkpoint: &Path) -> Result<PathBuf> {
    if let Some(spec) = &args.decoder {
        let Some(dir) = spec.strip_prefix("hf:").filter(|d| !d.is_empty()) else {
            bail!("--decoder {spec:?}: name the BLIP folder as hf:PATH");
        };
        return Ok(PathBuf::from(dir));
    }
    match trained_on(checkpoint)?.and_then(|s| s.image_tokens.or(s.image_pixels)) {
        Some(dir) => Ok(dir),
        None => bail!(
            "{}: no record of the BLIP folder its decoder came from; pass --decoder hf:FOLDER",
            checkpoint.display()
        ),
    }
}

/// The GPT-2 folder a GPT-2 captioner's decoder came from: `--decoder`,
/// else the run's record of it where that folder is still there. Without
/// one the export is the captioner alone (its positions only), and says so.
fn base_folder(args: &ExportArgs, ck: &Checkpoint<CpuBackend>) -> Result<Option<PathBuf>> {
    if let Some(spec) = &args.decoder {
        let Some(dir) = spec.strip_prefix("hf:").filter(|d| !d.is_empty()) else {
            bail!("--decoder {spec:?}: name the GPT-2 folder as hf:PATH");
        };
        if !matches!(ck.vocab, CaptionVocab::Pieces(_)) {
            bail!(
                "--decoder {spec}: {} has a word vocabulary, so its decoder came from no GPT-2",
                args.run.display()
            );
        }
        return Ok(Some(PathBuf::from(dir)));
    }
    if !matches!(ck.vocab, CaptionVocab::Pieces(_)) {
        return Ok(None);
    }
    let config = RunFolder::new(&args.run).config();
    let recorded = match args.run.is_dir() && config.is_file() {
        true => {
            let model = RunConfig::load(&config)?.model;
            // ClipCap's own checkpoint came with the GPT-2 folder it was trained with.
            model.decoder_folder()?.or(model.gpt2)
        }
        false => None,
    };
    match recorded {
        Some(dir) if dir.join("config.json").is_file() => Ok(Some(dir)),
        recorded => {
            let which = recorded.map_or("no record of it here".to_string(), |d| {
                format!("{} is not there", d.display())
            });
            eprintln!(
                "note: the GPT-2 folder this decoder came from is not known ({which}): the export \
                 holds the captioner's {} positions only and a config of its own; pass \
                 --decoder hf:FOLDER to keep the GPT-2's",
                ck.model.config.seq_len()
            );
            Ok(None)
        }
    }
}
