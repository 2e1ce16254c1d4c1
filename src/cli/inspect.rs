//! `captune inspect`: per token, the MLE and SMILE losses and the
//! predictions; with an `--objective` that rewards captions, also why the
//! caption as the image's at a training step would be rewarded or
//! punished (its reward, baseline and advantage, what they were measured
//! against, and each token's term of the loss).

use super::captioner::{Captioner, blip_checkpoint_folder};
use super::train::ObjectiveArgs;
use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::captioner::blip::{BLIP_CAPTION_IDS, blip_checkpoint};
use captune::captioner::explain::{ExplainContext, Explanation};
use captune::captioner::inspect::{TokenScore, score_caption};
use captune::captioner::objectives::{self, OBJECTIVES};
use captune::data::tokenize::ptb_tokenize;
use captune::model::blip::{self, BlipVision};
use captune::model::token_tower::TokenTower;
use captune::progress::Progress;
use captune::source::DataArgs;
use captune::source::embeddings::{self, FeatureArgs, TrainedOn};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    /// A captioner checkpoint, a Hugging Face BLIP folder as it is
    /// (hf:FOLDER), which scores the caption of an image file, or a folder
    /// `captune export` or `captune convert` wrote (hf:DIR).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The image id in the data set; with hf:FOLDER, an image file.
    #[arg(long)]
    pub image: String,
    /// With hf:FOLDER: text fed before the caption, never scored (BLIP's
    /// "a picture of"), as `caption --prompt` feeds it.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// The caption to score (tokenised as the references are).
    #[arg(long)]
    pub caption: String,
    /// Also explain the caption under this objective (one that rewards
    /// captions: scst, sll-me, sle, discritune) with its settings, as the
    /// image's caption at a training step.
    #[command(flatten)]
    pub objective: ObjectiveArgs,
    /// Seeds the other samples a mean baseline or SLE compares with, and
    /// the batch's other images.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The images of the training batch the caption is explained in, its
    /// own and others drawn from its split: those a retrieval reward ranks
    /// it among (DiscriTune), before any hard negatives.
    #[arg(long, default_value_t = 64)]
    pub candidates: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn inspect<B: Backend>(b: &B, args: &InspectArgs) -> Result<()> {
    if let Some(dir) = blip_checkpoint_folder(&args.checkpoint)? {
        return inspect_blip(b, &dir, args);
    }
    if args.prompt.is_some() {
        bail!(
            "--prompt is for a BLIP folder (--checkpoint hf:FOLDER); a trained captioner feeds its own"
        );
    }
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    let (data, mut retriever) = embeddings::load(
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
        .encode(&ptb_tokenize(&args.caption), ck.model.config.max_len)?;
    let inputs = data.inputs_of(&[i], ck.model.config.embedding_reading())?;
    let scores = score_caption(b, &mut ck.model, &ck.vocab, &inputs, &ids)?;
    let explained = match &args.objective.objective {
        None => None,
        Some(name) => {
            let settings = &args.objective.settings;
            let mut objective = objectives::build::<B>(name, settings, ck.vocab.len())?;
            let mut cx = ExplainContext {
                b,
                model: &mut ck.model,
                vocab: &ck.vocab,
                ids: &ids,
                data: &data,
                item: i,
                retriever: retriever.as_mut(),
                batch_images: args.candidates,
                seed: args.seed,
            };
            let e = objective
                .explain(&mut cx)
                .map_err(|e| anyhow::anyhow!("--objective {name}: {e:#}"))?;
            let Some(e) = e else {
                let explaining: Vec<&str> = OBJECTIVES
                    .iter()
                    .filter(|o| o.explains)
                    .map(|o| o.name)
                    .collect();
                bail!(
                    "--objective {name} rewards no caption to explain; inspect explains {} (the \
                     table always shows MLE and SMILE)",
                    explaining.join(", ")
                );
            };
            Some(e)
        }
    };
    if args.json {
        let json = match explained {
            None => serde_json::to_value(&scores)?,
            Some(e) => serde_json::json!({"tokens": scores, "explanation": e}),
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    print_scores(&scores);
    if let Some(e) = explained {
        print_explanation(&e);
    }
    Ok(())
}

/// Scores the caption of the image file `--image` under a Hugging Face
/// BLIP folder as it is: its processor, vision tower, text decoder and
/// tokenizer.
fn inspect_blip<B: Backend>(b: &B, dir: &Path, args: &InspectArgs) -> Result<()> {
    if let Some(name) = &args.objective.objective {
        bail!(
            "--objective {name} explains a trained captioner's caption among its data's images; \
             for a BLIP folder as it is, inspect gives each piece's MLE and SMILE losses"
        );
    }
    let mut folder = blip::read(dir)?;
    let mut tower = TokenTower::Blip(Box::new(BlipVision::new(b, dir, &mut folder)?));
    let prompt = args.prompt.as_deref();
    let mut ck = blip_checkpoint(b, dir, folder, (BLIP_CAPTION_IDS + 1, prompt), false)?;
    let tokens = tower.tokens_of_files(b, &[Path::new(&args.image)])?;
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&args.caption), ck.model.config.max_len)?;
    let scores = score_caption(b, &mut ck.model, &ck.vocab, &tokens, &ids)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
    } else {
        print_scores(&scores);
    }
    Ok(())
}

fn print_explanation(e: &Explanation) {
    println!("\n{}: {:?}", e.objective, e.caption);
    println!(
        "reward {:.3} ({}), baseline {:.3}, advantage {:+.3}: {}",
        e.reward,
        e.reward_is,
        e.baseline,
        e.advantage,
        e.verdict()
    );
    if !e.figures.0.is_empty() {
        println!("{}", e.figures);
    }
    for c in &e.compared_with {
        println!("  {:>9}  {}  {}", c.kind, c.figures, c.what);
    }
    println!(
        "{:>12} {:>8} {:>10} {:>8} {:>10}",
        "token", "log p", "loss term", "entropy", "bonus"
    );
    for t in &e.tokens {
        println!(
            "{:>12} {:>8.3} {:>10.4} {:>8.3} {:>10.4}",
            t.token, t.logprob, t.likelihood_term, t.entropy, t.entropy_term
        );
    }
    println!(
        "{:>12} {:>8} {:>10.4}  (this caption's loss)",
        "total",
        "",
        e.loss()
    );
}

fn print_scores(scores: &[TokenScore]) {
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
    for s in scores {
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
}
