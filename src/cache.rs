//! The on-disk cache (`$CAPTUNE_CACHE`, else `$XDG_CACHE_HOME/captune`,
//! else `~/.cache/captune`): generated shapes worlds, the shapes retriever
//! the binary carries, image embeddings, retrievers' embeddings of
//! reference captions, CIDEr-D statistics of training references, image
//! tokens, image neighbours (DiscriTune's hard negatives) and BLIP's own
//! checkpoints converted. Everything in it can be deleted; it is made
//! again when needed.

use crate::tensorfile;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The cache's root folder.
pub fn root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAPTUNE_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("captune");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("captune")
}

/// The shapes world's retriever (`assets/shapes-retriever.safetensors`),
/// carried inside the binary so that an installed `captune` works from
/// any folder.
pub const SHAPES_RETRIEVER: &[u8] = include_bytes!("../assets/shapes-retriever.safetensors");

/// The carried shapes retriever as a file in the cache, written on first
/// use; its name holds its fingerprint, so a newer binary never reads an
/// older copy.
pub fn shapes_retriever() -> Result<PathBuf> {
    static FINGERPRINT: OnceLock<String> = OnceLock::new();
    let fingerprint = FINGERPRINT.get_or_init(|| tensorfile::fingerprint(SHAPES_RETRIEVER));
    let path = root()
        .join("retrievers")
        .join(format!("shapes-{fingerprint}.safetensors"));
    if !path.is_file() {
        tensorfile::write_atomic(&path, SHAPES_RETRIEVER)?;
    }
    Ok(path)
}

/// Where the image embeddings of a data set by an encoder are kept;
/// `key` is the fingerprint of both.
pub fn features(data_name: &str, key: &str) -> PathBuf {
    root()
        .join("features")
        .join(format!("{}-{key}.safetensors", file_name(data_name)))
}

/// Where the image tokens of a data set by a vision tower are kept;
/// `key` is the fingerprint of both.
pub fn image_tokens(data_name: &str, key: &str) -> PathBuf {
    root()
        .join("image-tokens")
        .join(format!("{}-{key}.safetensors", file_name(data_name)))
}

/// Where the CIDEr-D document frequencies of a data set's training
/// references are kept; `key` is the fingerprint of the references.
pub fn cider_statistics(data_name: &str, key: &str) -> PathBuf {
    root()
        .join("cider")
        .join(format!("{}-{key}.json", file_name(data_name)))
}

/// Where a retriever's embeddings of a data set's reference captions are
/// kept; `key` is the fingerprint of both.
pub fn text_embeddings(data_name: &str, key: &str) -> PathBuf {
    root()
        .join("text-embeddings")
        .join(format!("{}-{key}.safetensors", file_name(data_name)))
}

/// Where each image's nearest neighbours by embedding cosine are kept;
/// `key` names k and the embeddings' fingerprint.
pub fn neighbours(data_name: &str, key: &str) -> PathBuf {
    root()
        .join("neighbours")
        .join(format!("{}-{key}.u32", file_name(data_name)))
}

/// A data set's name as part of a file name.
fn file_name(data_name: &str) -> String {
    data_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `path` from the root, so that a record of it (or a cache key made
/// of it) holds from any working folder.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A file's path (as given), size and modification time: what says in a
/// cache's key that it changed.
pub fn file_identity(path: &Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let len = meta.map_or(0, |m| m.len());
    format!("{}\t{len}\t{modified}", path.display())
}

/// Where a published checkpoint converted to the folder captune reads is
/// kept (BLIP's own `.pth` that `--decoder blip:FILE` names); `key` is
/// the fingerprint of the checkpoint and of the folder it was converted
/// with.
pub fn converted(key: &str) -> PathBuf {
    root().join("converted").join(key)
}
