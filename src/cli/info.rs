//! `captune info`: the chosen backend and every GPU adapter with the
//! limits and features that matter here.

use anyhow::Result;
use captune::backend::Backend;
use captune::device::{self, DeviceChoice};
use captune::gpu::adapter::{self, AdapterReport};

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(choice: DeviceChoice, args: &InfoArgs) -> Result<()> {
    let json = args.json;
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
