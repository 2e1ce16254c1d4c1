//! Features files: one embedding per image, `[N, D]`, with the image ids.
//! As safetensors (tensor `embeddings` in float32, float16 or bfloat16,
//! metadata `image_ids` = a JSON array of strings, optionally `encoder`),
//! which `captune embed` writes and any other encoder can too; or as
//! `.npy` (float32) with a text file of ids, one per line. Rows are
//! L2-normalised on loading (rows already of unit length are kept as
//! they are), so raw and normalised features give retrieval and most
//! captioners the same input. Each row's norm before that is kept where
//! it is known: a float32 tensor `norms` `[N]` beside the embeddings
//! (which captune writes), else the norms of rows loaded unnormalised;
//! a captioner trained on embeddings as their encoder gives them
//! (ClipCap's MLP) reads the rows times their norms.

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
    /// Row-major `[ids.len(), dim]`, each row of unit length.
    pub embeddings: Vec<f32>,
    /// Which encoder made them, when the file says (metadata `encoder_id`,
    /// else `encoder`).
    pub encoder: Option<String>,
    /// `[ids.len()]`: each row's L2 norm as its encoder gave it, where
    /// known (see the module's doc).
    pub norms: Option<Vec<f32>>,
}

pub const EMBEDDINGS: &str = "embeddings";
/// Tensor: each embedding's norm before it was normalised.
pub const NORMS: &str = "norms";
pub const IMAGE_IDS: &str = "image_ids";
/// Metadata: the encoder's identity, compared with a captioner's record.
pub const ENCODER_ID: &str = "encoder_id";
/// Metadata: a free description of the encoder (any tool may write it).
pub const ENCODER: &str = "encoder";

/// Rows `[n, dim]` of unit length back to their encoder's scale: each
/// row times its norm (a captioner that reads embeddings unnormalised).
pub fn times_norms<'a>(rows: &mut [f32], dim: usize, norms: impl IntoIterator<Item = &'a f32>) {
    for (row, norm) in rows.chunks_exact_mut(dim).zip(norms) {
        row.iter_mut().for_each(|x| *x *= norm);
    }
}

/// The identity of a captune retriever as an encoder: its weights' fingerprint.
pub fn retriever_encoder_id(checkpoint_bytes: &[u8]) -> String {
    format!(
        "captune-retriever:{}",
        tensorfile::fingerprint(checkpoint_bytes)
    )
}

impl Features {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.embeddings[i * self.dim..(i + 1) * self.dim]
    }

    /// Writes a safetensors features file; `metadata` is added to the ids
    /// and the encoder's identity.
    pub fn save(&self, path: &Path, mut metadata: HashMap<String, String>) -> Result<()> {
        metadata.insert(IMAGE_IDS.into(), serde_json::to_string(&self.ids)?);
        if let Some(encoder) = &self.encoder {
            metadata.insert(ENCODER_ID.into(), encoder.clone());
        }
        let n = self.ids.len();
        let mut tensors = vec![(EMBEDDINGS, vec![n, self.dim], &self.embeddings[..])];
        if let Some(norms) = &self.norms {
            tensors.push((NORMS, vec![n], norms));
        }
        tensorfile::write(path, &tensors, metadata)
    }

    /// Reads a safetensors file, or a `.npy` file with its ids in `ids_file`.
    pub fn load(path: &Path, ids_file: Option<&Path>) -> Result<Features> {
        let is_npy = path.extension().is_some_and(|e| e == "npy");
        let (ids, shape, embeddings, encoder, norms) = if is_npy {
            let Some(ids_file) = ids_file else {
                bail!(
                    "{}: a .npy features file needs its image ids: pass --features-ids FILE (one id per line)",
                    path.display()
                );
            };
            let (shape, data) = read_npy(path)?;
            (read_ids(ids_file)?, shape, data, None, None)
        } else {
            // Only the embeddings: the file may hold image tokens too.
            let mut file = tensorfile::read_only(path, &[EMBEDDINGS, NORMS])?;
            let t = file.take(EMBEDDINGS, path)?;
            let norms = file.tensors.remove(NORMS);
            let ids: Vec<String> =
                serde_json::from_str(file.meta(IMAGE_IDS, path)?).with_context(|| {
                    format!(
                        "{}: metadata {IMAGE_IDS:?} must be a JSON array of strings",
                        path.display()
                    )
                })?;
            let encoder = [ENCODER_ID, ENCODER]
                .iter()
                .find_map(|k| file.metadata.get(*k).cloned());
            (ids, t.shape, t.data, encoder, norms)
        };
        let [n, dim] = shape[..] else {
            bail!(
                "{}: embeddings have shape {shape:?}; expected [N, D]",
                path.display()
            );
        };
        if n != ids.len() {
            let from = ids_file
                .filter(|_| is_npy)
                .map_or(String::new(), |f| format!(" (in {})", f.display()));
            bail!(
                "{}: {n} embeddings but {} image ids{from}; each row needs exactly one id",
                path.display(),
                ids.len()
            );
        }
        if dim == 0 {
            bail!("{}: embeddings have no dimensions", path.display());
        }
        let norms = match norms {
            Some(t) if t.shape != [n] || t.data.iter().any(|&x| !(x.is_finite() && x > 0.0)) => {
                bail!(
                    "{}: tensor {NORMS:?} must be [{n}] positive numbers, one per embedding \
                     (shape {:?}); write the file again with `captune embed`",
                    path.display(),
                    t.shape
                )
            }
            t => t.map(|t| t.data),
        };
        let mut features = Features {
            source: path.to_path_buf(),
            ids,
            dim,
            embeddings,
            encoder,
            norms,
        };
        features.normalise()?;
        Ok(features)
    }

    /// L2-normalises every row. Rows already of unit length (as `embed`
    /// and the embedding cache write them) stay bit for bit as they are,
    /// so loading them back changes nothing. Where the norms are not
    /// known yet and some row was not of unit length, they become the
    /// rows' norms. A zero or non-finite row is an error naming the file
    /// and the image.
    pub fn normalise(&mut self) -> Result<()> {
        let mut norms = Vec::with_capacity(self.ids.len());
        let mut all_unit = true;
        for (row, e) in self.embeddings.chunks_exact_mut(self.dim).enumerate() {
            let norm = e.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            if !norm.is_finite() || norm == 0.0 {
                bail!(
                    "{}: embedding of image {} (row {row}) is {}; every row needs a finite, non-zero vector",
                    self.source.display(),
                    self.ids[row],
                    if norm == 0.0 { "zero" } else { "not finite" }
                );
            }
            if (norm - 1.0).abs() > 1e-6 {
                all_unit = false;
                e.iter_mut()
                    .for_each(|x| *x = (f64::from(*x) / norm) as f32);
            }
            norms.push(norm as f32);
        }
        if self.norms.is_none() && !all_unit {
            self.norms = Some(norms);
        }
        Ok(())
    }

    /// The embeddings of `data`'s items in item order, and their norms
    /// where known; items without one are removed from `data` and
    /// reported. None at all is an error: the file's ids are not the data
    /// set's.
    pub fn align(&self, data: &mut Dataset) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let index: HashMap<&str, usize> = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        let mut out = Vec::with_capacity(data.items.len() * self.dim);
        let mut norms = self.norms.as_ref().map(|_| Vec::new());
        let mut report = LoadReport::default();
        data.items.retain(|item| match index.get(item.id.as_str()) {
            Some(&row) => {
                out.extend_from_slice(self.row(row));
                if let (Some(kept), Some(all)) = (&mut norms, &self.norms) {
                    kept.push(all[row]);
                }
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
        if data.items.is_empty() {
            bail!(
                "{}: none of its {} image ids is an image of {} (the file's first id is {:?}); \
                 use features computed for this data set",
                self.source.display(),
                self.ids.len(),
                data.name,
                self.ids.first().map_or("", String::as_str)
            );
        }
        data.report.merge(report);
        Ok((out, norms))
    }
}

/// Reads a `.npy` array of little-endian float32, float16 or float64 in C
/// order (numpy's format versions 1 to 3) as f32. The header's shape is
/// checked against the file's size before anything is allocated for it.
fn read_npy(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bad = |why: &str| anyhow::anyhow!("{}: not a .npy file ({why})", path.display());
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or_else(|| bad("no NUMPY magic"))?;
    let (header_len, header_start) = match rest.first() {
        Some(1) if rest.len() >= 4 => (u16::from_le_bytes([rest[2], rest[3]]) as usize, 4),
        Some(2 | 3) if rest.len() >= 6 => (
            u32::from_le_bytes([rest[2], rest[3], rest[4], rest[5]]) as usize,
            6,
        ),
        _ => return Err(bad("unknown format version")),
    };
    let header = rest
        .get(header_start..header_start + header_len)
        .ok_or_else(|| bad("shorter than its header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("its header is not text"))?;
    let data = &rest[header_start + header_len..];
    let value = |key: &str| -> Option<&str> {
        let after = &header[header.find(&format!("'{key}':"))? + key.len() + 3..];
        Some(after.trim_start())
    };
    let descr = value("descr")
        .and_then(|v| v.strip_prefix('\'')?.split('\'').next())
        .ok_or_else(|| bad("no 'descr' in its header"))?;
    if value("fortran_order").is_some_and(|v| v.starts_with("True")) {
        bail!(
            "{}: Fortran-order arrays are not supported; save it with numpy's default C order",
            path.display()
        );
    }
    let shape: Vec<usize> = value("shape")
        .and_then(|v| v.strip_prefix('(')?.split(')').next())
        .ok_or_else(|| bad("no 'shape' in its header"))?
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| bad("a dimension is not a whole number"))
        })
        .collect::<Result<_>>()?;
    let width = match descr {
        "<f4" => 4,
        "<f2" => 2,
        "<f8" => 8,
        other => bail!(
            "{}: the array holds {other:?}; expected float32, float16 or float64 \
             (numpy: .astype('float32') before saving)",
            path.display()
        ),
    };
    let needed = shape
        .iter()
        .try_fold(width as u64, |acc, &d| acc.checked_mul(d as u64));
    if needed != Some(data.len() as u64) {
        bail!(
            "{}: the header's shape {shape:?} of {descr} needs {} bytes but the file holds {}; \
             the file is truncated or damaged",
            path.display(),
            needed.map_or("more".into(), |n| n.to_string()),
            data.len()
        );
    }
    let values = match width {
        4 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        2 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
    };
    Ok((shape, values))
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
