//! `captune caption`: caption image files.

use super::captioner::{Captioner, DecodeArgs, blip_checkpoint_folder};
use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::captioner::blip::{BLIP_CAPTION_IDS, blip_checkpoint};
use captune::captioner::decode::generate;
use captune::captioner::{Checkpoint, DecoderFamily};
use captune::data::{Dataset, Item, Split};
use captune::model::blip::{self, BlipVision};
use captune::model::token_tower::TokenTower;
use captune::model::vision::Patcher;
use captune::progress::Progress;
use captune::retriever::frozen::FrozenRetriever;
use captune::source::embeddings::FeatureSource;
use captune::source::embeddings::{TrainedOn, check_same_encoder, default_retriever};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CaptionArgs {
    /// A captune captioner checkpoint, hf:FOLDER for a Hugging Face BLIP
    /// captioner (BlipForConditionalGeneration saved with save_pretrained,
    /// its processor beside it), or hf:DIR for a folder `captune export`
    /// or `captune convert` wrote (with --retriever).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The retriever whose image tower embeds the images: a retriever
    /// checkpoint, or a Hugging Face CLIP folder as clip:FOLDER. Default:
    /// the one the captioner was trained with (on the shapes world, the
    /// carried one).
    #[arg(long)]
    pub retriever: Option<PathBuf>,
    #[command(flatten)]
    pub decoding: DecodeArgs,
    /// With a BLIP folder: text fed after the start before the caption
    /// ("a picture of", as BLIP's captioning checkpoints were trained);
    /// the caption printed is what follows it.
    #[arg(long)]
    pub prompt: Option<String>,
    /// One JSON object per caption (file, caption, ids: the decoder's ids
    /// after the start) instead of a tab-separated line.
    #[arg(long)]
    pub json: bool,
    /// Image files (PNG or JPEG), or folders: a folder means every PNG and
    /// JPEG file directly in it, in name order.
    #[arg(required = true, value_name = "IMAGE_OR_FOLDER")]
    pub images: Vec<PathBuf>,
}

/// The image files the arguments name: files as given, folders expanded
/// to the PNG and JPEG files directly in them, sorted by name.
fn image_files(args: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in args {
        if !path.is_dir() {
            if !path.exists() {
                bail!("{}: no such image file or folder", path.display());
            }
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path)
            .with_context(|| format!("{}: cannot list the folder", path.display()))?;
        let mut found = Vec::new();
        for entry in entries {
            let file = entry
                .with_context(|| format!("{}: cannot list the folder", path.display()))?
                .path();
            let is_image = file
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str()));
            if is_image && file.is_file() {
                found.push(file);
            }
        }
        if found.is_empty() {
            bail!(
                "{}: the folder holds no PNG or JPEG file (.png, .jpg, .jpeg)",
                path.display()
            );
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

pub fn caption<B: Backend>(b: &B, args: &CaptionArgs) -> Result<()> {
    let files = image_files(&args.images)?;
    if let Some(dir) = blip_checkpoint_folder(&args.checkpoint)? {
        return caption_with_blip(b, &dir, &files, args);
    }
    if args.prompt.is_some() {
        bail!("--prompt is for a BLIP folder (--checkpoint hf:FOLDER)");
    }
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let ck_path = args.checkpoint.display();
    if let Some(v) = captioner.ck.model.config.vision {
        // A BLIP trained with its vision tower reads the patches its
        // folder's processor makes.
        let Some(dir) = (captioner.trained_on.as_ref()).and_then(|s| s.image_pixels.clone()) else {
            bail!(
                "{ck_path} trained its vision tower but does not record the BLIP folder whose \
                 image processor it reads (`captune train` records it in every checkpoint of a \
                 run); export it with `captune export --decoder hf:FOLDER` and caption with the \
                 export (--checkpoint hf:OUT)"
            );
        };
        let patcher = blip::patcher(&dir)?;
        if patcher.shape() != (v.patches, v.patch_dim) {
            let (patches, dim) = patcher.shape();
            bail!(
                "{ck_path} trained a vision tower of {} patches of {} values, but {}'s image \
                 processor now makes {patches} of {dim}: the folder has changed since",
                v.patches,
                v.patch_dim,
                dir.display()
            );
        }
        return caption_files(b, FileInputs::Patches(patcher), &captioner.ck, &files, args);
    }
    if captioner.ck.model.config.image_tokens > 0 {
        // A trained BLIP or attention LSTM reads the tokens of the tower
        // it was trained with.
        let Some(dir) = (captioner.trained_on.as_ref()).and_then(|s| s.image_tokens.clone()) else {
            if captioner.ck.model.config.family == DecoderFamily::Lstm {
                bail!(
                    "{ck_path} reads a vision tower's image tokens but does not record its \
                     folder (`captune train` records it in every checkpoint of a run)"
                );
            }
            bail!(
                "{ck_path} reads a BLIP vision tower's image tokens but does not record its \
                 folder; export it with `captune export --decoder hf:FOLDER` and caption with \
                 the export (--checkpoint hf:OUT)"
            );
        };
        let tower = TokenTower::open(b, &dir)?;
        let c = &captioner.ck.model.config;
        let shape = tower.shape();
        if (shape.tokens, shape.dim) != (c.image_tokens, c.embed_dim) {
            bail!(
                "{ck_path} reads {} image tokens of {} values, but the tower of {} now makes {} \
                 of {}: the folder has changed since it was trained",
                c.image_tokens,
                c.embed_dim,
                dir.display(),
                shape.tokens,
                shape.dim
            );
        }
        return caption_files(b, FileInputs::Tokens(tower), &captioner.ck, &files, args);
    }
    if captioner.trained_on.is_none() && args.retriever.is_none() {
        let why = match args.checkpoint.to_string_lossy().starts_with("hf:") {
            true => "a folder records no features",
            false => "it predates the record",
        };
        eprintln!(
            "warning: {ck_path} does not record its features ({why}); embedding with the \
             shapes retriever; pass --retriever with the encoder of the features it was \
             trained on"
        );
    }
    let Some(file) = default_retriever(
        args.retriever.as_deref(),
        captioner.trained_on.as_ref(),
        true,
    )?
    else {
        bail!(
            "{ck_path} was trained on {}, and `caption` embeds images only with a captune \
             retriever or CLIP: pass --retriever with the encoder of those features (a retriever \
             checkpoint, or clip:FOLDER)",
            captioner
                .trained_on
                .as_ref()
                .map_or("unrecorded features".into(), |t| t.origin())
        );
    };
    let mut retriever = FrozenRetriever::load(b, &file.path, 128)?;
    let embed_dim = retriever.model.config.embed_dim;
    let now = FeatureSource {
        retriever: Some(file.path.clone()),
        encoder: Some(file.encoder.clone()),
        dim: embed_dim,
        ..captioner
            .trained_on
            .clone()
            .unwrap_or_else(|| FeatureSource {
                data: "image files".into(),
                dim: embed_dim,
                images: None,
                features: None,
                retriever: None,
                encoder: None,
                image_tokens: None,
                image_pixels: None,
                shapes: None,
            })
    };
    match TrainedOn::of(&args.checkpoint, &captioner.trained_on) {
        Some(t) => check_same_encoder(t, &now)?,
        None if embed_dim != captioner.ck.model.config.embed_dim => bail!(
            "{ck_path} reads {}-dimensional image embeddings but the retriever {} makes \
             {embed_dim}; pass the retriever it was trained with",
            captioner.ck.model.config.embed_dim,
            file.path.display()
        ),
        None => {}
    }
    let mut data = Dataset {
        name: "images".into(),
        items: files
            .iter()
            .map(|p| Item {
                id: p.display().to_string(),
                split: Split::Test,
                image: p.clone(),
                captions: Vec::new(),
                extensions: Default::default(),
            })
            .collect(),
        report: Default::default(),
    };
    let progress = Progress::terminal();
    let (mut features, norms) = retriever.embed_dataset(b, &mut data, &progress)?;
    if !data.report.is_clean() {
        eprintln!("{}", data.report);
    }
    let all: Vec<usize> = (0..data.items.len()).collect();
    let ck = &captioner.ck;
    if ck.model.config.raw_embeddings {
        // As the encoder gave them: the captioner was trained on those.
        captune::data::features::times_norms(&mut features, embed_dim, &norms);
    }
    let decode = &args.decoding.decode;
    let bar = progress.start("captioning", all.len() as u64);
    let generated = generate(
        b,
        &ck.model,
        &features,
        decode,
        &args.decoding.options(&bar),
    )?;
    bar.finish_and_clear();
    for g in generated {
        print_caption(
            &data.items[g.image].id,
            &g.text(&ck.vocab),
            &g.ids,
            args.json,
        );
    }
    Ok(())
}

fn print_caption(file: &str, caption: &str, ids: &[u32], json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({"file": file, "caption": caption, "ids": ids})
        );
    } else {
        println!("{file}\t{caption}");
    }
}

/// Images captioned per vision-tower batch.
const BLIP_IMAGES_PER_BATCH: usize = 16;

/// Captions with a Hugging Face BLIP folder as it is: its processor's
/// pixels, its vision tower's tokens, its text decoder, its tokenizer.
fn caption_with_blip<B: Backend>(
    b: &B,
    dir: &Path,
    files: &[PathBuf],
    args: &CaptionArgs,
) -> Result<()> {
    let mut folder = blip::read(dir)?;
    let tower = TokenTower::Blip(Box::new(BlipVision::new(b, dir, &mut folder)?));
    let prompt = args.prompt.as_deref();
    let ck = blip_checkpoint(b, dir, folder, (BLIP_CAPTION_IDS + 1, prompt), false)?;
    caption_files(b, FileInputs::Tokens(tower), &ck, files, args)
}

/// How a captioner's image inputs are made from image files: the tokens
/// of the frozen vision tower it reads, or the patches of the one it
/// trained.
enum FileInputs<B: Backend> {
    Tokens(TokenTower<B>),
    Patches(Patcher),
}

impl<B: Backend> FileInputs<B> {
    fn of(&mut self, b: &B, files: &[&Path]) -> Result<Vec<f32>> {
        match self {
            FileInputs::Tokens(tower) => tower.tokens_of_files(b, files),
            FileInputs::Patches(patcher) => patcher.patches_of_files(files, |_| String::new()),
        }
    }
}

/// Captions image files with a BLIP captioner and what makes its image
/// inputs.
fn caption_files<B: Backend>(
    b: &B,
    mut inputs: FileInputs<B>,
    ck: &Checkpoint<B>,
    files: &[PathBuf],
    args: &CaptionArgs,
) -> Result<()> {
    let progress = Progress::terminal();
    let bar = progress.start("captioning", files.len() as u64);
    let options = args.decoding.options(&bar);
    for chunk in files.chunks(BLIP_IMAGES_PER_BATCH) {
        let paths: Vec<&Path> = chunk.iter().map(PathBuf::as_path).collect();
        let images = inputs.of(b, &paths)?;
        let generated = generate(b, &ck.model, &images, &args.decoding.decode, &options)?;
        for g in generated {
            let caption = ck.vocab.decode(&g.ids);
            let file = chunk[g.image].display().to_string();
            print_caption(&file, &caption, &g.ids, args.json);
        }
    }
    bar.finish_and_clear();
    Ok(())
}
