//! `captune convert`: a published checkpoint in the folder `captune
//! export` writes, which `--decoder hf:DIR` and `--checkpoint hf:DIR` read:
//! ClipCap's own (`--clipcap`) or BLIP's own (`--blip`); or, for
//! self-critical training's LSTMs (`--self-critical`), a captune
//! checkpoint.

use super::check_new_output;
use anyhow::Result;
use captune::captioner::{clipcap, export, self_critical};
use captune::cpu::CpuBackend;
use captune::model::blip_original;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// ClipCap's own checkpoint (Mokady et al., 2021): the torch.save of a
    /// ClipCaptionModel's state dict, such as its released coco_weights.pt,
    /// MLP or transformer mapper. Read without running its pickle.
    #[arg(
        long,
        value_name = "FILE.pt",
        required_unless_present_any = ["blip", "self_critical"],
        conflicts_with_all = ["blip", "self_critical"],
        requires = "gpt2"
    )]
    pub clipcap: Option<PathBuf>,
    /// With --clipcap: the Hugging Face GPT-2 folder it was trained with
    /// (config.json, tokenizer.json and model.safetensors): its config
    /// and tokenizer; the weights are the checkpoint's, but for the
    /// positions past the captioner's, which the written folder keeps from
    /// this one.
    #[arg(long, value_name = "FOLDER", requires = "clipcap")]
    pub gpt2: Option<PathBuf>,
    /// Caption positions, as [model] max_len counts them (the start and
    /// the end included). Default: 68 with --clipcap (ClipCap's own
    /// decoding takes at most 67 pieces), 18 with --self-critical (its
    /// max_length of 16 words).
    #[arg(
        long,
        value_parser = clap::value_parser!(u32).range(3..),
        conflicts_with = "blip"
    )]
    pub max_len: Option<u32>,
    /// BLIP's own captioning checkpoint (Li et al., 2022), as its code
    /// saves it ({"model": state_dict}: model_base_caption_capfilt_large.pth,
    /// or SMILE's released model). Read without running its pickle.
    #[arg(
        long,
        value_name = "FILE.pth",
        requires = "blip_config",
        conflicts_with = "self_critical"
    )]
    pub blip: Option<PathBuf>,
    /// With --blip: a Hugging Face BLIP folder of the checkpoint's sizes
    /// (Salesforce/blip-image-captioning-base saved with save_pretrained,
    /// for BLIP-base), for its config, tokenizer and image processor.
    #[arg(long, value_name = "FOLDER", requires = "blip")]
    pub blip_config: Option<PathBuf>,
    /// Self-critical training's own LSTM (self-critical.pytorch's
    /// FCModel, NewFCModel, Att2in2Model or UpDownModel): the torch.save of its state
    /// dict (model.pth), read without running its pickle. --out is then
    /// the captune checkpoint to write.
    #[arg(long, value_name = "FILE.pth", requires = "vocab")]
    pub self_critical: Option<PathBuf>,
    /// With --self-critical: the vocabulary of its data, the cocotalk.json
    /// its prepro_labels.py wrote (ix_to_word).
    #[arg(long, value_name = "FILE.json", requires = "self_critical")]
    pub vocab: Option<PathBuf>,
    /// With --self-critical and an attention model: the image tokens
    /// (regions) per image of the features it reads.
    #[arg(
        long,
        value_name = "N",
        requires = "self_critical",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub tokens: Option<u64>,
    /// The folder to write (with --self-critical, the checkpoint file).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: &ConvertArgs) -> Result<()> {
    check_new_output(&args.out, args.overwrite, "--out")?;
    let max_len = |default: u32| args.max_len.unwrap_or(default) as usize;
    if let (Some(file), Some(vocab)) = (&args.self_critical, &args.vocab) {
        let b = CpuBackend::new();
        let ck = self_critical::read(
            &b,
            file,
            vocab,
            max_len(18),
            args.tokens.map(|n| n as usize),
        )?;
        ck.save(&b, &args.out, Default::default())?;
        let (from, to) = (file.display(), args.out.display());
        if ck.model.config.image_tokens > 0 {
            eprintln!(
                "converted {from} to {to}: an attention model, trained on region features, \
                 which captune has no input for yet (docs/lstm.md)"
            );
        } else {
            eprintln!(
                "converted {from} to {to} (read it as --checkpoint {to} with its features, or \
                 start a run with --init {to})"
            );
        }
        return Ok(());
    }
    let from = match (&args.clipcap, &args.gpt2, &args.blip, &args.blip_config) {
        (Some(file), Some(gpt2), _, _) => {
            let b = CpuBackend::new();
            let ck = clipcap::read(&b, file, gpt2, max_len(68))?;
            export::to_hf(&b, &ck, &args.out, Some(gpt2))?;
            file
        }
        (_, _, Some(file), Some(config)) => {
            blip_original::convert(file, config, &args.out)?;
            file
        }
        _ => unreachable!(
            "clap requires --clipcap with --gpt2, --blip with --blip-config, or \
             --self-critical with --vocab"
        ),
    };
    eprintln!(
        "converted {} to {} (read it as --decoder hf:{} or --checkpoint hf:{})",
        from.display(),
        args.out.display(),
        args.out.display(),
        args.out.display()
    );
    Ok(())
}
