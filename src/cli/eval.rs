//! `captune eval`: caption a split and compute every metric; writes
//! COCO-format results.

use super::captioner::{
    Captioner, DecodeArgs, FluencyArgs, MeteorArgs, parse_split, print_metrics, result_id,
};
use super::check_new_output;
use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::captioner::evaluate;
use captune::data::Split;
use captune::metrics::meteor::Meteor;
use captune::progress::Progress;
use captune::source::DataArgs;
use captune::source::embeddings::{self, FeatureArgs, TrainedOn};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    /// A captioner checkpoint, or hf:DIR for a folder `captune export` or
    /// `captune convert` wrote (give the data and its features or
    /// retriever: it records none).
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[arg(long, value_parser = parse_split, default_value = "test")]
    pub split: Split,
    #[command(flatten)]
    pub decoding: DecodeArgs,
    #[command(flatten)]
    pub fluency: FluencyArgs,
    #[command(flatten)]
    pub meteor: MeteorArgs,
    /// Where to write the COCO-format results (default: beside the checkpoint).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Replace the results file if it exists.
    #[arg(long)]
    pub overwrite: bool,
    #[arg(long)]
    pub json: bool,
    /// Also print where the time went: loading, decoding, scoring.
    #[arg(long)]
    pub timings: bool,
}

pub fn eval<B: Backend>(b: &B, args: &EvalArgs) -> Result<()> {
    let path = args.results.clone().unwrap_or_else(|| {
        // Beside the checkpoint file, or the folder hf:DIR names.
        let spec = args.checkpoint.to_string_lossy();
        let checkpoint = PathBuf::from(spec.strip_prefix("hf:").unwrap_or(&spec));
        checkpoint.with_file_name(format!("results-{}.json", args.split.name()))
    });
    check_new_output(&path, args.overwrite, "--results")?;
    let mut timings = Timings::default();
    let captioner = Captioner::load(b, &args.checkpoint)?;
    timings.lap("loading the checkpoint");
    let progress = Progress::terminal();
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    // Before the captions, so that a --meteor without the data fails at
    // once; its resources are read beside the data set.
    let meteor_data = args.meteor.data()?;
    let (loaded, meteor) = std::thread::scope(|s| {
        let meteor = s.spawn(|| meteor_data.as_ref().map(Meteor::load).transpose());
        let loaded = embeddings::load(b, &args.data, &args.features, trained_on, &progress);
        let meteor = meteor.join();
        (
            loaded,
            meteor.unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    });
    let (data, mut retriever) = loaded?;
    captioner.check_dim(&args.checkpoint, &data)?;
    let mut meteor = meteor?;
    timings.lap("loading the data, features, retriever and METEOR's resources");
    let items = data.items(args.split);
    if items.is_empty() {
        bail!(
            "{}: the {} split is empty",
            data.data.name,
            args.split.name()
        );
    }
    let bar = progress.start(
        &format!("captioning {} images", items.len()),
        items.len() as u64,
    );
    let options = args.decoding.options(&bar);
    let captions = evaluate::caption_items(
        b,
        &captioner.ck,
        &data,
        &items,
        &args.decoding.decode,
        &options,
    )?;
    bar.finish_and_clear();
    timings.lap("decoding");
    let results: Vec<serde_json::Value> = items
        .iter()
        .zip(&captions)
        .flat_map(|(&i, caps)| {
            let id = result_id(&data.data.items[i].id);
            caps.iter()
                .map(move |c| serde_json::json!({"image_id": id, "caption": c}))
        })
        .collect();
    captune::tensorfile::write_atomic(&path, serde_json::to_string_pretty(&results)?.as_bytes())?;
    timings.lap("writing the results");
    let mut metrics = evaluate::score_captions(
        b,
        &data,
        &items,
        &captions,
        retriever.as_mut(),
        meteor.as_mut(),
    )?;
    timings.lap("scoring");
    let every: Vec<String> = captions.iter().flatten().cloned().collect();
    if let Some(ppl) = args.fluency.perplexity(b, &every)? {
        (metrics.perplexity, metrics.corpus_perplexity) = (Some(ppl.mean), Some(ppl.corpus));
        timings.lap("fluency");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&metrics)?);
    } else {
        print_metrics(&metrics)?;
        eprintln!("results: {}", path.display());
    }
    if args.timings {
        timings.print();
    }
    Ok(())
}

/// The time of each of eval's phases, in order.
struct Timings {
    last: Instant,
    phases: Vec<(&'static str, Duration)>,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            last: Instant::now(),
            phases: Vec::new(),
        }
    }
}

impl Timings {
    /// Ends the phase `name` now.
    fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.phases.push((name, now - self.last));
        self.last = now;
    }

    fn print(&self) {
        let total: Duration = self.phases.iter().map(|(_, d)| *d).sum();
        eprintln!("timings:");
        for (name, d) in &self.phases {
            eprintln!("{:>9.2} s  {name}", d.as_secs_f64());
        }
        eprintln!("{:>9.2} s  in all", total.as_secs_f64());
    }
}
