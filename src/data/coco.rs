//! COCO caption annotation files (`captions_train2014.json`, ...):
//! `{"images": [{"id", "file_name"}], "annotations": [{"image_id", "caption"}]}`.
//! All images of one file belong to one split, read from the file name.

use super::karpathy::read_json;
use super::{Dataset, Item, LoadReport, Split, caption};
use anyhow::{Result, bail};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

#[derive(Deserialize)]
struct Image {
    id: u64,
    file_name: String,
}

#[derive(Deserialize)]
struct Annotation {
    image_id: u64,
    caption: String,
}

fn split_of(path: &Path) -> Result<Split> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    for split in [Split::Train, Split::Val, Split::Test] {
        if name.contains(split.name()) {
            return Ok(split);
        }
    }
    bail!(
        "{}: cannot tell the split from the file name (it should contain train, val or test, \
         as captions_train2014.json does); rename the file",
        path.display()
    )
}

fn array<'a>(
    json: &'a serde_json::Value,
    key: &str,
    path: &Path,
) -> Result<&'a Vec<serde_json::Value>> {
    match json.get(key).and_then(|v| v.as_array()) {
        Some(a) => Ok(a),
        None => bail!(
            "{}: no {key:?} array: this is not a COCO caption annotation file",
            path.display()
        ),
    }
}

/// Loads a COCO caption annotation file with its images in `images`.
pub fn load(path: &Path, images: &Path) -> Result<Dataset> {
    read(path, Some(images))
}

/// The references alone (for scoring): images are not looked for.
pub fn load_references(path: &Path) -> Result<Dataset> {
    read(path, None)
}

/// `images`: the image folder, where every image must be; `None` checks none.
fn read(path: &Path, images: Option<&Path>) -> Result<Dataset> {
    let split = split_of(path)?;
    let json = read_json(path)?;
    let mut report = LoadReport::default();
    let mut captions: HashMap<u64, Vec<String>> = HashMap::new();
    for (k, value) in array(&json, "annotations", path)?.iter().enumerate() {
        match Annotation::deserialize(value) {
            Ok(a) => captions.entry(a.image_id).or_default().push(a.caption),
            Err(e) => report.skip_caption(format!(
                "{}: annotations[{k}]: {e}; skipped",
                path.display()
            )),
        }
    }
    let mut items = Vec::new();
    for (k, value) in array(&json, "images", path)?.iter().enumerate() {
        let image = match Image::deserialize(value) {
            Ok(i) => i,
            Err(e) => {
                report.skip_item(format!("{}: images[{k}]: {e}; skipped", path.display()));
                continue;
            }
        };
        let label = format!("images[{k}] (id {}, {})", image.id, image.file_name);
        let file = images.unwrap_or(Path::new("")).join(&image.file_name);
        if images.is_some() && !file.is_file() {
            report.skip_item(format!(
                "{}: {label}: image {} not found; skipped",
                path.display(),
                file.display()
            ));
            continue;
        }
        let item_captions: Vec<_> = captions
            .remove(&image.id)
            .unwrap_or_default()
            .iter()
            .filter_map(|raw| caption(raw, path, &label, &mut report))
            .collect();
        if item_captions.is_empty() {
            report.skip_item(format!(
                "{}: {label}: no caption with a token; skipped",
                path.display()
            ));
            continue;
        }
        items.push(Item {
            id: image.id.to_string(),
            split,
            image: file,
            captions: item_captions,
            extensions: Default::default(),
        });
    }
    if items.is_empty() {
        bail!("{}: no usable image ({report})", path.display());
    }
    Ok(Dataset {
        name: "coco".into(),
        items,
        report,
    })
}
