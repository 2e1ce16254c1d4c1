//! The shapes world: the embedded default data set. Scenes, their pictures
//! and their reference captions come from a seeded generator; a data set
//! is written once in the Karpathy layout (PNG images and a split file
//! with each scene added) and read back like any Karpathy data set.

pub mod captions;
pub mod domain;
pub mod facts;
pub mod lexicon;
pub mod render;
pub mod scene;
pub mod stats;

pub use domain::Domain;
pub use domain::Verbosity;
pub use scene::Scene;

use crate::data::{Dataset, Split};
use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bump when the generator's output changes, so stale caches are not reused.
const GENERATOR_VERSION: u32 = 2;
pub const REFERENCES: usize = 5;
pub const SPLIT_FILE: &str = "dataset_shapes.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ShapesConfig {
    /// Seed of the shapes-world generator.
    #[arg(id = "shapes_seed", long = "shapes-seed", default_value_t = 0)]
    pub seed: u64,
    /// Image side in pixels.
    #[arg(id = "shapes_size", long = "shapes-size", default_value_t = 64)]
    pub image_size: u32,
    #[arg(id = "shapes_train", long = "shapes-train", default_value_t = 20_000)]
    pub train: usize,
    #[arg(id = "shapes_val", long = "shapes-val", default_value_t = 1_000)]
    pub val: usize,
    #[arg(id = "shapes_test", long = "shapes-test", default_value_t = 1_000)]
    pub test: usize,
    /// The world's distributions: default, or shifted (other colour and
    /// size frequencies, more objects, other backgrounds, another caption
    /// mix) to evaluate out of domain.
    #[arg(id = "shapes_domain", long = "shapes-domain", value_enum, default_value_t = Domain::Default)]
    #[serde(default, skip_serializing_if = "Domain::is_default")]
    pub domain: Domain,
}

impl Default for ShapesConfig {
    fn default() -> Self {
        ShapesConfig {
            seed: 0,
            image_size: 64,
            train: 20_000,
            val: 1_000,
            test: 1_000,
            domain: Domain::Default,
        }
    }
}

impl ShapesConfig {
    pub fn count(&self, split: Split) -> usize {
        match split {
            Split::Train => self.train,
            Split::Val => self.val,
            Split::Test => self.test,
        }
    }

    /// The cache folder's name: every setting that changes the output.
    pub fn cache_name(&self) -> String {
        let domain = match self.domain {
            Domain::Default => String::new(),
            d => format!("-{}", d.data_name().trim_start_matches("shapes-")),
        };
        format!(
            "shapes-v{GENERATOR_VERSION}-seed{}-{}px-{}-{}-{}{domain}",
            self.seed, self.image_size, self.train, self.val, self.test
        )
    }
}

/// One generated image: its scene and references.
#[derive(Clone, Debug)]
pub struct Generated {
    pub scene: Scene,
    pub references: Vec<(Verbosity, String)>,
}

/// The RNG of image `index` of `split`: independent of every other image.
fn rng_for(seed: u64, split: Split, index: usize) -> ChaCha8Rng {
    let split_code = Split::ALL.iter().position(|&s| s == split).unwrap() as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(split_code << 40 | index as u64);
    rng
}

pub fn generate(seed: u64, domain: Domain, split: Split, index: usize) -> Generated {
    let mut rng = rng_for(seed, split, index);
    let scene = domain.scene(&mut rng);
    let references = captions::references(&mut rng, &scene, domain, REFERENCES);
    Generated { scene, references }
}

#[derive(Serialize)]
struct SentenceOut<'a> {
    raw: &'a str,
    tokens: Vec<String>,
    verbosity: Verbosity,
}

#[derive(Serialize)]
struct ImageOut<'a> {
    filename: String,
    filepath: &'static str,
    imgid: usize,
    split: &'static str,
    sentences: Vec<SentenceOut<'a>>,
    scene: &'a Scene,
}

/// Writes the data set into `dir`: `images/<split>/<imgid>.png` and
/// `dataset_shapes.json`. Everything goes to a temporary folder beside
/// `dir`, renamed into place at the end, so a half-written data set is
/// never read. A data set already in `dir` is replaced.
pub fn write(config: &ShapesConfig, dir: &Path) -> Result<()> {
    write_as(config, dir, Existing::Replace)
}

/// What writing a data set does with one already in its folder.
#[derive(Clone, Copy, PartialEq)]
enum Existing {
    Replace,
    /// Keeps it: the same data set, put there meanwhile by another writer
    /// (another thread or process loading the same world into the cache).
    Keep,
}

fn write_as(config: &ShapesConfig, dir: &Path, existing: Existing) -> Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.{}",
        dir.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        crate::tensorfile::temporary_suffix()
    ));
    let mut entries = Vec::new();
    let mut generated = Vec::new();
    for split in Split::ALL {
        std::fs::create_dir_all(tmp.join("images").join(split.name()))?;
        let start = generated.len();
        generated.extend(
            (0..config.count(split))
                .into_par_iter()
                .map(|i| generate(config.seed, config.domain, split, i))
                .collect::<Vec<_>>(),
        );
        generated[start..]
            .par_iter()
            .enumerate()
            .try_for_each(|(i, g)| -> Result<()> {
                let file = tmp
                    .join("images")
                    .join(split.name())
                    .join(format!("{i:05}.png"));
                render::render(&g.scene, config.image_size)
                    .save(&file)
                    .with_context(|| format!("cannot write {}", file.display()))
            })?;
        entries.extend((0..config.count(split)).map(|i| (split, i, start + i)));
    }
    let images: Vec<ImageOut> = entries
        .iter()
        .enumerate()
        .map(|(imgid, &(split, i, g))| ImageOut {
            filename: format!("{i:05}.png"),
            filepath: split.name(),
            imgid,
            split: split.name(),
            sentences: generated[g]
                .references
                .iter()
                .map(|(v, raw)| SentenceOut {
                    raw,
                    tokens: crate::data::tokenize::ptb_tokenize(raw),
                    verbosity: *v,
                })
                .collect(),
            scene: &generated[g].scene,
        })
        .collect();
    let json = serde_json::json!({
        "dataset": config.domain.data_name(),
        "generator": config,
        "images": images,
    });
    let file = tmp.join(SPLIT_FILE);
    std::fs::write(&file, serde_json::to_vec(&json)?)
        .with_context(|| format!("cannot write {}", file.display()))?;
    if existing == Existing::Replace && dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    // Keeping, nothing is deleted: a rename onto a folder that is not
    // empty fails, and then the copy another writer put there is used.
    match std::fs::rename(&tmp, dir) {
        Err(_) if existing == Existing::Keep && dir.join(SPLIT_FILE).is_file() => {
            std::fs::remove_dir_all(&tmp)
                .with_context(|| format!("cannot remove {}", tmp.display()))
        }
        moved => moved.with_context(|| {
            format!(
                "cannot move the data set into {}; if an unfinished copy is there, remove it",
                dir.display()
            )
        }),
    }
}

/// The data set for `config`, generated into the cache on first use.
pub fn load(config: &ShapesConfig) -> Result<Dataset> {
    let dir = crate::cache::root().join(config.cache_name());
    if !dir.join(SPLIT_FILE).is_file() {
        eprintln!("generating the shapes world into {} (once)", dir.display());
        write_as(config, &dir, Existing::Keep)?;
    }
    let file = dir.join(SPLIT_FILE);
    let mut data = crate::data::karpathy::load(&file, None)?;
    data.name = config.domain.data_name().into();
    // Every image carries its scene: the facts metrics read them.
    data.items.par_iter().try_for_each(|item| {
        let Some(value) = item.extensions.get(SCENE_KEY) else {
            bail!(
                "{}: image {} has no scene; delete {} to generate the world again",
                file.display(),
                item.id,
                dir.display()
            );
        };
        serde_json::from_str::<Scene>(value.get()).with_context(|| {
            format!(
                "{}: image {}: the scene does not parse; delete {} to generate the world again",
                file.display(),
                item.id,
                dir.display()
            )
        })?;
        Ok(())
    })?;
    Ok(data)
}

/// The key of an image's scene in the split file.
const SCENE_KEY: &str = "scene";

/// The scene of a shapes-world item (`None` for any other data set's).
pub fn scene(item: &crate::data::Item) -> Option<Scene> {
    serde_json::from_str(item.extensions.get(SCENE_KEY)?.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads loading the same world into an empty cache both get a
    /// whole data set: the one that finishes second keeps the first's.
    #[test]
    fn writers_of_the_same_world_at_once_leave_one_whole_data_set() {
        let config = ShapesConfig {
            seed: 3,
            image_size: 16,
            train: 6,
            val: 2,
            test: 2,
            domain: Domain::Default,
        };
        let root = std::env::temp_dir().join(format!(
            "captune-shapes-race-{}",
            crate::tensorfile::temporary_suffix()
        ));
        let dir = root.join("world");
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| write_as(&config, &dir, Existing::Keep)))
                .collect();
            for w in writers {
                w.join().unwrap().unwrap();
            }
        });
        let left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["world"], "temporary folders left behind");
        let data = crate::data::karpathy::load(&dir.join(SPLIT_FILE), None).unwrap();
        assert_eq!(data.items.len(), 10);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
