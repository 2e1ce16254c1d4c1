//! Karpathy split files (`dataset_coco.json`, `dataset_flickr8k.json`,
//! `dataset_flickr30k.json`): `{"images": [{"filename", "filepath"?,
//! "imgid", "cocoid"?, "split", "sentences": [{"raw", ...}]}]}`. The shapes
//! world writes the same layout, with each image's `scene` added: fields
//! beyond the Karpathy ones ride along in `Item::extensions`.

use super::{Dataset, Extensions, Item, LoadReport, Split, caption};
use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::path::{Path, PathBuf};

struct Entry {
    filename: String,
    filepath: Option<String>,
    imgid: Option<serde_json::Value>,
    cocoid: Option<serde_json::Value>,
    split: String,
    sentences: Vec<Sentence>,
    /// Every other field (`sentids`, the shapes world's `scene`...).
    extensions: Extensions,
}

/// By hand: `#[serde(flatten)]` for the extensions would buffer each
/// entry first, and their text (`RawValue`) cannot be read back from
/// that buffer.
impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> serde::de::Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an image entry (an object)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        use serde::de::Error;
        fn once<T, E: Error>(slot: &mut Option<T>, field: &'static str, v: T) -> Result<(), E> {
            match slot.replace(v) {
                Some(_) => Err(E::duplicate_field(field)),
                None => Ok(()),
            }
        }
        let (mut filename, mut filepath, mut imgid, mut cocoid) = (None, None, None, None);
        let (mut split, mut sentences) = (None, None);
        let mut extensions = Extensions::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "filename" => once(&mut filename, "filename", map.next_value()?)?,
                "filepath" => once(&mut filepath, "filepath", map.next_value()?)?,
                "imgid" => once(&mut imgid, "imgid", map.next_value()?)?,
                "cocoid" => once(&mut cocoid, "cocoid", map.next_value()?)?,
                "split" => once(&mut split, "split", map.next_value()?)?,
                "sentences" => once(&mut sentences, "sentences", map.next_value()?)?,
                _ => {
                    extensions.insert(key, map.next_value()?);
                }
            }
        }
        Ok(Entry {
            filename: filename.ok_or_else(|| A::Error::missing_field("filename"))?,
            // `null` reads as absent, as serde's default for an Option.
            filepath: filepath.flatten(),
            imgid: imgid.flatten(),
            cocoid: cocoid.flatten(),
            split: split.ok_or_else(|| A::Error::missing_field("split"))?,
            sentences: sentences.ok_or_else(|| A::Error::missing_field("sentences"))?,
            extensions,
        })
    }
}

#[derive(Deserialize)]
struct Sentence {
    raw: String,
}

/// Reads a JSON file, naming the file and the line and column of a syntax error.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    parse(path, &read_text(path)?)
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The text of the JSON file at `path` as a `T`, naming the file and the
/// line and column of a syntax error.
fn parse<'a, T: Deserialize<'a>>(path: &Path, text: &'a str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "{}: malformed JSON at line {} column {}: {e}; fix or re-download the file",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

fn id_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Loads a Karpathy split file; images are looked for in `images`
/// (default: the `images` folder beside the file), under `filepath` when
/// an entry has one.
pub fn load(path: &Path, images: Option<&Path>) -> Result<Dataset> {
    read(path, images, true)
}

/// The references alone (for scoring): images are not looked for.
pub fn load_references(path: &Path) -> Result<Dataset> {
    read(path, None, false)
}

/// A split file's top level, each entry left unparsed until it is read
/// (the entries are read in parallel; the shapes world's file is 30 MB).
#[derive(Deserialize)]
struct SplitFile<'a> {
    #[serde(default)]
    dataset: Option<serde_json::Value>,
    #[serde(borrow, default)]
    images: Option<&'a RawValue>,
}

fn read(path: &Path, images: Option<&Path>, require_images: bool) -> Result<Dataset> {
    let text = read_text(path)?;
    let file: SplitFile = parse(path, &text)?;
    let entries: Option<Vec<&RawValue>> =
        file.images.and_then(|v| serde_json::from_str(v.get()).ok());
    let Some(entries) = entries else {
        bail!(
            "{}: no \"images\" array: this is not a Karpathy split file (for COCO annotation files use coco:PATH)",
            path.display()
        );
    };
    let image_dir: PathBuf = match images {
        Some(dir) => dir.to_path_buf(),
        None => path.parent().unwrap_or(Path::new(".")).join("images"),
    };
    let name = (file.dataset.as_ref())
        .and_then(|v| v.as_str())
        .unwrap_or("karpathy")
        .to_string();
    let read: Vec<(Option<Item>, LoadReport)> = entries
        .par_iter()
        .enumerate()
        .map(|(k, raw)| {
            let mut report = LoadReport::default();
            let item = entry(path, &image_dir, require_images, k, raw, &mut report);
            (item, report)
        })
        .collect();
    let mut report = LoadReport::default();
    let mut items = Vec::with_capacity(read.len());
    for (item, r) in read {
        report.merge(r);
        items.extend(item);
    }
    if items.is_empty() {
        bail!("{}: no usable image ({})", path.display(), report);
    }
    Ok(Dataset {
        name,
        items,
        report,
    })
}

/// Entry `k` of the file at `path` as an item, or None with the reason in
/// `report`.
fn entry(
    path: &Path,
    image_dir: &Path,
    require_images: bool,
    k: usize,
    raw: &RawValue,
    report: &mut LoadReport,
) -> Option<Item> {
    let entry: Entry = match serde_json::from_str(raw.get()) {
        Ok(e) => e,
        Err(_) => {
            // Said as a field's error, without a position inside the entry.
            let why = serde_json::from_str::<serde_json::Value>(raw.get())
                .and_then(|v| Entry::deserialize(&v).map(|_| ()))
                .err()
                .map_or_else(|| "unreadable".to_string(), |e| e.to_string());
            report.skip_item(format!("{}: images[{k}]: {why}; skipped", path.display()));
            return None;
        }
    };
    let id = entry
        .cocoid
        .as_ref()
        .or(entry.imgid.as_ref())
        .map(id_text)
        .unwrap_or_else(|| entry.filename.clone());
    let label = format!("images[{k}] (id {id}, {})", entry.filename);
    let Some(split) = Split::parse(&entry.split) else {
        report.skip_item(format!(
            "{}: {label}: unknown split {:?} (expected train, restval, val or test); skipped",
            path.display(),
            entry.split
        ));
        return None;
    };
    let (image, found) = resolve(image_dir, entry.filepath.as_deref(), &entry.filename);
    if require_images && !found && !image.is_file() {
        report.skip_item(format!(
            "{}: {label}: image {} not found (pass the image folder with --images); skipped",
            path.display(),
            image.display()
        ));
        return None;
    }
    let captions: Vec<_> = entry
        .sentences
        .iter()
        .filter_map(|s| caption(&s.raw, path, &label, report))
        .collect();
    if captions.is_empty() {
        report.skip_item(format!(
            "{}: {label}: no caption with a token; skipped",
            path.display()
        ));
        return None;
    }
    Some(Item {
        id,
        split,
        image,
        captions,
        extensions: entry.extensions,
    })
}

/// Where an entry's image is, and whether it was already found there.
fn resolve(dir: &Path, filepath: Option<&str>, filename: &str) -> (PathBuf, bool) {
    if let Some(sub) = filepath {
        let nested = dir.join(sub).join(filename);
        if nested.is_file() {
            return (nested, true);
        }
    }
    (dir.join(filename), false)
}
