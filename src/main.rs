use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::bench;
use captune::device::{self, DeviceChoice};
use captune::gpu::adapter::{self, AdapterReport};
use clap::{Parser, Subcommand};

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
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Matmul GFLOP/s (square sizes) and elementwise GB/s on each backend asked for.
    Kernels {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        /// Square matmul sizes.
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
        sizes: Vec<usize>,
        /// Elements of the elementwise benchmark (0 skips it).
        #[arg(long, default_value_t = 1 << 24)]
        elementwise_len: usize,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
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

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Info { json } => info(single_device(&cli.device)?, json),
        Command::Bench {
            what:
                BenchCommand::Kernels {
                    json,
                    sizes,
                    elementwise_len,
                },
        } => {
            let mut records = Vec::new();
            for &choice in &cli.device {
                let selection = device::select(choice)?;
                if !json {
                    println!("{selection}");
                }
                captune::with_backend!(&selection.backend, b => {
                    bench::kernels(b, &sizes, elementwise_len, |r| {
                        if !json {
                            println!("{r}");
                        }
                        records.push(r.clone());
                    })
                });
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&records)?);
            }
            Ok(())
        }
    }
}

fn info(choice: DeviceChoice, json: bool) -> Result<()> {
    let selection = device::select(choice)?;
    let reports: Vec<AdapterReport> = adapter::adapters(adapter::backends_from_env()?)
        .iter()
        .map(AdapterReport::new)
        .collect();
    let (kind, name) =
        captune::with_backend!(&selection.backend, b => (b.kind(), b.adapter_name()));
    if json {
        let value = serde_json::json!({
            "backend": kind,
            "device": name,
            "reason": selection.reason,
            "cpu_threads": rayon::current_num_threads(),
            "adapters": reports,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("captune {}", env!("CARGO_PKG_VERSION"));
    println!("{selection}");
    println!(
        "CPU: {} ({} threads)",
        captune::cpu::cpu_model_name(),
        rayon::current_num_threads()
    );
    if reports.is_empty() {
        println!(
            "GPU adapters: none (install a Vulkan driver, e.g. mesa-vulkan-drivers, for the GPU backend)"
        );
    }
    for (i, r) in reports.iter().enumerate() {
        println!("GPU adapter {i}:\n{r}");
    }
    Ok(())
}
