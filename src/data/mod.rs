//! Caption data sets: the embedded shapes world and real data (Karpathy
//! split files, COCO annotation files), the PTB tokenizer, the vocabulary,
//! image loading and features files.
//!
//! Every loader returns a [`Dataset`] and reports what it skipped: an item
//! that cannot be used (a missing image, a malformed entry, no caption with
//! a token) is left out with a warning naming the file and the item, and
//! the rest still loads.

pub mod bpe;
pub mod clip_text;
pub mod coco;
pub mod features;
pub mod image_processor;
pub mod image_tokens;
pub mod images;
pub mod karpathy;
pub mod tokenize;
pub mod vocab;
pub mod wordpiece;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Val,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Val, Split::Test];

    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }

    /// A Karpathy split name; "restval" is training data, as in the papers.
    pub fn parse(name: &str) -> Option<Split> {
        match name {
            "train" | "restval" => Some(Split::Train),
            "val" => Some(Split::Val),
            "test" => Some(Split::Test),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caption {
    pub raw: String,
    /// PTB tokens, lower-cased, punctuation dropped; never empty.
    pub tokens: Vec<String>,
}

/// One image and its reference captions.
#[derive(Clone, Debug)]
pub struct Item {
    /// The image id: the Karpathy `imgid`/`cocoid` or the COCO `id`.
    pub id: String,
    pub split: Split,
    pub image: PathBuf,
    pub captions: Vec<Caption>,
    /// What the data set's file carries per image beyond these fields,
    /// by key, as read: the module that knows a key reads it (the shapes
    /// world's `scene`: `shapes::scene`).
    pub extensions: Extensions,
}

/// An item's extra fields, by key, as their JSON text: parsed only by
/// the module that reads them (building values of the shapes world's
/// 22,000 scenes took a tenth of loading it).
pub type Extensions = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;

#[derive(Clone, Debug, Default)]
pub struct Dataset {
    pub name: String,
    pub items: Vec<Item>,
    pub report: LoadReport,
}

impl Dataset {
    pub fn split(&self, split: Split) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(move |i| i.split == split)
    }

    /// Keeps only the items of `split`.
    pub fn only(&self, split: Split) -> Dataset {
        Dataset {
            name: format!("{} ({})", self.name, split.name()),
            items: self.split(split).cloned().collect(),
            report: self.report.clone(),
        }
    }
}

/// What a loader left out, and why (the first few reasons in full).
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub skipped_items: usize,
    pub skipped_captions: usize,
    pub warnings: Vec<String>,
}

/// Reasons kept in full; the rest are only counted.
const WARNINGS_KEPT: usize = 10;

impl LoadReport {
    pub fn skip_item(&mut self, why: String) {
        self.skipped_items += 1;
        self.warn(why);
    }

    pub fn skip_caption(&mut self, why: String) {
        self.skipped_captions += 1;
        self.warn(why);
    }

    fn warn(&mut self, why: String) {
        if self.warnings.len() < WARNINGS_KEPT {
            self.warnings.push(why);
        }
    }

    pub fn is_clean(&self) -> bool {
        self.skipped_items == 0 && self.skipped_captions == 0
    }

    pub fn merge(&mut self, other: LoadReport) {
        self.skipped_items += other.skipped_items;
        self.skipped_captions += other.skipped_captions;
        for w in other.warnings {
            self.warn(w);
        }
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "skipped {} item(s) and {} caption(s)",
            self.skipped_items, self.skipped_captions
        )?;
        for w in &self.warnings {
            write!(f, "\n  {w}")?;
        }
        let listed = self.warnings.len();
        let total = self.skipped_items + self.skipped_captions;
        if total > listed {
            write!(f, "\n  ... and {} more", total - listed)?;
        }
        Ok(())
    }
}

/// Tokenises a raw caption; None (with the reason recorded) when it has no tokens.
pub fn caption(
    raw: &str,
    file: &std::path::Path,
    item: &str,
    report: &mut LoadReport,
) -> Option<Caption> {
    let tokens = tokenize::ptb_tokenize(raw);
    if tokens.is_empty() {
        report.skip_caption(format!(
            "{}: {item}: caption {raw:?} has no tokens after tokenisation; skipped",
            file.display()
        ));
        return None;
    }
    Some(Caption {
        raw: raw.to_string(),
        tokens,
    })
}
