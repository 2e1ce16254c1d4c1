use anyhow::{Result, bail};
use captune::device::{self, DeviceChoice};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cli;

/// Train and inspect image-caption decoders on WGSL compute shaders (wgpu) or the CPU.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// What runs the ops: auto (a hardware GPU if there is one, else the CPU),
    /// gpu (any GPU adapter, software ones included) or cpu. `bench` takes a
    /// comma-separated list, e.g. cpu,gpu.
    #[arg(
        long,
        global = true,
        env = "CAPTUNE_DEVICE",
        value_delimiter = ',',
        default_value = "auto"
    )]
    device: Vec<DeviceChoice>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the chosen backend and every GPU adapter with the limits and features that matter here.
    Info(cli::info::InfoArgs),
    /// Data sets: write the shapes world for a person to look at.
    Data {
        #[command(subcommand)]
        what: cli::data::DataCommand,
    },
    /// The CLIP-like retriever: train it, evaluate its recall.
    Retriever {
        #[command(subcommand)]
        what: cli::retriever::RetrieverCommand,
    },
    /// Write a data set's image embeddings (a features file) with a trained retriever.
    Embed(cli::embed::EmbedArgs),
    /// Train a captioner into a run folder.
    Train(Box<cli::train::TrainArgs>),
    /// Caption a split and compute every metric; writes COCO-format results.
    Eval(Box<cli::eval::EvalArgs>),
    /// Score any COCO-format results file against a split's references (pycocoevalcap's BLEU, CIDEr-D, ROUGE-L).
    Score(cli::score::ScoreArgs),
    /// Caption image files.
    Caption(cli::caption::CaptionArgs),
    /// Per token: MLE and SMILE loss, the label's probability over the vocabulary and the subset, top-5 of each.
    Inspect(Box<cli::inspect::InspectArgs>),
    /// The shapes world end to end: retriever, MLE, then SMILE, and a table comparing them.
    Demo(cli::demo::DemoArgs),
    /// The desktop app: train and watch live, follow a run folder, or inspect a checkpoint per token.
    App(Box<cli::app::AppArgs>),
    /// Run folders as one HTML file (curves, final metrics, samples) for a machine without a display; series as CSV.
    Report(cli::report::ReportArgs),
    /// A captioner as a Hugging Face folder: a GPT-2 transformers loads, its tokenizer, its mapper.
    Export(cli::export::ExportArgs),
    /// A published checkpoint as a folder captune reads: ClipCap's own .pt (as export writes it), BLIP's own .pth (as a BLIP folder).
    Convert(cli::convert::ConvertArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: cli::bench::BenchCommand,
    },
}

/// Runs `$body` with `$b` bound to the backend `--device` selects.
macro_rules! on_device {
    ($devices:expr, $b:ident => $body:expr) => {{
        let selection = device::select(single_device($devices)?)?;
        eprintln!("{selection}");
        captune::with_backend!(&selection.backend, $b => $body)
    }};
}

fn main() {
    quiet_headless_vulkan();
    // `train`'s one-line help names the registry's objectives.
    let names: Vec<&str> = captune::captioner::objectives::OBJECTIVES
        .iter()
        .map(|o| o.name)
        .collect();
    let command = Cli::command().mut_subcommand("train", |train| {
        train.about(format!(
            "Train a captioner into a run folder with an objective: {}",
            names.join(", ")
        ))
    });
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let outcome = if matches!(cli.command, Command::App(_)) {
        // The app keeps the main thread for its window; its trainer runs
        // in a pool of its own.
        run(cli.command, &cli.device)
    } else {
        // On a worker of rayon's pool, so that the CPU backend's parallel
        // ops start inside it: handing every op from the main thread to the
        // pool and back took over a third of a small model's decoding time.
        rayon::scope(|_| run(cli.command, &cli.device))
    };
    if let Err(e) = outcome {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Mesa's Vulkan device-selection layer looks for a Wayland display on
/// every adapter enumeration, and libwayland prints two `XDG_RUNTIME_DIR`
/// errors when there is none (ssh sessions, containers). Without a display
/// there is nothing for the layer to select by, so it is turned off.
fn quiet_headless_vulkan() {
    let no_display = ["WAYLAND_DISPLAY", "DISPLAY"]
        .iter()
        .all(|v| std::env::var_os(v).is_none_or(|d| d.is_empty()));
    // A user choosing the GPU through the layer keeps it.
    let chosen = ["NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if no_display && !chosen {
        // SAFETY: the first thing main does, before any thread exists.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}

fn single_device(devices: &[DeviceChoice]) -> Result<DeviceChoice> {
    match devices {
        [one] => Ok(*one),
        _ => bail!(
            "--device takes one of auto, gpu, cpu for this command (got {} values)",
            devices.len()
        ),
    }
}

fn run(command: Command, devices: &[DeviceChoice]) -> Result<()> {
    match command {
        Command::Info(args) => cli::info::run(single_device(devices)?, &args),
        Command::Data { what } => cli::data::run(what),
        Command::Retriever { what } => {
            on_device!(devices, b => cli::retriever::run(b, what))
        }
        Command::Embed(args) => {
            cli::embed::check(&args)?;
            on_device!(devices, b => cli::embed::run(b, &args))
        }
        Command::Train(args) => {
            on_device!(devices, b => cli::train::train(b, &args, None).map(|_| ()))
        }
        Command::Eval(args) => on_device!(devices, b => cli::eval::eval(b, &args)),
        Command::Score(args) => cli::score::score(&args),
        Command::Caption(args) => on_device!(devices, b => cli::caption::caption(b, &args)),
        Command::Inspect(args) => on_device!(devices, b => cli::inspect::inspect(b, &args)),
        Command::Demo(args) => on_device!(devices, b => cli::demo::demo(b, &args)),
        Command::App(args) => cli::app::run(single_device(devices)?, &args),
        Command::Report(args) => cli::report::run(&args),
        Command::Export(args) => cli::export::run(&args),
        Command::Convert(args) => cli::convert::run(&args),
        Command::Bench { what } => cli::bench::run(devices, what),
    }
}
