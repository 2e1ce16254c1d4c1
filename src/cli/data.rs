//! `captune data`: write a data set for a person to look at.

use super::check_new_output;
use anyhow::Result;
use captune::data::Split;
use captune::shapes::{self, ShapesConfig};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum DataCommand {
    /// Generate the shapes world into DIR (PNG images and dataset_shapes.json) and print its caption mix.
    Shapes {
        #[arg(long)]
        out: PathBuf,
        /// Replace --out if it exists.
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        config: ShapesConfig,
    },
}

pub fn run(what: DataCommand) -> Result<()> {
    match what {
        DataCommand::Shapes {
            out,
            overwrite,
            config,
        } => {
            check_new_output(&out, overwrite, "--out")?;
            shapes_world(&out, &config)
        }
    }
}

fn shapes_world(out: &std::path::Path, config: &ShapesConfig) -> Result<()> {
    shapes::write(config, out)?;
    let val: Vec<_> = (0..config.val)
        .map(|i| shapes::generate(config.seed, config.domain, Split::Val, i))
        .collect();
    let stats = shapes::stats::split_stats(&val);
    println!(
        "wrote {} images to {} ({} train, {} val, {} test); caption mix of the val split:",
        config.train + config.val + config.test,
        out.display(),
        config.train,
        config.val,
        config.test
    );
    println!("{}", serde_json::to_string_pretty(&stats)?);
    Ok(())
}
