//! `captune inspect`: per token, the MLE and SMILE losses and the
//! predictions; with a sequence-level `--objective`, also why the caption
//! as a sample would be rewarded or punished (reward, baseline, advantage
//! and each token's term of the loss); with `--objective discritune`,
//! where the caption ranks among a batch of candidate images and the
//! reward that makes.

use super::DataArgs;
use super::captioner::{Captioner, FeatureArgs, TrainedOn, caption_data};
use super::train::ObjectiveArgs;
use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::captioner::inspect::score_caption;
use captune::captioner::objective::TrainingCorpus;
use captune::captioner::objectives::discritune::{self, HARD_NEGATIVES, RetrievalExplanation};
use captune::captioner::objectives::sequence::{RewardExplanation, explain};
use captune::captioner::reward::CiderReward;
use captune::captioner::train::CaptionData;
use captune::data::tokenize::ptb_tokenize;
use captune::progress::Progress;
use captune::retriever::neighbours::nearest;
use rand::SeedableRng;
use rand::seq::SliceRandom;
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
    /// Also explain the caption's reward under this sequence-level
    /// objective (scst, sll-me, sle) with its settings, as a sample of the
    /// image at a training step would be.
    #[command(flatten)]
    pub objective: ObjectiveArgs,
    /// Seeds the other samples a mean baseline or SLE compares with, and
    /// DiscriTune's other candidate images.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// DiscriTune: the candidate images, the caption's own and others
    /// drawn from its split (a training batch's images), before the hard
    /// negatives.
    #[arg(long, default_value_t = 64)]
    pub candidates: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn inspect<B: Backend>(b: &B, args: &InspectArgs) -> Result<()> {
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    let (data, mut retriever) = caption_data(
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
    if args.objective.objective.as_deref() == Some("discritune") {
        let Some(retriever) = retriever.as_mut() else {
            bail!("--objective discritune: inspect needs the run's retriever (--retriever PATH)");
        };
        let (candidates, ids_of) = candidates(&data, i, args);
        let e = discritune::explain(
            b,
            &mut ck.model,
            &ck.vocab,
            retriever,
            &candidates,
            &ids,
            &args.objective.settings,
        )?;
        if args.json {
            let json = serde_json::json!({"tokens": scores, "retrieval": e});
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            print_scores(&scores);
            print_retrieval(&e, &ids_of);
        }
        return Ok(());
    }
    let explained = match &args.objective.objective {
        None => None,
        Some(name) => {
            let (corpus, _) = TrainingCorpus::training_split(&data.data);
            let reward = CiderReward::for_training(&corpus, &ck.vocab);
            let references: Vec<Vec<String>> = data.data.items[i]
                .captions
                .iter()
                .map(|c| c.tokens.clone())
                .collect();
            let settings = &args.objective.settings;
            Some(
                explain(
                    b,
                    &mut ck.model,
                    &ck.vocab,
                    &reward,
                    &references,
                    &features,
                    &ids,
                    name,
                    settings,
                    args.seed,
                )
                .map_err(|e| {
                    anyhow::anyhow!(
                        "--objective {name}: {e}; inspect explains the reward of scst, sll-me \
                         and sle (the table always shows MLE and SMILE)"
                    )
                })?,
            )
        }
    };
    if args.json {
        match explained {
            None => println!("{}", serde_json::to_string_pretty(&scores)?),
            Some(e) => println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"tokens": scores, "reward": e}))?
            ),
        }
        return Ok(());
    }
    print_scores(&scores);
    if let Some(e) = explained {
        print_explanation(&e);
    }
    Ok(())
}

fn print_explanation(e: &RewardExplanation) {
    println!("\n{}: {:?}", e.objective, e.caption);
    println!(
        "reward {:.3}, baseline {:.3}, advantage {:+.3} ({})",
        e.reward,
        e.baseline,
        e.advantage,
        if e.advantage > 0.0 {
            "its tokens are made more likely"
        } else if e.advantage < 0.0 {
            "its tokens are made less likely"
        } else {
            "no gradient"
        }
    );
    for c in &e.compared_with {
        println!("  {:>6} {:>7.3}  {}", c.kind, c.reward, c.caption);
    }
    println!(
        "{:>12} {:>8} {:>10} {:>8} {:>10}",
        "token", "log p", "-A log p", "entropy", "bonus"
    );
    for t in &e.tokens {
        println!(
            "{:>12} {:>8.3} {:>10.3} {:>8.3} {:>10.4}",
            t.token, t.logprob, t.likelihood_term, t.entropy, t.entropy_term
        );
    }
    let total: f32 = e
        .tokens
        .iter()
        .map(|t| t.likelihood_term + t.entropy_term)
        .sum();
    println!(
        "{:>12} {:>8} {total:>10.3}  (this caption's loss)",
        "total", ""
    );
}

fn print_scores(scores: &[captune::captioner::inspect::TokenScore]) {
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

/// Image `i`'s embedding first, then `--candidates` - 1 others of its
/// split drawn with `--seed`, then its `--hard-negatives` nearest in the
/// split not drawn already; with each candidate's image id.
fn candidates(data: &CaptionData, i: usize, args: &InspectArgs) -> (Vec<f32>, Vec<String>) {
    let split = data.items(data.data.items[i].split);
    let mut others: Vec<usize> = split.iter().copied().filter(|&j| j != i).collect();
    others.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(args.seed));
    others.truncate(args.candidates.saturating_sub(1));
    let mut chosen = vec![i];
    chosen.extend(others);
    let hard = HARD_NEGATIVES.number(&args.objective.settings).round() as usize;
    if hard > 0 {
        let e = data.features_of(&split);
        let own = data.features_of(&[i]);
        let at = split.iter().position(|&j| j == i);
        let near = nearest(&e, data.dim, &own, at, hard)
            .into_iter()
            .map(|k| split[k]);
        let new: Vec<usize> = near.filter(|j| !chosen.contains(j)).collect();
        chosen.extend(new);
    }
    let ids = chosen
        .iter()
        .map(|&j| data.data.items[j].id.clone())
        .collect();
    (data.features_of(&chosen), ids)
}

fn print_retrieval(e: &RetrievalExplanation, ids: &[String]) {
    println!("\n{}: {:?}", e.objective, e.caption);
    println!(
        "rank {} of {} candidates, reward (log p of its own image) {:.3}, baseline {:.3}, \
         advantage {:+.3}",
        e.rank, e.candidates, e.reward, e.baseline, e.advantage
    );
    println!("best matches:");
    for c in &e.best_matches {
        let own = if c.index == 0 {
            "  (its own image)"
        } else {
            ""
        };
        println!(
            "  image {:>10}  cosine {:.3}  p {:.3}{own}",
            ids[c.index], c.cosine, c.probability
        );
    }
    println!("{:>12} {:>8} {:>12}", "token", "log p", "-A/T log p");
    for t in &e.tokens {
        println!(
            "{:>12} {:>8.3} {:>12.4}",
            t.token, t.logprob, t.likelihood_term
        );
    }
    let total: f32 = e
        .tokens
        .iter()
        .map(|t| t.likelihood_term + t.entropy_term)
        .sum();
    println!(
        "{:>12} {:>8} {total:>12.4}  (this caption's loss)",
        "total", ""
    );
}
