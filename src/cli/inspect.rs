//! `captune inspect`: per token, the MLE and SMILE losses and the
//! predictions.

use super::DataArgs;
use super::captioner::{Captioner, FeatureArgs, TrainedOn, caption_data};
use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::captioner::inspect::score_caption;
use captune::data::tokenize::ptb_tokenize;
use captune::progress::Progress;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The image id in the data set.
    #[arg(long)]
    pub image: String,
    /// The caption to score (tokenised as the references are).
    #[arg(long)]
    pub caption: String,
    #[arg(long)]
    pub json: bool,
}

pub fn inspect<B: Backend>(b: &B, args: &InspectArgs) -> Result<()> {
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    let (data, _) = caption_data(
        b,
        &args.data,
        &args.features,
        trained_on,
        &Progress::terminal(),
    )?;
    captioner.check_dim(&args.checkpoint, &data)?;
    let Some(i) = data.data.items.iter().position(|it| it.id == args.image) else {
        bail!("{}: no image with id {:?}", data.data.name, args.image);
    };
    let mut ck = captioner.ck;
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&args.caption), ck.model.config.max_len);
    let features = data.features_of(&[i]);
    let scores = score_caption(b, &mut ck.model, &ck.vocab, &features, &ids)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
        return Ok(());
    }
    println!(
        "{:>12} {:>8} {:>8} {:>7} {:>7}  {:<44} top-5 subset",
        "token", "MLE", "SMILE", "p full", "p sub", "top-5 full"
    );
    let top = |p: &[captune::captioner::inspect::Prediction]| {
        p.iter()
            .map(|x| format!("{} {:.2}", x.token, x.probability))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for s in &scores {
        println!(
            "{:>12} {:>8.3} {:>8.3} {:>7.3} {:>7.3}  {:<44} {}",
            s.token,
            s.mle_loss,
            s.smile_loss,
            s.p_full,
            s.p_subset,
            top(&s.top5_full),
            top(&s.top5_subset)
        );
    }
    Ok(())
}
