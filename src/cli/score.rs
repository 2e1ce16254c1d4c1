//! `captune score`: any COCO-format results file against a split's
//! references.

use super::captioner::{FluencyArgs, MeteorArgs, parse_split, print_metrics};
use anyhow::{Context, Result, bail};
use captune::cpu::CpuBackend;
use captune::data::tokenize::ptb_tokenize;
use captune::data::{Dataset, Item, Split};
use captune::metrics::clipscore::{CorpusScores, PROMPT, corpus_scores};
use captune::metrics::coco_scores;
use captune::progress::Progress;
use captune::retriever::frozen::{CLIP_BATCH, FrozenRetriever, clip_folder};
use captune::source::DataArgs;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    /// A Hugging Face CLIP folder (config.json, model.safetensors,
    /// preprocessor_config.json or processor_config.json, tokenizer.json):
    /// also report CLIPScore and
    /// RefCLIPScore as Hessel et al. (2021) define them, reading the
    /// images (on the CPU).
    #[arg(long, value_name = "FOLDER")]
    pub clip: Option<PathBuf>,
    #[command(flatten)]
    pub fluency: FluencyArgs,
    #[command(flatten)]
    pub meteor: MeteorArgs,
}

/// What `score` reports: the reference-based scores of each image's first
/// caption, and with several captions per image their diversity.
#[derive(serde::Serialize)]
struct Scores {
    images: usize,
    captions_per_image: usize,
    #[serde(flatten)]
    coco: captune::metrics::CocoScores,
    #[serde(rename = "METEOR", skip_serializing_if = "Option::is_none")]
    meteor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    div1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    div2: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbleu4: Option<f64>,
    #[serde(rename = "CLIP-S", skip_serializing_if = "Option::is_none")]
    clip_s: Option<f64>,
    #[serde(rename = "RefCLIP-S", skip_serializing_if = "Option::is_none")]
    ref_clip_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    perplexity: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    corpus_perplexity: Option<f64>,
}

/// Scores a results file against the split's references, exactly as
/// pycocoevalcap does (its tokenizer, BLEU, CIDEr-D, ROUGE-L, and METEOR
/// where its data is found). Only the
/// references are read, and with a CLIP the images too. Several captions of one image
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
    // Each image's first caption as written, for CLIP; every caption as
    // written, for the fluency.
    let mut raw_firsts: HashMap<String, String> = HashMap::new();
    let mut raw_all: Vec<String> = Vec::new();
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
        raw_firsts
            .entry(id.clone())
            .or_insert_with(|| caption.to_string());
        raw_all.push(caption.to_string());
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
    let clip = match &args.clip {
        Some(dir) => {
            let candidates: Vec<&str> = order.iter().map(|i| raw_firsts[&i.id].as_str()).collect();
            Some(clip_scores(dir, &order, &candidates)?)
        }
        None => None,
    };
    let meteor = match args.meteor.scorer()? {
        Some(mut m) => Some(m.score_tokens(&firsts, &references)?.corpus),
        None => None,
    };
    let ppl = args.fluency.perplexity(&CpuBackend::new(), &raw_all)?;
    let scores = Scores {
        images: sets.len(),
        captions_per_image: per_image,
        coco: coco_scores(&firsts, &references),
        meteor,
        div1: d.as_ref().map(|d| d.div1),
        div2: d.as_ref().map(|d| d.div2),
        mbleu4: d.as_ref().map(|d| d.mbleu4),
        clip_s: clip.map(|c| c.clip_s),
        ref_clip_s: clip.map(|c| c.ref_clip_s),
        perplexity: ppl.map(|p| p.mean),
        corpus_perplexity: ppl.map(|p| p.corpus),
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

/// The mean CLIP-S and RefCLIP-S of each item's candidate, with the CLIP
/// in `dir` on the CPU: its images through CLIP's preprocessing, the
/// candidates and the references after the prompt.
fn clip_scores(dir: &Path, items: &[&Item], candidates: &[&str]) -> Result<CorpusScores> {
    let b = CpuBackend::new();
    // As --retriever takes it, too.
    let dir = clip_folder(dir).unwrap_or(dir);
    let mut clip = FrozenRetriever::clip(&b, dir, CLIP_BATCH)?;
    let mut data = Dataset {
        name: "scored images".into(),
        items: items.iter().map(|&i| i.clone()).collect(),
        report: Default::default(),
    };
    let (images, _) = clip.embed_dataset(&b, &mut data, &Progress::hidden())?;
    if let Some(why) = data.report.warnings.first() {
        bail!("{why}: CLIPScore reads every image's file");
    }
    let prompted = |text: &str| format!("{PROMPT}{text}");
    let candidates: Vec<String> = candidates.iter().map(|c| prompted(c)).collect();
    let references: Vec<String> = (items.iter())
        .flat_map(|i| i.captions.iter().map(|c| prompted(&c.raw)))
        .collect();
    let counts: Vec<usize> = items.iter().map(|i| i.captions.len()).collect();
    Ok(corpus_scores(
        &images,
        &clip.embed_texts(&b, &candidates)?,
        &clip.embed_texts(&b, &references)?,
        &counts,
        clip.model.config.embed_dim,
    ))
}
