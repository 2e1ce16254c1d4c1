//! `captune score`: any COCO-format results file against a split's
//! references.

use super::captioner::{parse_split, print_metrics};
use anyhow::{Context, Result, bail};
use captune::data::tokenize::ptb_tokenize;
use captune::data::{Item, Split};
use captune::metrics::coco_scores;
use captune::source::DataArgs;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[arg(long, value_parser = parse_split, default_value = "test")]
    pub split: Split,
    /// COCO-format results: [{"image_id": ..., "caption": ...}].
    #[arg(long)]
    pub results: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// What `score` reports: the reference-based scores of each image's first
/// caption, and with several captions per image their diversity.
#[derive(serde::Serialize)]
struct Scores {
    images: usize,
    captions_per_image: usize,
    #[serde(flatten)]
    coco: captune::metrics::CocoScores,
    #[serde(skip_serializing_if = "Option::is_none")]
    div1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    div2: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbleu4: Option<f64>,
}

/// Scores a results file against the split's references, exactly as
/// pycocoevalcap does (its tokenizer, BLEU, CIDEr-D, ROUGE-L). Only the
/// references are read, never the images. Several captions of one image
/// (`eval --decode sample:5`) are accepted as eval scores them: the first
/// for the reference-based scores, all for Div-1, Div-2 and mBLEU-4.
pub fn score(args: &ScoreArgs) -> Result<()> {
    let data = args.data.source().load_references(&args.data.shapes)?;
    let by_id: HashMap<&str, &Item> = data.split(args.split).map(|i| (i.id.as_str(), i)).collect();
    let file = args.results.display();
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("{file}: cannot read the results"))?;
    let results: Vec<serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{file}: not a JSON list of {{\"image_id\", \"caption\"}}"))?;
    // Each image's captions, images in their first appearance's order.
    let mut order: Vec<&Item> = Vec::new();
    let mut captions: HashMap<String, Vec<Vec<String>>> = HashMap::new();
    for (k, r) in results.iter().enumerate() {
        let id = match &r["image_id"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => bail!("{file}: entry {k} has no image_id"),
        };
        let Some(caption) = r["caption"].as_str() else {
            bail!("{file}: entry {k} (image {id}) has no caption string");
        };
        let Some(item) = by_id.get(id.as_str()) else {
            bail!(
                "{file}: entry {k}: image {id} is not in the {} split of {}",
                args.split.name(),
                data.name
            );
        };
        let list = captions.entry(id).or_default();
        if list.is_empty() {
            order.push(item);
        }
        list.push(ptb_tokenize(caption));
    }
    let sets: Vec<Vec<Vec<String>>> = order
        .iter()
        .map(|item| {
            captions
                .remove(&item.id)
                .expect("every listed image has captions")
        })
        .collect();
    let per_image = sets.iter().map(Vec::len).max().unwrap_or(0);
    if sets.iter().any(|s| s.len() != per_image) {
        bail!(
            "{file}: images have different numbers of captions (from 1 to {per_image}); \
             give every image one caption, or the same number each"
        );
    }
    let firsts: Vec<Vec<String>> = sets.iter().map(|s| s[0].clone()).collect();
    let references: Vec<Vec<Vec<String>>> = order
        .iter()
        .map(|item| item.captions.iter().map(|c| c.tokens.clone()).collect())
        .collect();
    let d = (per_image >= 2).then(|| captune::metrics::diversity::diversity(&sets));
    let scores = Scores {
        images: sets.len(),
        captions_per_image: per_image,
        coco: coco_scores(&firsts, &references),
        div1: d.as_ref().map(|d| d.div1),
        div2: d.as_ref().map(|d| d.div2),
        mbleu4: d.as_ref().map(|d| d.mbleu4),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
    } else {
        println!(
            "{} images of {} {}",
            scores.images,
            data.name,
            args.split.name()
        );
        print_metrics(&scores)?;
    }
    Ok(())
}
