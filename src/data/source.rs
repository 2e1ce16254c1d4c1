//! `--data`: which data set a command reads.

use super::shapes::{self, ShapesConfig};
use super::{Dataset, coco, karpathy};
use anyhow::{Result, bail};
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

impl DataSource {
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
