//! Named f32 tensors with string metadata in safetensors files: the format
//! of checkpoints and features files. Files are written to a temporary
//! name and renamed, so an interrupted write never leaves a broken file.
//! float16 and bfloat16 tensors (what most Python encoders write) are
//! widened to f32 on reading; a tensor holding NaN or an infinity is
//! refused, named, at load.

use anyhow::{Context, Result, bail};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// A matrix `[rows, cols]` as `[cols, rows]`: PyTorch's `nn.Linear`
    /// weight `[out, in]` as captune's `[in, out]`, and back.
    pub fn transposed(&self) -> Tensor {
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let mut data = vec![0.0; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                data[c * rows + r] = self.data[r * cols + c];
            }
        }
        Tensor {
            shape: vec![cols, rows],
            data,
        }
    }
}

pub struct TensorFile {
    pub tensors: HashMap<String, Tensor>,
    pub metadata: HashMap<String, String>,
}

/// A suffix for a temporary file or folder that no other writer uses at
/// the same time, in another process or another thread of this one (two
/// tests extracting the same cached file at once, say), or in another
/// container sharing the folder, where process ids repeat:
/// `tmp-PID-N-NANOS`.
pub fn temporary_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("tmp-{}-{n}-{nanos}", std::process::id())
}

/// Writes `path` through a temporary file in the same folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension(temporary_suffix());
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    crate::killpoint::here("atomic", || {});
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

pub fn write(
    path: &Path,
    tensors: &[(&str, Vec<usize>, &[f32])],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            assert_eq!(
                shape.iter().product::<usize>(),
                data.len(),
                "{name}: shape and data disagree"
            );
            let view = TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(data))?;
            Ok((name.to_string(), view))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let bytes = safetensors::serialize(views, Some(metadata))?;
    write_atomic(path, &bytes)
}

pub fn read(path: &Path) -> Result<TensorFile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes, path)
}

/// Reads a safetensors file already in memory; `path` names it in errors.
fn parse(bytes: &[u8], path: &Path) -> Result<TensorFile> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a safetensors file ({e})", path.display()))?;
    let (_, header) = SafeTensors::read_metadata(bytes)?;
    let mut tensors = HashMap::new();
    for (name, view) in file.tensors() {
        let data = finite_values(view.dtype(), view.data(), &name, path)?;
        tensors.insert(
            name,
            Tensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(TensorFile {
        tensors,
        metadata: header.metadata().clone().unwrap_or_default(),
    })
}

/// The values of tensor `name` of `path` as float32, refusing other types
/// and values that are not finite.
fn finite_values(dtype: Dtype, bytes: &[u8], name: &str, path: &Path) -> Result<Vec<f32>> {
    let data = widen(dtype, bytes).with_context(|| {
        format!(
            "{}: tensor {name:?} is {dtype:?}; captune reads float32, float16 and bfloat16 tensors",
            path.display(),
        )
    })?;
    if let Some(i) = data.iter().position(|x| !x.is_finite()) {
        bail!(
            "{}: tensor {name:?} holds {} at element {i}; the file is damaged or came from a run \
             that diverged: use an earlier checkpoint",
            path.display(),
            data[i]
        );
    }
    Ok(data)
}

/// Reads the tensors `names` of a safetensors file, where it has them,
/// and its metadata, and nothing else: a features file may also hold a
/// data set's image tokens, gigabytes that a reader of its embeddings
/// does not need.
pub fn read_only(path: &Path, names: &[&str]) -> Result<TensorFile> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = |why: String| anyhow::anyhow!("{}: not a safetensors file ({why})", path.display());
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let size = file.metadata()?.len();
    let (header_len, header) = read_header(&mut file, size, MAX_HEADER).map_err(bad)?;
    let mut header: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
    let metadata: HashMap<String, String> = match header.remove("__metadata__") {
        Some(m) => serde_json::from_value(m).map_err(|e| bad(format!("its metadata: {e}")))?,
        None => HashMap::new(),
    };
    let mut tensors = HashMap::new();
    for &name in names {
        let Some(entry) = header.remove(name) else {
            continue;
        };
        let info: safetensors::tensor::TensorInfo =
            serde_json::from_value(entry).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
        let (start, end) = info.data_offsets;
        let elements = info.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let fits = (end.checked_sub(start))
            .zip(elements)
            .is_some_and(|(bytes, n)| Some(bytes) == n.checked_mul(info.dtype.bitsize() / 8))
            && (8 + header_len)
                .checked_add(end as u64)
                .is_some_and(|e| e <= size);
        if !fits {
            return Err(bad(format!(
                "tensor {name:?} of shape {:?} does not fit offsets {start}..{end} of its {size} \
                 bytes",
                info.shape
            )));
        }
        let mut bytes = vec![0u8; end - start];
        file.seek(SeekFrom::Start(8 + header_len + start as u64))?;
        file.read_exact(&mut bytes)
            .map_err(|e| bad(e.to_string()))?;
        let data = finite_values(info.dtype, &bytes, name, path)?;
        let shape = info.shape;
        tensors.insert(name.to_string(), Tensor { shape, data });
    }
    Ok(TensorFile { tensors, metadata })
}

/// A header longer than this is not one a safetensors writer made.
const MAX_HEADER: u64 = 100 << 20;

/// The header of the safetensors file `file` (of `size` bytes, read from
/// its start): its length and its JSON, at most `max` bytes; or why not.
pub fn read_header(
    file: &mut std::fs::File,
    size: u64,
    max: u64,
) -> std::result::Result<(u64, Vec<u8>), String> {
    use std::io::Read;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| e.to_string())?;
    let header_len = u64::from_le_bytes(len);
    if header_len > max.min(size.saturating_sub(8)) {
        return Err(format!("a header of {header_len} bytes"));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    Ok((header_len, header))
}

/// Little-endian tensor bytes of `dtype` as f32; `None` for other dtypes.
fn widen(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let pairs = || {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => pairs().map(|h| half::f16::from_bits(h).to_f32()).collect(),
        Dtype::BF16 => pairs().map(|h| half::bf16::from_bits(h).to_f32()).collect(),
        _ => return None,
    })
}

/// Hands the heap's free pages back to the OS. Loading a model frees
/// copies of it (the file's bytes, its tensors before they reach the
/// backend) that glibc's allocator would otherwise keep in the process's
/// resident memory while the model runs; elsewhere nothing happens.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the heap to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A stable 64-bit fingerprint (FNV-1a) of `bytes` as 16 hex digits: the
/// identity of an encoder's weights or a data set's listing in caches and
/// provenance records.
pub fn fingerprint(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A safetensors file's metadata alone, without reading its tensors.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let bad = |why: &str| anyhow::anyhow!("{}: not a safetensors file ({why})", path.display());
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file_len = f.metadata()?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| bad("shorter than its header"))?;
    let len = u64::from_le_bytes(len);
    if len > file_len.saturating_sub(8) {
        return Err(bad("its header is longer than the file"));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)
        .map_err(|_| bad("shorter than its header"))?;
    let json: serde_json::Value =
        serde_json::from_slice(&header).map_err(|_| bad("its header is not JSON"))?;
    let metadata = match json.get("__metadata__") {
        None => HashMap::new(),
        Some(m) => serde_json::from_value(m.clone())
            .map_err(|_| bad("its metadata is not a map of strings"))?,
    };
    Ok(metadata)
}

impl TensorFile {
    /// Tensors by name, without metadata: a model's weights converted
    /// from another format's.
    pub fn new(tensors: impl IntoIterator<Item = (String, Tensor)>) -> Self {
        TensorFile {
            tensors: tensors.into_iter().collect(),
            metadata: HashMap::new(),
        }
    }

    pub fn take(&mut self, name: &str, path: &Path) -> Result<Tensor> {
        self.tensors
            .remove(name)
            .with_context(|| format!("{}: no tensor {name:?}", path.display()))
    }

    pub fn meta(&self, key: &str, path: &Path) -> Result<&str> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .with_context(|| format!("{}: no {key:?} in the metadata", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads of one process writing the same file at once (tests
    /// extracting the carried retriever into an empty cache) each write
    /// through a temporary file of their own: every write succeeds, the
    /// file ends whole and no temporary file is left.
    #[test]
    fn writers_of_one_file_at_once_do_not_collide() {
        let dir = std::env::temp_dir().join(format!("captune-atomic-race-{}", temporary_suffix()));
        let path = dir.join("shared.bin");
        let bytes: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..8)
                .map(|_| s.spawn(|| write_atomic(&path, &bytes)))
                .collect();
            for w in writers {
                w.join().unwrap().unwrap();
            }
        });
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
