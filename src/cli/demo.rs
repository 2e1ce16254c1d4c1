//! `captune demo`: the effect of SMILE (Yue et al., 2023) on the shapes world, end to
//! end. Embed the images with the shapes retriever the binary carries,
//! train the captioner with MLE, continue with SMILE, and compare the two
//! on the test images.

use super::captioner::MeteorArgs;
use super::check_new_output;
use super::train::{self, ObjectiveArgs, TrainArgs};
use anyhow::Result;
use captune::backend::Backend;
use captune::captioner::decode::Decoding;
use captune::captioner::evaluate as captioner_evaluate;
use captune::captioner::evaluate::CaptionMetrics;
use captune::captioner::objective::MLE_WEIGHT;
use captune::captioner::objectives::settings::{SettingValue, Settings};
use captune::captioner::run_folder::RunFolder;
use captune::data::Split;
use captune::retriever::train::Prepared;
use captune::shapes::ShapesConfig;
use captune::source::DataArgs;
use captune::source::embeddings::CaptionData;
use captune::source::embeddings::{self, FeatureArgs};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Write {"retriever": {...}, "mle": {...}, "smile": {...}} here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where the two runs go (default: runs/demo, or runs/demo-2... when taken).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace --out (an earlier demo) and --json if they exist.
    #[arg(long)]
    pub overwrite: bool,
    #[arg(long, default_value_t = 15)]
    pub mle_epochs: usize,
    #[arg(long, default_value_t = 2)]
    pub smile_epochs: usize,
    /// The SMILE stage's learning rate (it fine-tunes the MLE model).
    #[arg(long, default_value_t = 5e-4)]
    pub smile_lr: f32,
    /// lambda of the SMILE stage: lambda * MLE + (1 - lambda) * SMILE. The
    /// paper's best self-retrieval came with 0.01; on the shapes world 0.3
    /// keeps fact precision at 0.8 while nearly doubling the length
    /// (docs/results.md).
    #[arg(long, default_value_t = 0.3)]
    pub smile_mle_weight: f32,
    /// Test images scored.
    #[arg(long, default_value_t = 500)]
    pub eval_images: usize,
    /// The captioner preset.
    #[arg(long, default_value = "shapes")]
    pub preset: String,
    #[command(flatten)]
    pub shapes: ShapesConfig,
}

/// The demo table's rows: (label, metric key, digits).
const ROWS: [(&str, &str, usize); 9] = [
    ("mean length", "mean_length", 2),
    ("lexical diversity", "lexical_diversity", 0),
    ("self-retrieval R@1", "self_retrieval_r1", 3),
    ("self-retrieval R@5", "self_retrieval_r5", 3),
    ("CLIPScore-style", "clipscore", 2),
    ("fact precision", "fact_precision", 3),
    ("fact recall", "fact_recall", 3),
    ("BLEU-4", "BLEU-4", 3),
    ("CIDEr-D", "CIDEr-D", 3),
];

pub fn demo<B: Backend>(b: &B, args: &DemoArgs) -> Result<()> {
    let out = match &args.out {
        Some(out) => {
            check_new_output(out, args.overwrite, "--out")?;
            out.clone()
        }
        None => RunFolder::free(Path::new("runs/demo")),
    };
    if let Some(json) = &args.json {
        check_new_output(json, args.overwrite, "--json")?;
    }
    let data_args = DataArgs::shapes(args.shapes);
    eprintln!("[1/5] the retriever");
    let retriever_path = captune::cache::shapes_retriever()?;
    let features = FeatureArgs {
        retriever: Some(retriever_path.clone()),
        ..FeatureArgs::default()
    };
    eprintln!("[2/5] embedding the shapes world with the shapes retriever");
    let progress = captune::progress::Progress::terminal();
    let (data, retriever) = embeddings::load(b, &data_args, &features, None, &progress)?;
    let mut retriever = retriever.expect("the demo always has its retriever");
    let retriever_recall = {
        // Only the val images: the others' embeddings are already there.
        let val = data_args.load()?.only(Split::Val);
        let mut ck = captune::retriever::Checkpoint::load(b, &retriever_path, 128)?;
        let prep = Prepared::new(val, ck.model.config.image_size)?;
        prep.evaluate(b, &mut ck, Split::Val)?
    };
    eprintln!("retriever on val: {retriever_recall}");
    // The two stages, by the objectives' registry names (which are also
    // their run folders' names).
    let stage = |objective: &str, epochs: usize, init: Option<PathBuf>| {
        let smile = init.is_some();
        let settings = if smile {
            Settings::from([(
                MLE_WEIGHT.key.to_string(),
                SettingValue::Number(args.smile_mle_weight.into()),
            )])
        } else {
            Settings::new()
        };
        TrainArgs {
            data: data_args.clone(),
            features: features.clone(),
            preset: Some(args.preset.clone()),
            config: None,
            objective: ObjectiveArgs {
                objective: Some(objective.to_string()),
                settings,
            },
            epochs: Some(epochs),
            lr: smile.then_some(args.smile_lr),
            batch: None,
            labelled: None,
            init,
            decoder: None,
            gpt2: None,
            blip_config: None,
            image_feed: None,
            image_tokens: None,
            train_vision: false,
            prompt: None,
            mapper: None,
            out: out.join(objective),
            resume: false,
            validate_only: false,
            overwrite: args.overwrite,
            no_collapse_stop: false,
            freeze_decoder: false,
            // The demo's table has no METEOR; its validations skip reading
            // the paraphrase table.
            meteor: MeteorArgs::off(),
        }
    };
    eprintln!("[3/5] training the captioner with MLE");
    let mle_args = stage("mle", args.mle_epochs, None);
    let mle = train::train(b, &mle_args, Some((&data, Some(&mut retriever))))?;
    eprintln!("[4/5] continuing with SMILE");
    let smile_args = stage(
        "smile",
        args.smile_epochs,
        Some(mle_args.out.join("checkpoint.safetensors")),
    );
    let smile = train::train(b, &smile_args, Some((&data, Some(&mut retriever))))?;
    eprintln!("[5/5] scoring {} test images", args.eval_images);
    let test: Vec<usize> = data
        .items(Split::Test)
        .into_iter()
        .take(args.eval_images)
        .collect();
    let mut scored = Vec::new();
    for ck in [&mle, &smile] {
        let metrics = captioner_evaluate::evaluate_items(
            b,
            ck,
            &data,
            &test,
            &Decoding::Greedy,
            Some(&mut retriever),
        )?;
        let examples = captioner_evaluate::caption_items(
            b,
            ck,
            &data,
            &test[..3.min(test.len())],
            &Decoding::Greedy,
            &Default::default(),
        )?;
        scored.push((metrics, examples));
    }
    print_table(&data, &test, &scored)?;
    if let Some(path) = &args.json {
        let pick = |m: &CaptionMetrics| -> Result<serde_json::Value> {
            let all = serde_json::to_value(m)?;
            Ok(ROWS
                .iter()
                .map(|(_, key, _)| (key.to_string(), all[key].clone()))
                .collect())
        };
        let out = json!({
            "retriever": retriever_recall,
            "mle": pick(&scored[0].0)?,
            "smile": pick(&scored[1].0)?,
        });
        captune::tensorfile::write_atomic(path, serde_json::to_string_pretty(&out)?.as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn print_table(
    data: &CaptionData,
    test: &[usize],
    scored: &[(CaptionMetrics, Vec<Vec<String>>)],
) -> Result<()> {
    println!("\n{:<22}{:>12}{:>12}", "", "MLE", "SMILE");
    let values: Vec<serde_json::Value> = scored
        .iter()
        .map(|s| serde_json::to_value(&s.0))
        .collect::<Result<_, _>>()?;
    for (label, key, digits) in ROWS {
        let cell = |v: &serde_json::Value| match v[key].as_f64() {
            Some(x) => format!("{x:>12.digits$}"),
            None => format!("{:>12}", "–"),
        };
        println!("{label:<22}{}{}", cell(&values[0]), cell(&values[1]));
    }
    for (k, &i) in test.iter().take(3).enumerate() {
        let item = &data.data.items[i];
        println!("\nimage {} (reference: {})", item.id, item.captions[0].raw);
        println!("  MLE:   {}", scored[0].1[k][0]);
        println!("  SMILE: {}", scored[1].1[k][0]);
    }
    Ok(())
}
