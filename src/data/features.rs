//! Features files: one embedding per image, `[N, D]` float32, with the
//! image ids. As safetensors (tensor `embeddings`, metadata `image_ids` =
//! a JSON array of strings), which `captune embed` writes and any other
//! encoder can too; or as `.npy` with a text file of ids, one per line.

use super::{Dataset, LoadReport};
use crate::tensorfile;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Features {
    pub source: PathBuf,
    pub ids: Vec<String>,
    pub dim: usize,
    /// Row-major `[ids.len(), dim]`.
    pub embeddings: Vec<f32>,
}

pub const EMBEDDINGS: &str = "embeddings";
pub const IMAGE_IDS: &str = "image_ids";

impl Features {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.embeddings[i * self.dim..(i + 1) * self.dim]
    }

    /// Writes a safetensors features file; `metadata` is added to the ids.
    pub fn save(&self, path: &Path, mut metadata: HashMap<String, String>) -> Result<()> {
        metadata.insert(IMAGE_IDS.into(), serde_json::to_string(&self.ids)?);
        tensorfile::write(
            path,
            &[(EMBEDDINGS, vec![self.ids.len(), self.dim], &self.embeddings)],
            metadata,
        )
    }

    /// Reads a safetensors file, or a `.npy` file with its ids in `ids_file`.
    pub fn load(path: &Path, ids_file: Option<&Path>) -> Result<Features> {
        let is_npy = path.extension().is_some_and(|e| e == "npy");
        let (ids, shape, embeddings) = if is_npy {
            let Some(ids_file) = ids_file else {
                bail!(
                    "{}: a .npy features file needs its image ids: pass --ids FILE (one id per line)",
                    path.display()
                );
            };
            let (shape, data) = read_npy(path)?;
            (read_ids(ids_file)?, shape, data)
        } else {
            let mut file = tensorfile::read(path)?;
            let t = file.take(EMBEDDINGS, path)?;
            let ids: Vec<String> =
                serde_json::from_str(file.meta(IMAGE_IDS, path)?).with_context(|| {
                    format!(
                        "{}: metadata {IMAGE_IDS:?} must be a JSON array of strings",
                        path.display()
                    )
                })?;
            (ids, t.shape, t.data)
        };
        let [n, dim] = shape[..] else {
            bail!(
                "{}: embeddings have shape {shape:?}; expected [N, D]",
                path.display()
            );
        };
        if n != ids.len() {
            bail!(
                "{}: {n} embeddings but {} image ids; each row needs exactly one id",
                path.display(),
                ids.len()
            );
        }
        if let Some(row) = (0..n).find(|&r| {
            embeddings[r * dim..(r + 1) * dim]
                .iter()
                .any(|x| !x.is_finite())
        }) {
            bail!(
                "{}: embedding of image {} (row {row}) is not finite",
                path.display(),
                ids[row]
            );
        }
        Ok(Features {
            source: path.to_path_buf(),
            ids,
            dim,
            embeddings,
        })
    }

    /// Fails unless the embeddings have `expected` dimensions.
    pub fn expect_dim(&self, expected: usize) -> Result<()> {
        if self.dim != expected {
            bail!(
                "{}: embeddings have {} dimensions but {expected} are expected; \
                 use features from the same encoder, or a model built for {} dimensions",
                self.source.display(),
                self.dim,
                self.dim
            );
        }
        Ok(())
    }

    /// The embeddings of `data`'s items in item order; items without one
    /// are removed from `data` and reported.
    pub fn align(&self, data: &mut Dataset) -> Vec<f32> {
        let index: HashMap<&str, usize> = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        let mut out = Vec::with_capacity(data.items.len() * self.dim);
        let mut report = LoadReport::default();
        data.items.retain(|item| match index.get(item.id.as_str()) {
            Some(&row) => {
                out.extend_from_slice(self.row(row));
                true
            }
            None => {
                report.skip_item(format!(
                    "{}: no embedding for image {}; skipped",
                    self.source.display(),
                    item.id
                ));
                false
            }
        });
        data.report.merge(report);
        out
    }
}

fn read_npy(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
        .with_context(|| format!("{}: not a .npy file", path.display()))?;
    if npy.order() != npyz::Order::C {
        bail!(
            "{}: Fortran-order arrays are not supported; save it with numpy's default C order",
            path.display()
        );
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let data = npy.into_vec::<f32>().with_context(|| {
        format!(
            "{}: expected float32 data (numpy: .astype('float32') before saving)",
            path.display()
        )
    })?;
    Ok((shape, data))
}

fn read_ids(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read ids file {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}
