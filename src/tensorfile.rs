//! Named f32 tensors with string metadata in safetensors files: the format
//! of checkpoints and features files. Files are written to a temporary
//! name and renamed, so an interrupted write never leaves a broken file.

use anyhow::{Context, Result, bail};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::HashMap;
use std::path::Path;

pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub struct TensorFile {
    pub tensors: HashMap<String, Tensor>,
    pub metadata: HashMap<String, String>,
}

/// Writes `path` through a temporary file in the same folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
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
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a safetensors file ({e})", path.display()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)?;
    let mut tensors = HashMap::new();
    for (name, view) in file.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!(
                "{}: tensor {name:?} is {:?}; captune reads float32 tensors only",
                path.display(),
                view.dtype()
            );
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
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

impl TensorFile {
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
