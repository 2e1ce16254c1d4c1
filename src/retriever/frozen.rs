//! A retriever used frozen: the judge of self-retrieval and relevance,
//! the listener of the objectives that read captions with it, the image encoder of
//! `caption` and of embeddings computed on the fly. It is captune's own
//! checkpoint or a Hugging Face CLIP folder (named `clip:FOLDER`), and
//! each reads captions and images its own way: captune's by its word
//! vocabulary and resized, patchified pixels; CLIP's by its BPE tokenizer
//! and its image processor.

use super::Checkpoint;
use super::eval::{embed_ids, embed_images_raw, unit_rows_and_norms};
use crate::backend::Backend;
use crate::data::clip_text::ClipTokenizer;
use crate::data::image_processor::ImageProcessor;
use crate::data::vocab::{BOS, EOS, UNK, Vocab};
use crate::data::{Dataset, images};
use crate::model::clip;
use crate::model::retriever::Retriever;
use crate::progress::Progress;
use crate::{cache, tensorfile};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What names a CLIP folder where a retriever checkpoint is asked for.
pub const CLIP_PREFIX: &str = "clip:";

/// The CLIP folder `path` names (`clip:FOLDER`), if it names one.
pub fn clip_folder(path: &Path) -> Option<&Path> {
    path.to_str()?.strip_prefix(CLIP_PREFIX).map(Path::new)
}

/// `path` with its file or folder made absolute (after `clip:` for a CLIP).
pub fn absolute(path: &Path) -> PathBuf {
    match clip_folder(path) {
        Some(dir) => PathBuf::from(format!("{CLIP_PREFIX}{}", cache::absolute(dir).display())),
        None => cache::absolute(path),
    }
}

/// Whether the checkpoint file or CLIP folder `path` names is there.
pub fn exists(path: &Path) -> bool {
    match clip_folder(path) {
        Some(dir) => dir.is_dir(),
        None => path.is_file(),
    }
}

/// The identity of the retriever `path` names as an image encoder, as
/// features files record it.
pub fn encoder_id(path: &Path) -> Result<String> {
    match clip_folder(path) {
        Some(dir) => clip::encoder_id(dir),
        None if path.is_dir() => bail!(
            "{} is a folder, not a retriever checkpoint; for a Hugging Face CLIP folder pass \
             {CLIP_PREFIX}{}",
            path.display(),
            path.display()
        ),
        None => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            Ok(crate::data::features::retriever_encoder_id(&bytes))
        }
    }
}

/// How a retriever turns captions into the ids its text tower reads.
pub enum CaptionReader {
    /// captune's: one id per word, `<unk>` for a word it does not know.
    Words(Vocab),
    /// CLIP's byte-level BPE: every word is one or more pieces.
    Clip(Box<ClipTokenizer>),
}

impl CaptionReader {
    /// The id before a caption's pieces.
    pub fn begin(&self) -> u32 {
        match self {
            CaptionReader::Words(_) => BOS,
            CaptionReader::Clip(t) => t.start(),
        }
    }

    /// The id after them, where the text tower reads its state.
    pub fn end(&self) -> u32 {
        match self {
            CaptionReader::Words(_) => EOS,
            CaptionReader::Clip(t) => t.end(),
        }
    }

    /// The pieces of one word: its id (`<unk>` if unknown), or its BPE pieces.
    pub fn pieces(&self, word: &str) -> Result<Vec<u32>> {
        match self {
            CaptionReader::Words(v) => Ok(vec![v.id(word)]),
            CaptionReader::Clip(t) => t.pieces(word),
        }
    }

    /// A captioner's special that no caption holds (its padding, its
    /// start), spelled `word`: captune's retriever reads its own special of
    /// that name, CLIP nothing (it would read the name as text).
    pub fn special(&self, word: &str) -> Vec<u32> {
        match self {
            CaptionReader::Words(v) => vec![v.id(word)],
            CaptionReader::Clip(_) => Vec::new(),
        }
    }

    /// What an empty caption reads as between its begin and end: captune's
    /// retriever reads `<unk>`, CLIP nothing.
    pub fn empty(&self) -> Vec<u32> {
        match self {
            CaptionReader::Words(_) => vec![UNK],
            CaptionReader::Clip(_) => Vec::new(),
        }
    }

    /// A caption's words as the text tower reads them: begin, the words'
    /// pieces (cut to `max_len` ids in all), end.
    pub fn encode(&self, words: &[String], max_len: usize) -> Result<Vec<u32>> {
        let mut pieces = Vec::new();
        for word in words {
            pieces.extend(self.pieces(word)?);
        }
        Ok(self.framing().frame(pieces, max_len))
    }

    /// Its begin, end and empty caption.
    pub fn framing(&self) -> Framing {
        Framing {
            begin: self.begin(),
            end: self.end(),
            empty: self.empty(),
        }
    }
}

/// How a retriever frames a caption's pieces.
#[derive(Clone, Debug, PartialEq)]
pub struct Framing {
    pub begin: u32,
    pub end: u32,
    /// What an empty caption reads as.
    pub empty: Vec<u32>,
}

impl Framing {
    /// begin, `pieces` (or the empty caption's), end, within `max_len`.
    pub fn frame(&self, mut pieces: Vec<u32>, max_len: usize) -> Vec<u32> {
        if pieces.is_empty() {
            pieces = self.empty.clone();
        }
        pieces.truncate(max_len.saturating_sub(2));
        std::iter::once(self.begin)
            .chain(pieces)
            .chain(std::iter::once(self.end))
            .collect()
    }
}

/// How a retriever turns image files into its image tower's patches.
enum ImageReader {
    /// captune's: resized to the tower's side, scaled as `patchify` does.
    Patches,
    /// CLIP's image processor (resize, centre crop, normalise).
    Clip(ImageProcessor),
}

/// A retriever loaded to be used frozen, with its caption and image readers.
pub struct FrozenRetriever<B: Backend> {
    pub model: Retriever<B>,
    pub captions: CaptionReader,
    images: ImageReader,
    /// What it was loaded from (a checkpoint, or `clip:FOLDER`), if
    /// anything: its identity ([`encoder_id`]) keys its cached reference
    /// embeddings.
    source: Option<PathBuf>,
    /// That identity, once known: given by a caller that has it, or read
    /// from `source` when a reference cache first needs it (for a CLIP it
    /// fingerprints every weight, which no other use of a retriever needs).
    identity: Option<String>,
    /// The reference embeddings this process has computed, by key, for
    /// the validations of a run.
    references: HashMap<String, Vec<f32>>,
}

/// The largest batch of a frozen CLIP: its towers are large.
pub const CLIP_BATCH: usize = 32;

impl<B: Backend> FrozenRetriever<B> {
    /// A trained retriever, frozen.
    pub fn from_checkpoint(b: &B, mut ck: Checkpoint<B>) -> Result<Self> {
        ck.model.freeze(b)?;
        Ok(Self::words(ck))
    }

    /// captune's retriever (frozen), which reads words and patches.
    fn words(ck: Checkpoint<B>) -> Self {
        FrozenRetriever {
            model: ck.model,
            captions: CaptionReader::Words(ck.vocab),
            images: ImageReader::Patches,
            source: None,
            identity: None,
            references: HashMap::new(),
        }
    }
}

impl<B: Backend> FrozenRetriever<B> {
    /// The captune retriever checkpoint at `path`, or the CLIP folder of
    /// `clip:FOLDER`, embedding `batch` images or captions at a time (a
    /// CLIP at most 32).
    pub fn load(b: &B, path: &Path, batch: usize) -> Result<Self> {
        let mut r = match clip_folder(path) {
            Some(dir) => Self::clip(b, dir, batch)?,
            None => Self::words(Checkpoint::load_with(b, path, |c| {
                Retriever::frozen(b, c, batch)
            })?),
        };
        r.source = Some(path.to_path_buf());
        Ok(r)
    }

    /// The same retriever, its identity ([`encoder_id`]) given by a caller
    /// that has already read it.
    pub fn known_as(mut self, identity: String) -> Self {
        self.identity = Some(identity);
        self
    }

    /// The Hugging Face CLIP folder `dir`, embedding `batch` (at most 32)
    /// images or captions at a time.
    pub fn clip(b: &B, dir: &Path, batch: usize) -> Result<Self> {
        let clip = clip::read(dir)?;
        let tokenizer = ClipTokenizer::load(dir, clip.retriever.max_len)?;
        let processor = ImageProcessor::load(dir)?;
        Ok(FrozenRetriever {
            model: clip.into_retriever(b, batch.min(CLIP_BATCH))?,
            captions: CaptionReader::Clip(Box::new(tokenizer)),
            images: ImageReader::Clip(processor),
            source: Some(PathBuf::from(format!("{CLIP_PREFIX}{}", dir.display()))),
            identity: None,
            references: HashMap::new(),
        })
    }

    /// Whether it is a CLIP (which CLIPScore needs).
    pub fn is_clip(&self) -> bool {
        matches!(self.captions, CaptionReader::Clip(_))
    }

    /// The unit text embeddings `[n, embed_dim]` of captions given as words.
    pub fn embed_captions(&mut self, b: &B, captions: &[Vec<String>]) -> Result<Vec<f32>> {
        let max_len = self.model.config.max_len;
        let ids: Vec<Vec<u32>> = captions
            .iter()
            .map(|words| self.captions.encode(words, max_len))
            .collect::<Result<_>>()?;
        embed_ids(b, &mut self.model, &ids)
    }

    /// The unit text embeddings `[n, embed_dim]` of raw texts, as CLIP's
    /// tokenizer reads them (CLIPScore's prompted captions).
    pub fn embed_texts(&mut self, b: &B, texts: &[String]) -> Result<Vec<f32>> {
        let CaptionReader::Clip(tokenizer) = &self.captions else {
            bail!("raw text is read by a CLIP; captune's retriever reads words");
        };
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|text| tokenizer.encode(text))
            .collect::<Result<_>>()?;
        embed_ids(b, &mut self.model, &ids)
    }

    /// [`Self::embed_captions`] of a data set's reference captions, which
    /// every evaluation of it embeds again: from this process's earlier
    /// evaluations, else from the cache (keyed by the retriever's identity
    /// and the captions), else computed and cached.
    pub fn embed_reference_captions(
        &mut self,
        b: &B,
        data_name: &str,
        captions: &[Vec<String>],
    ) -> Result<Vec<f32>> {
        let lines: Vec<String> = captions.iter().map(|c| c.join(" ")).collect();
        self.cached_references(data_name, "captions", &lines, |r| {
            r.embed_captions(b, captions)
        })
    }

    /// [`Self::embed_texts`] of a data set's reference texts (CLIPScore's
    /// prompted references), cached as [`Self::embed_reference_captions`].
    pub fn embed_reference_texts(
        &mut self,
        b: &B,
        data_name: &str,
        texts: &[String],
    ) -> Result<Vec<f32>> {
        self.cached_references(data_name, "texts", texts, |r| r.embed_texts(b, texts))
    }

    fn cached_references(
        &mut self,
        data_name: &str,
        kind: &str,
        lines: &[String],
        compute: impl FnOnce(&mut Self) -> Result<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        if self.identity.is_none()
            && let Some(source) = &self.source
        {
            self.identity = Some(encoder_id(source)?);
        }
        let identity = self.identity.as_deref().unwrap_or("in memory");
        let listing = format!("{identity}\n{kind}\n{}", lines.join("\n"));
        let key = tensorfile::fingerprint(listing.as_bytes());
        if let Some(e) = self.references.get(&key) {
            return Ok(e.clone());
        }
        let shape = [lines.len(), self.model.config.embed_dim];
        // A retriever only in memory has no identity to key a file with.
        let path = self
            .identity
            .is_some()
            .then(|| cache::text_embeddings(data_name, &key));
        let cached = path.as_ref().and_then(|p| {
            let mut file = tensorfile::read(p).ok()?;
            let t = file.tensors.remove("embeddings")?;
            (t.shape == shape).then_some(t.data)
        });
        let embeddings = match cached {
            Some(e) => {
                if let Some(p) = &path {
                    eprintln!("reference embeddings from the cache: {}", p.display());
                }
                e
            }
            None => {
                let e = compute(self)?;
                if let Some(p) = &path {
                    let tensors = [("embeddings", shape.to_vec(), e.as_slice())];
                    let meta = HashMap::from([("dataset".to_string(), data_name.to_string())]);
                    if let Err(err) = tensorfile::write(p, &tensors, meta) {
                        eprintln!(
                            "warning: cannot cache the reference embeddings at {} ({err:#}); \
                             they are computed again next time",
                            p.display()
                        );
                    }
                }
                e
            }
        };
        self.references.insert(key, embeddings.clone());
        Ok(embeddings)
    }

    /// What the image embeddings depend on besides the weights: the
    /// preprocessing (a cache key).
    pub fn image_reading(&self) -> String {
        match &self.images {
            ImageReader::Patches => self.model.config.image_size.to_string(),
            ImageReader::Clip(p) => format!(
                "clip shortest {} crop {} mean {:?} std {:?}",
                p.size,
                p.side(),
                p.mean,
                p.std
            ),
        }
    }

    /// The unit image embeddings `[items, embed_dim]` of `data`'s images
    /// and each one's norm as the model gave it, advancing a bar of
    /// `progress`. Items whose image cannot be read are removed from
    /// `data` and reported in it, as `images::load` does.
    pub fn embed_dataset(
        &mut self,
        b: &B,
        data: &mut Dataset,
        progress: &Progress,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let raw = self.embed_dataset_raw(b, data, progress)?;
        Ok(unit_rows_and_norms(raw, self.model.config.embed_dim))
    }

    fn embed_dataset_raw(
        &mut self,
        b: &B,
        data: &mut Dataset,
        progress: &Progress,
    ) -> Result<Vec<f32>> {
        let n = data.items.len() as u64;
        match &self.images {
            ImageReader::Patches => {
                let bar = progress.start(&format!("loading {n} images"), n);
                let images = images::load(data, self.model.config.image_size, &bar)?;
                bar.finish_and_clear();
                let all: Vec<usize> = (0..data.items.len()).collect();
                let bar =
                    progress.start(&format!("embedding {} images", all.len()), all.len() as u64);
                let embeddings = embed_images_raw(b, &mut self.model, &images, &all, &bar)?;
                bar.finish_and_clear();
                Ok(embeddings)
            }
            ImageReader::Clip(processor) => {
                let paths: Vec<&Path> = data.items.iter().map(|i| i.image.as_path()).collect();
                let bar = progress.start(&format!("embedding {n} images with CLIP"), n);
                let embedded = clip::embed_files(b, &mut self.model, processor, &paths, &bar)?;
                bar.finish_and_clear();
                let mut kept = embedded.kept.iter().peekable();
                let items = std::mem::take(&mut data.items);
                for (k, item) in items.into_iter().enumerate() {
                    if kept.next_if_eq(&&k).is_some() {
                        data.items.push(item);
                    }
                }
                for why in embedded.skipped {
                    data.report.skip_item(why);
                }
                if data.items.is_empty() {
                    bail!("{}: no image could be read\n{}", data.name, data.report);
                }
                Ok(embedded.embeddings)
            }
        }
    }
}
