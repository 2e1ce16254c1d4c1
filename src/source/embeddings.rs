//! The image embeddings of a data set, one per item: read from a
//! features file (`--features`) or computed by a retriever and cached on
//! disk; what a captioner trained on them records ([`FeatureSource`]), so
//! that later commands default to the same data and refuse embeddings of
//! another encoder.

use super::image_pixels::PixelRows;
use super::image_tokens::TokenRows;
use super::{DataArgs, DataSource, images_listing};
use crate::backend::Backend;
use crate::cache::{self, absolute};
use crate::data::features::{Features, times_norms};
use crate::data::{Dataset, Split};
use crate::progress::Progress;
use crate::retriever::frozen::{self, FrozenRetriever};
use crate::shapes::ShapesConfig;
use crate::tensorfile::fingerprint;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A data set with one image embedding per item, and the image tokens a
/// cross-attending decoder reads when it has them.
pub struct CaptionData {
    pub data: Dataset,
    /// `[items, dim]`, L2-normalised: what retrieval compares captions
    /// with, and a prefix decoder's image input.
    pub features: Vec<f32>,
    pub dim: usize,
    /// `[items]`: each embedding's norm as its encoder gave it, where
    /// known; a captioner that reads embeddings unnormalised
    /// (`raw_embeddings`, ClipCap's MLP) reads `features` times these.
    pub norms: Option<Vec<f32>>,
    /// A vision tower's tokens of every item ([`super::image_tokens`]).
    pub image_tokens: Option<TokenRows>,
    /// The patches a vision tower trained with the decoder reads
    /// ([`super::image_pixels`]).
    pub pixels: Option<PixelRows>,
    /// Where the features came from; recorded in the checkpoints trained on them.
    pub source: Option<FeatureSource>,
}

/// How a decoder reads image embeddings: as unit rows (captune's way), or
/// as their encoder gave them (ClipCap's MLP checkpoints, self-critical's
/// FC models).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddingReading {
    Unit,
    Raw,
}

impl CaptionData {
    pub fn items(&self, split: Split) -> Vec<usize> {
        (0..self.data.items.len())
            .filter(|&i| self.data.items[i].split == split)
            .collect()
    }

    /// The decoder's image inputs of `items`: their patches for a vision
    /// tower trained with it, else their tokens when the data has them,
    /// else their embeddings, read `reading`'s way.
    pub fn inputs_of(&self, items: &[usize], reading: EmbeddingReading) -> Result<Vec<f32>> {
        match (&self.pixels, &self.image_tokens) {
            (Some(pixels), _) => pixels.of(&self.data, items),
            (None, Some(tokens)) => tokens.of(items),
            (None, None) if reading == EmbeddingReading::Raw => {
                let norms = self.norms_for_raw()?;
                let mut rows = self.features_of(items);
                times_norms(&mut rows, self.dim, items.iter().map(|&i| &norms[i]));
                Ok(rows)
            }
            (None, None) => Ok(self.features_of(items)),
        }
    }

    /// Gives the data the image tokens of the BLIP or CLIP folder
    /// `folder`'s vision tower ([`super::image_tokens::rows`]), and records
    /// the folder in its source.
    pub fn attach_image_tokens<B: Backend>(
        &mut self,
        b: &B,
        folder: &Path,
        progress: &Progress,
    ) -> Result<()> {
        let features = self.source.as_ref().and_then(|s| s.features.as_deref());
        let rows = super::image_tokens::rows(b, &self.data, features, folder, progress)?;
        self.image_tokens = Some(rows);
        if let Some(source) = &mut self.source {
            source.image_tokens = Some(absolute(folder));
        }
        Ok(())
    }

    /// Gives the data the pixels of the BLIP folder `folder`'s image
    /// processor, for a vision tower trained with the decoder, and records
    /// the folder in its source.
    pub fn attach_pixels(&mut self, folder: &Path) -> Result<()> {
        self.pixels = Some(super::image_pixels::rows(folder)?);
        if let Some(source) = &mut self.source {
            source.image_pixels = Some(absolute(folder));
        }
        Ok(())
    }

    /// The embeddings' norms, which a captioner reading them unnormalised
    /// needs; an error says how to get them where they are not known.
    pub fn norms_for_raw(&self) -> Result<&[f32]> {
        self.norms.as_deref().with_context(|| {
            format!(
                "this captioner reads image embeddings as their encoder gives them, not \
                 L2-normalised (ClipCap's MLP was trained so), but {} holds unit-length rows \
                 with no record of their norms: write the features with `captune embed`, which \
                 records them, or compute them with --retriever (embeddings cached before \
                 norms were kept have none: delete `features/` in the cache folder)",
                self.source
                    .as_ref()
                    .map_or("the features".into(), |s| s.origin())
            )
        })
    }

    /// Whether the decoder's image inputs are other than the embeddings
    /// (tokens or patches), so that a batch carries both.
    pub fn reads_more_than_embeddings(&self) -> bool {
        self.pixels.is_some() || self.image_tokens.is_some()
    }

    /// The embeddings of `items`, `[items.len(), dim]`.
    pub fn features_of(&self, items: &[usize]) -> Vec<f32> {
        items
            .iter()
            .flat_map(|&i| {
                self.features[i * self.dim..(i + 1) * self.dim]
                    .iter()
                    .copied()
            })
            .collect()
    }
}

/// Where a captioner's image embeddings came from. Recorded in its
/// checkpoint (metadata `features`) and its run's config.toml, so that
/// later commands default to the same data and features and refuse
/// embeddings from another encoder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSource {
    /// The data set, as `--data` takes it.
    pub data: String,
    /// The embedding dimension.
    pub dim: usize,
    /// `--images`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<PathBuf>,
    /// The features file the embeddings were read from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<PathBuf>,
    /// The retriever that embedded the images (computed here, or the
    /// encoder of the features file, by its identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retriever: Option<PathBuf>,
    /// The encoder's identity (`captune-retriever:<fingerprint>`, or a
    /// features file's `encoder` metadata); unknown for plain `.npy` files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<String>,
    /// The BLIP or CLIP folder whose vision tower made the image tokens the
    /// captioner reads, when it reads tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_tokens: Option<PathBuf>,
    /// The BLIP folder whose image processor makes the pixels of a vision
    /// tower trained with the captioner (`--train-vision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pixels: Option<PathBuf>,
    /// The shapes world's settings, for `shapes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shapes: Option<ShapesConfig>,
}

impl FeatureSource {
    /// Where the embeddings came from, in words: the file, or the retriever.
    pub fn origin(&self) -> String {
        match (&self.features, &self.retriever) {
            (Some(f), _) => format!("features file {}", f.display()),
            (None, Some(r)) => format!("retriever {}", r.display()),
            (None, None) => "unrecorded features".into(),
        }
    }
}

/// Where image embeddings come from.
#[derive(clap::Args, Clone, Default)]
pub struct FeatureArgs {
    /// A features file (safetensors from `captune embed` or any encoder, or .npy with --features-ids).
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// The image ids of a .npy features file, one per line.
    #[arg(long)]
    pub features_ids: Option<PathBuf>,
    /// The retriever that embeds the images (and scores self-retrieval and
    /// relevance): a captune retriever checkpoint, or a Hugging Face CLIP
    /// folder as clip:FOLDER. Default: the one the captioner was trained
    /// with, else on the shapes world the shapes retriever carried in the
    /// binary.
    #[arg(long)]
    pub retriever: Option<PathBuf>,
}

/// What a captioner was trained on, and where that record is (a
/// checkpoint or a run folder's config), for defaults and checks.
#[derive(Clone, Copy)]
pub struct TrainedOn<'a> {
    pub record: &'a Path,
    pub source: &'a FeatureSource,
}

impl<'a> TrainedOn<'a> {
    pub fn of(record: &'a Path, source: &'a Option<FeatureSource>) -> Option<TrainedOn<'a>> {
        source.as_ref().map(|source| TrainedOn { record, source })
    }
}

/// A retriever file and its identity as an encoder.
pub struct RetrieverFile {
    pub path: PathBuf,
    pub encoder: String,
}

impl RetrieverFile {
    /// A retriever checkpoint, or a CLIP folder as `clip:FOLDER`.
    pub fn open(path: &Path) -> Result<RetrieverFile> {
        Ok(RetrieverFile {
            path: path.to_path_buf(),
            encoder: frozen::encoder_id(path)?,
        })
    }
}

/// The retriever that embeds images and judges captions: the one asked
/// for, else the captioner's (while its file is there), else on the
/// shapes world the one the binary carries.
pub fn default_retriever(
    asked: Option<&Path>,
    recorded: Option<&FeatureSource>,
    shapes: bool,
) -> Result<Option<RetrieverFile>> {
    let recorded_file = recorded
        .and_then(|r| r.retriever.as_deref())
        .filter(|p| frozen::exists(p));
    let shapes = recorded.map_or(shapes, |r| r.data == DataSource::Shapes.to_string());
    match asked.or(recorded_file) {
        Some(path) => Ok(Some(RetrieverFile::open(path)?)),
        None if shapes => Ok(Some(RetrieverFile::open(&cache::shapes_retriever()?)?)),
        None => Ok(None),
    }
}

/// The data set to use: the one asked for, else the one the captioner
/// was trained on, else the shapes world. Warns when the two differ.
pub fn resolve_data(data: &DataArgs, trained_on: Option<TrainedOn<'_>>) -> Result<DataArgs> {
    let Some(t) = trained_on else {
        return Ok(data.clone());
    };
    let recorded_shapes = t.source.shapes.unwrap_or(data.shapes);
    match &data.data {
        None => Ok(DataArgs {
            data: Some(t.source.data.parse().map_err(|e: String| {
                anyhow::anyhow!("{}: the recorded data set: {e}", t.record.display())
            })?),
            images: data.images.clone().or(t.source.images.clone()),
            shapes: recorded_shapes,
        }),
        Some(asked) => {
            let same_set = asked.absolute().to_string() == t.source.data;
            let differs =
                !same_set || (asked == &DataSource::Shapes && data.shapes != recorded_shapes);
            if differs {
                // Two shapes worlds differ in their settings, not their names.
                let (trained, using) = if same_set {
                    (recorded_shapes.cache_name(), data.shapes.cache_name())
                } else {
                    (t.source.data.clone(), asked.to_string())
                };
                eprintln!(
                    "warning: {} was trained on {trained}; using {using} as asked",
                    t.record.display()
                );
            }
            Ok(data.clone())
        }
    }
}

/// Loads the data set with one embedding per item, and the retriever when
/// there is one. `trained_on` (the captioner's record) fills in what the
/// command line leaves out, and embeddings from another encoder than the
/// captioner's are refused. Embeddings computed with a retriever are
/// cached on disk, keyed by the retriever and the data set.
pub fn load<B: Backend>(
    b: &B,
    data: &DataArgs,
    features: &FeatureArgs,
    trained_on: Option<TrainedOn<'_>>,
    progress: &Progress,
) -> Result<(CaptionData, Option<FrozenRetriever<B>>)> {
    let data = resolve_data(data, trained_on)?;
    let recorded = trained_on.map(|t| t.source);
    let mut dataset = data.load()?;
    let retriever_file =
        default_retriever(features.retriever.as_deref(), recorded, data.is_shapes())?;
    // The features file: asked for, else the captioner's unless a retriever was asked for.
    let features_file = features.features.clone().or_else(|| {
        recorded
            .and_then(|r| r.features.clone())
            .filter(|_| features.retriever.is_none())
    });
    let mut retriever = match &retriever_file {
        Some(r) => Some(FrozenRetriever::load(b, &r.path, 128)?.known_as(r.encoder.clone())),
        None => None,
    };
    let ((embeddings, norms), dim, mut source) = match (&features_file, retriever.as_mut()) {
        (Some(path), _) => {
            let f = Features::load(path, features.features_ids.as_deref())?;
            let embeddings = f.align(&mut dataset)?;
            let source = FeatureSource {
                features: Some(absolute(path)),
                encoder: f.encoder.clone(),
                ..source_of(&data, f.dim)
            };
            (embeddings, f.dim, source)
        }
        (None, Some(r)) => {
            let file = retriever_file
                .as_ref()
                .expect("a loaded retriever has a file");
            let embeddings = embed_cached(b, r, &file.encoder, &mut dataset, progress)?;
            let dim = r.model.config.embed_dim;
            let source = FeatureSource {
                retriever: Some(frozen::absolute(&file.path)),
                encoder: Some(file.encoder.clone()),
                ..source_of(&data, dim)
            };
            (embeddings, dim, source)
        }
        (None, None) => bail!(
            "no image embeddings: give --features FILE (from `captune embed` or another encoder), or --retriever CHECKPOINT or clip:FOLDER"
        ),
    };
    if let Some(t) = trained_on {
        check_same_encoder(t, &source)?;
    }
    // Self-retrieval and relevance compare the retriever's text embeddings
    // with these image embeddings: only meaningful from the same encoder.
    if let Some(file) = &retriever_file {
        if source.encoder.as_ref() == Some(&file.encoder) {
            // Recorded beside a features file too: later commands (eval,
            // a fine-tune from this run) judge with it by default.
            source.retriever = Some(frozen::absolute(&file.path));
        } else {
            eprintln!(
                "warning: the image embeddings come from {} ({}), not from the retriever {}; \
                 self-retrieval and relevance metrics are left out",
                source.origin(),
                source.encoder.as_deref().unwrap_or("an unrecorded encoder"),
                file.path.display()
            );
            retriever = None;
        }
    }
    if !dataset.report.is_clean() {
        eprintln!("{}", dataset.report);
    }
    let mut data = CaptionData {
        data: dataset,
        features: embeddings,
        dim,
        norms,
        image_tokens: None,
        pixels: None,
        source: Some(source),
    };
    // A captioner that reads image tokens reads those of its vision
    // tower; one that trains its tower reads its folder's pixels.
    if let Some(folder) = recorded.and_then(|r| r.image_tokens.as_ref()) {
        data.attach_image_tokens(b, folder, progress)?;
    }
    if let Some(folder) = recorded.and_then(|r| r.image_pixels.as_ref()) {
        data.attach_pixels(folder)?;
    }
    Ok((data, retriever))
}

/// A record of `data` with embeddings of `dim`; the caller adds their origin.
fn source_of(data: &DataArgs, dim: usize) -> FeatureSource {
    FeatureSource {
        data: data.source().absolute().to_string(),
        dim,
        images: data.images.as_deref().map(absolute),
        features: None,
        retriever: None,
        encoder: None,
        image_tokens: None,
        image_pixels: None,
        shapes: data.is_shapes().then_some(data.shapes),
    }
}

/// Refuses embeddings that differ from the captioner's in dimension or
/// encoder, naming both and what differs.
pub fn check_same_encoder(t: TrainedOn<'_>, now: &FeatureSource) -> Result<()> {
    let was = t.source;
    if was.dim != now.dim {
        bail!(
            "{} was trained on {}-dimensional embeddings ({}), but {} gives {}; \
             use the captioner's own features or retriever",
            t.record.display(),
            was.dim,
            was.origin(),
            now.origin(),
            now.dim
        );
    }
    if let (Some(a), Some(b)) = (&was.encoder, &now.encoder)
        && a != b
    {
        bail!(
            "{} was trained on embeddings from encoder {a} ({}), but {} comes from encoder {b}; \
             a captioner reads only its own encoder's embeddings: use the same retriever or features",
            t.record.display(),
            was.origin(),
            now.origin()
        );
    }
    Ok(())
}

/// The unit embeddings of `data`'s images by the retriever `r` (identity
/// `encoder`) and their norms, from the cache when they are there; else
/// computed (with progress bars) and cached. Items whose image cannot be
/// read are removed from `data`, as `images::load` does.
fn embed_cached<B: Backend>(
    b: &B,
    r: &mut FrozenRetriever<B>,
    encoder: &str,
    data: &mut Dataset,
    progress: &Progress,
) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
    let mut listing = format!("{encoder}\n{}\n", r.image_reading());
    listing.push_str(&images_listing(data));
    let cached = cache::features(&data.name, &fingerprint(listing.as_bytes()));
    if cached.is_file() {
        match Features::load(&cached, None).and_then(|f| f.align(data)) {
            // Those cached before their norms were kept have none.
            Ok(aligned) => {
                eprintln!("image embeddings from the cache: {}", cached.display());
                return Ok(aligned);
            }
            Err(e) => {
                eprintln!("warning: ignoring the cached embeddings ({e:#}); computing them again")
            }
        }
    }
    let (embeddings, norms) = r.embed_dataset(b, data, progress)?;
    let mut features = Features {
        source: cached.clone(),
        ids: data.items.iter().map(|i| i.id.clone()).collect(),
        dim: r.model.config.embed_dim,
        embeddings,
        encoder: Some(encoder.to_string()),
        norms: Some(norms),
    };
    // As loading them back from the cache would: the same bits either way.
    features.normalise()?;
    let metadata = HashMap::from([("dataset".to_string(), data.name.clone())]);
    if let Err(e) = features.save(&cached, metadata) {
        eprintln!("warning: cannot cache the image embeddings ({e:#})");
    }
    Ok((features.embeddings, features.norms))
}
