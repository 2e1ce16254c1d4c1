//! Image-tokens files: a vision tower's tokens of every image of a data
//! set, `[images, tokens, dim]`, for a decoder that cross-attends to them
//! (BLIP's). BLIP-base keeps 577 tokens of 768 per image, 0.9 MB in
//! float16, so a data set's tokens do not fit in memory: the file is
//! written one image at a time and read one batch's rows at a time.
//!
//! The format is safetensors (one float16 tensor `tokens`, metadata
//! `image_ids` = a JSON array of strings and `encoder_id`), so that any
//! safetensors reader opens it; captune writes it as a stream and reads
//! rows at their offsets. A features file may hold the same `tokens` after
//! its `embeddings`, their encoder then in `tokens_encoder_id` (the
//! embeddings' is `encoder_id`).

use super::features::EMBEDDINGS;
use crate::tensorfile::{read_header, temporary_suffix};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const TOKENS: &str = "tokens";
const IMAGE_IDS: &str = "image_ids";
const ENCODER_ID: &str = "encoder_id";
/// The tokens' encoder in a file whose `encoder_id` is its embeddings'.
const TOKENS_ENCODER_ID: &str = "tokens_encoder_id";
/// A header longer than this is not one captune wrote.
const MAX_HEADER: u64 = 1 << 30;

/// The shape of one image's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenShape {
    pub tokens: usize,
    pub dim: usize,
}

impl TokenShape {
    /// Values per image.
    pub fn len(&self) -> usize {
        self.tokens * self.dim
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An image-tokens file being written, one image after another in the
/// order of its ids; it appears at its path only when finished.
pub struct TokensWriter {
    path: PathBuf,
    temporary: PathBuf,
    out: BufWriter<File>,
    shape: TokenShape,
    images: usize,
    written: usize,
    finished: bool,
}

impl TokensWriter {
    /// Starts the file of `ids`' tokens, each image `shape`, made by
    /// `encoder` (its identity, kept in the file).
    pub fn create(path: &Path, ids: &[String], shape: TokenShape, encoder: &str) -> Result<Self> {
        let metadata = HashMap::from([(ENCODER_ID.to_string(), encoder.to_string())]);
        Self::start(path, ids, shape, &[], metadata)
    }

    /// Starts a features file: float32 tensors `leading` (the embeddings,
    /// `[ids.len(), dim]`), then the tokens, made by `encoder`, to come;
    /// `metadata` (the embeddings' `encoder_id`, the data set) is kept.
    pub fn beside(
        path: &Path,
        ids: &[String],
        (shape, encoder): (TokenShape, &str),
        leading: &[(&str, Vec<usize>, &[f32])],
        mut metadata: HashMap<String, String>,
    ) -> Result<Self> {
        metadata.insert(TOKENS_ENCODER_ID.into(), encoder.into());
        Self::start(path, ids, shape, leading, metadata)
    }

    fn start(
        path: &Path,
        ids: &[String],
        shape: TokenShape,
        leading: &[(&str, Vec<usize>, &[f32])],
        mut metadata: HashMap<String, String>,
    ) -> Result<Self> {
        metadata.insert(IMAGE_IDS.into(), serde_json::to_string(ids)?);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!(metadata));
        let mut offset = 0;
        for (name, dims, values) in leading {
            let bytes = values.len() * 4;
            header.insert(
                name.to_string(),
                json!({"dtype": "F32", "shape": dims, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let bytes = ids.len() * shape.len() * 2;
        header.insert(
            TOKENS.into(),
            json!({
                "dtype": "F16",
                "shape": [ids.len(), shape.tokens, shape.dim],
                "data_offsets": [offset, offset + bytes],
            }),
        );
        let mut header = serde_json::to_vec(&Value::Object(header))?;
        // The data starts 8-byte aligned, as safetensors' writers keep it.
        header.resize(header.len().next_multiple_of(8), b' ');
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let temporary = path.with_extension(temporary_suffix());
        let file = File::create(&temporary)
            .with_context(|| format!("cannot create {}", temporary.display()))?;
        let mut out = BufWriter::new(file);
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for (_, _, values) in leading {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            out.write_all(&bytes)
                .with_context(|| format!("cannot write {}", temporary.display()))?;
        }
        Ok(TokensWriter {
            path: path.to_path_buf(),
            temporary,
            out,
            shape,
            images: ids.len(),
            written: 0,
            finished: false,
        })
    }

    /// Appends the tokens of the next images, `[images, tokens, dim]`.
    pub fn push(&mut self, tokens: &[f32]) -> Result<()> {
        let per = self.shape.len();
        if !tokens.len().is_multiple_of(per) || self.written + tokens.len() / per > self.images {
            bail!(
                "{} token values are not whole images of {per}, or more than the {} images of {}",
                tokens.len(),
                self.images,
                self.path.display()
            );
        }
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
            .collect();
        self.out
            .write_all(&bytes)
            .with_context(|| format!("cannot write {}", self.temporary.display()))?;
        self.written += tokens.len() / per;
        Ok(())
    }

    /// Completes the file once every image is in; a writer dropped before
    /// removes its temporary file.
    pub fn finish(mut self) -> Result<()> {
        if self.written != self.images {
            bail!(
                "{}: {} of {} images written",
                self.path.display(),
                self.written,
                self.images
            );
        }
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        std::fs::rename(&self.temporary, &self.path)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for TokensWriter {
    /// An unfinished file (an image that failed, an interrupted run) is
    /// no cache entry: its temporary file goes.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// An image-tokens file open for reading rows.
#[derive(Debug)]
pub struct ImageTokens {
    pub path: PathBuf,
    pub ids: Vec<String>,
    pub shape: TokenShape,
    /// The encoder's identity, when the file says.
    pub encoder: Option<String>,
    /// Where the first image's tokens start.
    data_start: u64,
    file: Mutex<File>,
}

impl ImageTokens {
    /// Opens a file and checks its header against its size.
    pub fn open(path: &Path) -> Result<ImageTokens> {
        Self::open_if_held(path)?.with_context(|| {
            format!(
                "{}: not an image-tokens file (no tensor {TOKENS:?})",
                path.display()
            )
        })
    }

    /// The image tokens a file holds (a features file may, beside its
    /// embeddings), or none where it has no `tokens` tensor.
    pub fn open_if_held(path: &Path) -> Result<Option<ImageTokens>> {
        let bad =
            |why: String| anyhow::anyhow!("{}: not an image-tokens file ({why})", path.display());
        let mut file =
            File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let size = file.metadata()?.len();
        let (header_len, header) = read_header(&mut file, size, MAX_HEADER).map_err(bad)?;
        let header: Value = serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
        let Some(tensor) = header.get(TOKENS) else {
            return Ok(None);
        };
        if tensor["dtype"] != "F16" {
            return Err(bad(format!(
                "tensor {TOKENS:?} is not float16: {}",
                tensor["dtype"]
            )));
        }
        let shape: Vec<usize> = serde_json::from_value(tensor["shape"].clone())
            .map_err(|e| bad(format!("its shape: {e}")))?;
        let [images, tokens, dim] = shape[..] else {
            return Err(bad(format!("shape {shape:?} is not [images, tokens, dim]")));
        };
        let offsets: [u64; 2] = serde_json::from_value(tensor["data_offsets"].clone())
            .map_err(|e| bad(format!("its data_offsets: {e}")))?;
        let too_many = || {
            bad(format!(
                "{images} images of {tokens} x {dim} do not fit its {size} bytes"
            ))
        };
        let data_start = (8 + header_len)
            .checked_add(offsets[0])
            .ok_or_else(too_many)?;
        let bytes = [images, tokens, dim, 2]
            .iter()
            .try_fold(1u64, |n, &k| n.checked_mul(k as u64))
            .ok_or_else(too_many)?;
        let end = data_start.checked_add(bytes).ok_or_else(too_many)?;
        if offsets[1].checked_sub(offsets[0]) != Some(bytes) || end > size || tokens * dim == 0 {
            return Err(too_many());
        }
        let metadata = &header["__metadata__"];
        let ids: Vec<String> = metadata[IMAGE_IDS]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| bad(format!("no {IMAGE_IDS:?} metadata")))?;
        if ids.len() != images {
            return Err(bad(format!("{} ids for {images} images", ids.len())));
        }
        Ok(Some(ImageTokens {
            path: path.to_path_buf(),
            ids,
            shape: TokenShape { tokens, dim },
            // In a features file, `encoder_id` is the embeddings' encoder.
            encoder: match header.get(EMBEDDINGS) {
                Some(_) => metadata.get(TOKENS_ENCODER_ID),
                None => metadata.get(ENCODER_ID),
            }
            .and_then(Value::as_str)
            .map(str::to_string),
            data_start,
            file: Mutex::new(file),
        }))
    }

    /// The tokens of the images at `rows` (indices into `ids`), in order,
    /// `[rows.len(), tokens, dim]`.
    pub fn rows(&self, rows: &[usize]) -> Result<Vec<f32>> {
        let per = self.shape.len();
        let mut bytes = vec![0u8; per * 2];
        let mut out = Vec::with_capacity(rows.len() * per);
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        for &row in rows {
            if row >= self.ids.len() {
                bail!(
                    "{}: no image {row} among {}",
                    self.path.display(),
                    self.ids.len()
                );
            }
            file.seek(SeekFrom::Start(self.data_start + (row * per * 2) as u64))?;
            file.read_exact(&mut bytes)
                .with_context(|| format!("cannot read {}", self.path.display()))?;
            out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            );
        }
        Ok(out)
    }

    /// Each id's row.
    pub fn index(&self) -> HashMap<&str, usize> {
        self.ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "captune-tokens-{name}-{}",
            crate::tensorfile::temporary_suffix()
        ))
    }

    #[test]
    fn rows_come_back_as_written_in_float16_and_safetensors_reads_the_file() {
        let dir = scratch("rows");
        let path = dir.join("t.safetensors");
        let ids: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let shape = TokenShape { tokens: 2, dim: 3 };
        let values: Vec<f32> = (0..18).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut w = TokensWriter::create(&path, &ids, shape, "enc").unwrap();
        w.push(&values[..6]).unwrap();
        assert!(!path.exists(), "the file appears only when finished");
        w.push(&values[6..]).unwrap();
        w.finish().unwrap();
        let t = ImageTokens::open(&path).unwrap();
        assert_eq!(
            (t.ids.clone(), t.shape, t.encoder.as_deref()),
            (ids, shape, Some("enc"))
        );
        assert_eq!(
            t.rows(&[2, 0]).unwrap(),
            [&values[12..], &values[..6]].concat()
        );
        assert!(t.rows(&[3]).is_err());
        let whole = crate::tensorfile::read(&path).unwrap();
        assert_eq!(whole.tensors[TOKENS].data, values);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_short_or_foreign_file_is_refused_by_name() {
        let dir = scratch("short");
        let path = dir.join("t.safetensors");
        let ids = vec!["a".to_string()];
        let mut w =
            TokensWriter::create(&path, &ids, TokenShape { tokens: 1, dim: 4 }, "e").unwrap();
        assert!(w.push(&[0.0; 3]).is_err());
        w.push(&[0.0; 4]).unwrap();
        w.finish().unwrap();
        // A writer dropped unfinished leaves nothing behind.
        let other = dir.join("u.safetensors");
        let mut u =
            TokensWriter::create(&other, &ids, TokenShape { tokens: 1, dim: 4 }, "e").unwrap();
        u.push(&[0.0; 4]).unwrap();
        drop(u);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the finished file: {left:?}");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let e = ImageTokens::open(&path).unwrap_err().to_string();
        assert!(
            e.contains("t.safetensors") && e.contains("do not fit"),
            "{e}"
        );
        std::fs::write(&path, b"short").unwrap();
        assert!(ImageTokens::open(&path).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
