//! Where a command's captions and image embeddings come from: the data
//! set (`--data`: the shapes world, a Karpathy split file or a COCO
//! captions file) and, in [`embeddings`], the embeddings of its images (a
//! features file, or a retriever with an on-disk cache), recorded with
//! every captioner trained on them; in [`image_tokens`], the tokens of a
//! vision tower that a cross-attending decoder reads, and in
//! [`image_pixels`], the patches of one trained with it. This sits above both the caption
//! data formats (`data`) and the shapes world (`shapes`).

pub mod embeddings;
pub mod image_pixels;
pub mod image_tokens;

use crate::cache::absolute;
use crate::data::{Dataset, coco, karpathy};
use crate::shapes::{self, ShapesConfig};
use anyhow::{Result, bail};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// The embedded shapes world, generated into the cache on first use.
    Shapes,
    /// A Karpathy split file.
    Karpathy(PathBuf),
    /// A COCO caption annotation file (needs `--images`).
    Coco(PathBuf),
}

impl std::str::FromStr for DataSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "shapes" => Ok(DataSource::Shapes),
            Some(("karpathy", path)) if !path.is_empty() => Ok(DataSource::Karpathy(path.into())),
            Some(("coco", path)) if !path.is_empty() => Ok(DataSource::Coco(path.into())),
            _ => Err(format!(
                "{s:?}: expected shapes, karpathy:PATH (a Karpathy split file) or coco:PATH (a COCO captions file)"
            )),
        }
    }
}

impl std::fmt::Display for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataSource::Shapes => write!(f, "shapes"),
            DataSource::Karpathy(path) => write!(f, "karpathy:{}", path.display()),
            DataSource::Coco(path) => write!(f, "coco:{}", path.display()),
        }
    }
}

impl DataSource {
    /// The same source with its file's absolute path, so that a record of
    /// it holds from any working folder.
    pub fn absolute(&self) -> DataSource {
        match self {
            DataSource::Shapes => DataSource::Shapes,
            DataSource::Karpathy(p) => DataSource::Karpathy(absolute(p)),
            DataSource::Coco(p) => DataSource::Coco(absolute(p)),
        }
    }

    /// The captions alone, for scoring: no image is looked for.
    pub fn load_references(&self, shapes_config: &ShapesConfig) -> Result<Dataset> {
        let data = match self {
            DataSource::Shapes => shapes::load(shapes_config)?,
            DataSource::Karpathy(path) => karpathy::load_references(path)?,
            DataSource::Coco(path) => coco::load_references(path)?,
        };
        if !data.report.is_clean() {
            eprintln!("warning: {}: {}", data.name, data.report);
        }
        Ok(data)
    }

    pub fn load(&self, images: Option<&Path>, shapes_config: &ShapesConfig) -> Result<Dataset> {
        let data = match self {
            DataSource::Shapes => shapes::load(shapes_config)?,
            DataSource::Karpathy(path) => karpathy::load(path, images)?,
            DataSource::Coco(path) => match images {
                Some(dir) => coco::load(path, dir)?,
                None => bail!(
                    "coco:{}: pass the image folder with --images",
                    path.display()
                ),
            },
        };
        if !data.report.is_clean() {
            eprintln!("warning: {}: {}", data.name, data.report);
        }
        Ok(data)
    }
}

#[derive(clap::Args, Clone)]
pub struct DataArgs {
    /// shapes, karpathy:PATH (a Karpathy split file) or coco:PATH (a COCO
    /// captions file). Default: shapes, or for a command given a captioner,
    /// the data it was trained on.
    #[arg(long)]
    pub data: Option<DataSource>,
    /// The image folder (default for Karpathy files: `images` beside the file).
    #[arg(long)]
    pub images: Option<PathBuf>,
    #[command(flatten)]
    pub shapes: ShapesConfig,
}

impl DataArgs {
    pub fn shapes(shapes: ShapesConfig) -> DataArgs {
        DataArgs {
            data: Some(DataSource::Shapes),
            images: None,
            shapes,
        }
    }

    pub fn source(&self) -> DataSource {
        self.data.clone().unwrap_or(DataSource::Shapes)
    }

    pub fn load(&self) -> Result<Dataset> {
        self.source().load(self.images.as_deref(), &self.shapes)
    }

    pub fn is_shapes(&self) -> bool {
        self.source() == DataSource::Shapes
    }
}

/// A line per image of `data`, its id and its file's identity: what a
/// cache of something computed from the images is keyed by. A file
/// system call per image, so on every thread.
fn images_listing(data: &Dataset) -> String {
    (data.items.par_iter())
        .map(|item| {
            format!(
                "{}\t{}\n",
                item.id,
                crate::cache::file_identity(&item.image)
            )
        })
        .collect()
}
