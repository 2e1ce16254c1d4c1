//! PyTorch checkpoints, read without running code: the zip files
//! `torch.save` writes since PyTorch 1.6 (`.pt`, `.pth`, `.bin`).
//!
//! Such a file is a pickle (`data.pkl`) whose tensors point into raw
//! storages stored beside it (`data/0`, `data/1`, ...). PyTorch loads it
//! by running the pickle, which can call any Python function it names;
//! here the pickle is read by [`pickle::load`], which knows only the
//! dicts, lists, tuples, strings, numbers and tensor rebuilds a state dict
//! is made of and refuses any other object by name. Tensors are rebuilt
//! from their storages (float32, float16, bfloat16, float64, integers and
//! bools; any strides and offsets) as float32.
//!
//! Why not a crate: `candle-core` and `burn-store` read these files but
//! each brings its framework's tensor crates, and `serde-pickle` has no
//! persistent ids, which is how a torch pickle names its storages. The
//! subset a state dict needs is small enough to keep here, and to fuzz.

pub mod pickle;

use crate::tensorfile::{Tensor, TensorFile};
use crate::zip::Archive;
use anyhow::{Context, Result, bail};
use pickle::{DType, TensorRef, Value};
use std::path::Path;

/// Where a checkpoint's state dict may sit when it is not the whole
/// file, in the order they are tried: `{"model": ...}` (BLIP's and
/// many training scripts'), `{"state_dict": ...}`.
const STATE_DICT_KEYS: [&str; 2] = ["model", "state_dict"];

/// The largest integer every value up to which float32 holds exactly.
const EXACT_IN_F32: f64 = 16_777_216.0;

/// The tensors of the state dict in the checkpoint at `path`, each as a
/// contiguous float32 tensor under its name. `key` names the top-level
/// entry that holds it; without one it is the file itself when that is a
/// dict of tensors, else the first of [`STATE_DICT_KEYS`] it has.
pub fn read_state_dict(path: &Path, key: Option<&str>) -> Result<TensorFile> {
    let shown = path.display();
    let mut archive = match Archive::open(path) {
        Ok(a) => a,
        Err(e) if is_legacy(path) => bail!(
            "{shown}: saved by PyTorch before 1.6 (its legacy format), which captune does \
             not read; save it again with a recent PyTorch, or as safetensors ({e})"
        ),
        Err(e) => return Err(e),
    };
    let pickles: Vec<String> = archive
        .names()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .map(str::to_string)
        .collect();
    let [pickle_name] = pickles.as_slice() else {
        bail!("{shown}: a zip archive, but not one torch.save wrote (no single data.pkl)");
    };
    let root = pickle_name.trim_end_matches("data.pkl").to_string();
    let byteorder = format!("{root}byteorder");
    if archive.size(&byteorder).is_some() {
        let order = archive.read_all(&byteorder)?;
        if order != b"little" {
            bail!(
                "{shown}: storages saved {:?}-endian; captune reads little-endian ones",
                String::from_utf8_lossy(&order)
            );
        }
    }
    let bytes = archive.read_all(pickle_name)?;
    let value = pickle::load(&bytes).with_context(|| format!("{shown}: {pickle_name}"))?;
    let entries = state_dict(value, key).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let mut file = TensorFile::new([]);
    for (name, tensor) in entries {
        let t = materialise(&mut archive, &root, &tensor)
            .with_context(|| format!("{shown}: tensor {name:?}"))?;
        file.tensors.insert(name, t);
    }
    Ok(file)
}

/// Whether `path` starts as a legacy `torch.save` file does: a pickle
/// (protocol 2) of its magic number.
fn is_legacy(path: &Path) -> bool {
    let mut head = [0u8; 3];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && head[..2] == [0x80, 0x02]
        && head[2] == 0x8a
}

/// The named tensors of the state dict in `value` (see [`read_state_dict`]).
fn state_dict(value: Value, key: Option<&str>) -> Result<Vec<(String, TensorRef)>> {
    let Value::Dict(top) = value else {
        bail!("holds {}, not a dict of tensors", value.kind());
    };
    let named = |k: &str| {
        top.iter()
            .find(|(n, _)| matches!(n, Value::Str(s) if s == k))
            .map(|(_, v)| v.clone())
    };
    let keys = || {
        top.iter()
            .map(|(k, _)| match k {
                Value::Str(s) => format!("{s:?}"),
                other => other.kind().to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all_tensors = |d: &[(Value, Value)]| d.iter().all(|(_, v)| matches!(v, Value::Tensor(_)));
    let dict = match key {
        Some(k) => named(k).ok_or_else(|| anyhow::anyhow!("no entry {k:?}; it has {}", keys()))?,
        None if all_tensors(&top) => Value::Dict(top.clone()),
        None => STATE_DICT_KEYS
            .iter()
            .find_map(|k| named(k))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no state dict: its entries are {}, and none of {STATE_DICT_KEYS:?} is there",
                    keys()
                )
            })?,
    };
    let Value::Dict(entries) = dict else {
        bail!("its state dict is {}, not a dict of tensors", dict.kind());
    };
    entries
        .into_iter()
        .map(|(k, v)| match (k, v) {
            (Value::Str(name), Value::Tensor(t)) => Ok((name, t)),
            (Value::Str(name), v) => {
                bail!("state dict entry {name:?} is {}, not a tensor", v.kind())
            }
            (k, _) => bail!("a state dict key that is {}, not a name", k.kind()),
        })
        .collect()
}

/// A tensor's elements, gathered from its storage into row-major order
/// as float32.
fn materialise(archive: &mut Archive, root: &str, t: &TensorRef) -> Result<Tensor> {
    let s = &t.storage;
    let entry = format!("{root}data/{}", s.key);
    let size = s.dtype.size() as u64;
    let Some(held) = archive.size(&entry) else {
        bail!("its storage {entry:?} is not in the archive");
    };
    if s.len.checked_mul(size).is_none_or(|bytes| bytes > held) {
        bail!(
            "its storage claims {} elements, but {entry:?} holds {held} bytes",
            s.len
        );
    }
    let numel = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= s.len)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "shape {:?} is larger than its storage of {}",
                t.shape,
                s.len
            )
        })?;
    if numel == 0 {
        return Ok(Tensor {
            shape: t.shape.clone(),
            data: Vec::new(),
        });
    }
    // The last element the view reaches, which the storage must hold.
    let last = t
        .shape
        .iter()
        .zip(&t.stride)
        .try_fold(t.offset, |end, (&d, &st)| {
            end.checked_add((d as u64 - 1).checked_mul(st)?)
        })
        .filter(|&end| end < s.len)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the view (offset {}, shape {:?}, strides {:?}) reaches past its storage of {}",
                t.offset,
                t.shape,
                t.stride,
                s.len
            )
        })?;
    let bytes = archive.read(&entry, t.offset * size, (last - t.offset + 1) * size)?;
    let mut data = Vec::with_capacity(numel as usize);
    let mut index = vec![0usize; t.shape.len()];
    for _ in 0..numel {
        let at: u64 = index
            .iter()
            .zip(&t.stride)
            .map(|(&i, &st)| i as u64 * st)
            .sum();
        data.push(element(
            &bytes[(at * size) as usize..][..size as usize],
            s.dtype,
        )?);
        // The next row-major index.
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < t.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(Tensor {
        shape: t.shape.clone(),
        data,
    })
}

/// One little-endian element as float32; an integer float32 cannot hold
/// exactly is an error.
fn element(b: &[u8], dtype: DType) -> Result<f32> {
    let int = |v: i64| {
        if (v as f64).abs() > EXACT_IN_F32 {
            bail!("integer {v} has no exact float32");
        }
        Ok(v as f32)
    };
    Ok(match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into()?),
        DType::F16 => half::f16::from_le_bytes(b.try_into()?).to_f32(),
        DType::BF16 => half::bf16::from_le_bytes(b.try_into()?).to_f32(),
        DType::F64 => f64::from_le_bytes(b.try_into()?) as f32,
        DType::I64 => int(i64::from_le_bytes(b.try_into()?))?,
        DType::I32 => int(i32::from_le_bytes(b.try_into()?).into())?,
        DType::I16 => f32::from(i16::from_le_bytes(b.try_into()?)),
        DType::I8 => f32::from(b[0] as i8),
        DType::U8 | DType::Bool => f32::from(b[0]),
    })
}
