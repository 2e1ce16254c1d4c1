//! METEOR 1.5, as `java -jar meteor-1.5.jar - - -stdio -l en -norm`
//! computes it for pycocoevalcap, without Java: the jar's normalisation,
//! its exact, stem, synonym and paraphrase modules and its aligner's beam
//! search, each segment scored against its best reference, and the corpus
//! score from the summed statistics (not the mean of the segments').
//!
//! METEOR's data is read where the user has it, never copied here: the
//! jar (function words, WordNet synonyms, non-breaking prefixes) and
//! `data/paraphrase-en.gz` beside it, as pycocoevalcap installs them or as
//! a METEOR 1.5 distribution unpacks.

mod align;
mod java;
mod normalize;
mod paraphrase;
mod stats;
mod stem;
mod synonyms;

use crate::zip::Archive;
use align::Word;
use anyhow::{Context, Result, bail};
use java::words;
use normalize::Normalizer;
use paraphrase::Paraphrases;
use rayon::prelude::*;
use stats::Stats;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use synonyms::Synonyms;

const JAR: &str = "meteor-1.5.jar";
const PARAPHRASE_TABLE: &str = "data/paraphrase-en.gz";
/// Where to get the data, for messages.
pub const HOW_TO_GET: &str = "install pycocoevalcap (`pip install pycocoevalcap`, which brings \
     METEOR 1.5's jar and paraphrase table; Java is not needed), or give --meteor DIR, a METEOR 1.5 \
     folder holding meteor-1.5.jar and data/paraphrase-en.gz";

/// Where METEOR's data lies: a folder with the jar and `data/paraphrase-en.gz`.
#[derive(Clone, Debug)]
pub struct MeteorData {
    pub dir: PathBuf,
}

impl MeteorData {
    /// The data in `dir`, which must hold both files.
    pub fn at(dir: &Path) -> Result<MeteorData> {
        for file in [JAR, PARAPHRASE_TABLE] {
            if !dir.join(file).is_file() {
                bail!(
                    "{}: no {file} there, so no METEOR data; give a METEOR 1.5 folder \
                     (pycocoevalcap's `meteor` folder is one)",
                    dir.display()
                );
            }
        }
        Ok(MeteorData {
            dir: dir.to_path_buf(),
        })
    }

    /// pycocoevalcap's copy, where `python3` on the PATH can import it:
    /// None where it cannot, an error where its `meteor` folder lacks the
    /// data.
    pub fn installed() -> Result<Option<MeteorData>> {
        let found = std::process::Command::new("python3")
            .args([
                "-c",
                "import importlib.util as u; s = u.find_spec('pycocoevalcap'); \
                 print(list(s.submodule_search_locations)[0] if s else '')",
            ])
            .stderr(std::process::Stdio::null())
            .output();
        let package = found.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match package {
            Ok(package) if !package.is_empty() => {
                MeteorData::at(&Path::new(&package).join("meteor"))
                    .map(Some)
                    .context("pycocoevalcap is installed without METEOR's data: install it again")
            }
            _ => Ok(None),
        }
    }
}

/// METEOR of a corpus, and of each of its segments.
#[derive(Clone, Debug, PartialEq)]
pub struct MeteorScores {
    pub corpus: f64,
    pub segments: Vec<f64>,
}

/// The hypothesis and references of one segment as the jar receives them
/// from pycocoevalcap: "|||" taken out of the hypothesis, all joined by
/// "|||" and split again (so a reference holding "|||" is two), each
/// trimmed as Java trims. The line always has its three parts: the
/// command, the references and the hypothesis after its space.
fn segment_lines(candidate: &str, references: &[String]) -> (String, Vec<String>) {
    let hypothesis = candidate.replace("|||", "").replace("  ", " ");
    let line = format!("SCORE ||| {} ||| {hypothesis}", references.join(" ||| "));
    let parts: Vec<&str> = line.split("|||").map(java::trim).collect();
    let (test, references) = parts[1..].split_last().expect("the line has its parts");
    (
        test.to_string(),
        references.iter().map(|r| r.to_string()).collect(),
    )
}

/// A METEOR scorer: the jar's resources, read once, and the paraphrase
/// table's records for the words seen so far (read again, for all of
/// them, when a corpus brings new words).
pub struct Meteor {
    data: MeteorData,
    normalizer: Normalizer,
    function_words: HashSet<String>,
    synonyms: Synonyms,
    paraphrases: Paraphrases,
    vocabulary: HashSet<String>,
}

impl Meteor {
    /// Reads the jar's function words, synonyms and non-breaking prefixes.
    pub fn load(data: &MeteorData) -> Result<Meteor> {
        let path = data.dir.join(JAR);
        Meteor::read_jar(data, &mut Archive::open(&path)?)
            .with_context(|| format!("{}: METEOR's resources cannot be read", path.display()))
    }

    fn read_jar(data: &MeteorData, jar: &mut Archive) -> Result<Meteor> {
        let mut text = |name: &str| {
            let bytes = jar.read_all(name)?;
            String::from_utf8(bytes).with_context(|| format!("{name} is not UTF-8 text"))
        };
        let exceptions = "synonym/english.exceptions";
        let synsets = "synonym/english.synsets";
        Ok(Meteor {
            data: data.clone(),
            normalizer: Normalizer::new(&text("nonbreaking/english.prefixes")?),
            function_words: text("function/english.words")?
                .lines()
                .map(str::to_string)
                .collect(),
            synonyms: Synonyms::parse(
                (&text(exceptions)?, exceptions),
                (&text(synsets)?, synsets),
            )?,
            paraphrases: Paraphrases::default(),
            vocabulary: HashSet::new(),
        })
    }

    /// Reads the paraphrase table now for the words of `texts` (each
    /// normalised as a caption is), so that scoring captions made of them
    /// reads it no more: a training run gives its validation references
    /// before its first epoch, and learns of a damaged table then.
    pub fn expect<'t>(&mut self, texts: impl IntoIterator<Item = &'t str>) -> Result<()> {
        let normalised: Vec<String> = texts
            .into_iter()
            .map(|t| self.normalizer.normalize(t))
            .collect();
        self.read_paraphrases_for(normalised.iter().flat_map(|t| words(t)))
    }

    /// Holds the paraphrase table's records for `words` too: where some
    /// are new, the table is read again for every word seen so far.
    fn read_paraphrases_for<'w>(&mut self, words: impl IntoIterator<Item = &'w str>) -> Result<()> {
        let new: HashSet<&str> = words
            .into_iter()
            .filter(|w| !self.vocabulary.contains(*w))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut vocabulary: HashSet<&str> = self.vocabulary.iter().map(String::as_str).collect();
        vocabulary.extend(&new);
        self.paraphrases = Paraphrases::read(&self.data.dir.join(PARAPHRASE_TABLE), &vocabulary)?;
        self.vocabulary.extend(new.into_iter().map(str::to_string));
        Ok(())
    }

    /// METEOR of tokenised captions: each candidate's words joined by
    /// spaces, as pycocoevalcap passes its tokenised captions to the jar.
    pub fn score_tokens<S: AsRef<str>, T: AsRef<[S]>>(
        &mut self,
        candidates: &[T],
        references: &[Vec<T>],
    ) -> Result<MeteorScores> {
        let line = |tokens: &T| {
            let words: Vec<&str> = tokens.as_ref().iter().map(AsRef::as_ref).collect();
            words.join(" ")
        };
        let candidates: Vec<String> = candidates.iter().map(line).collect();
        let references: Vec<Vec<String>> = references
            .iter()
            .map(|r| r.iter().map(line).collect())
            .collect();
        self.score(&candidates, &references)
    }

    /// METEOR of each candidate against its references (captions as
    /// pycocoevalcap passes them: PTB-tokenised words joined by spaces).
    pub fn score(
        &mut self,
        candidates: &[String],
        references: &[Vec<String>],
    ) -> Result<MeteorScores> {
        assert_eq!(
            candidates.len(),
            references.len(),
            "one candidate per image"
        );
        let segments: Vec<(String, Vec<String>)> = candidates
            .par_iter()
            .zip(references)
            .map(|(c, refs)| {
                let (test, refs) = segment_lines(c, refs);
                let refs = refs.iter().map(|r| self.normalizer.normalize(r)).collect();
                (self.normalizer.normalize(&test), refs)
            })
            .collect();
        let lines = || {
            segments
                .iter()
                .flat_map(|(test, refs)| std::iter::once(test).chain(refs))
        };
        let corpus_words: HashSet<&str> = lines().flat_map(|line| words(line)).collect();
        self.read_paraphrases_for(corpus_words.iter().copied())?;
        // What each module knows of a word, once per distinct word.
        let known: HashMap<&str, Word> = corpus_words
            .into_par_iter()
            .map(|w| {
                let word = Word::new(w, &self.function_words, &self.synonyms, &self.paraphrases);
                (w, word)
            })
            .collect();
        let of =
            |line: &str| -> Vec<&Word> { words(line).into_iter().map(|w| &known[w]).collect() };
        let stats: Vec<Stats> = segments
            .par_iter()
            .map(|(test, refs)| {
                let refs: Vec<Vec<&Word>> = refs.iter().map(|r| of(r)).collect();
                best_of(&self.paraphrases, &of(test), &refs)
            })
            .collect();
        let mut corpus = Stats::default();
        for s in &stats {
            corpus.add(s);
        }
        Ok(MeteorScores {
            corpus: corpus.score(),
            segments: stats.iter().map(Stats::score).collect(),
        })
    }
}

/// The statistics against the reference that scores best (the first of
/// equals); a segment without references scores 0.
fn best_of(paraphrases: &Paraphrases, test: &[&Word], references: &[Vec<&Word>]) -> Stats {
    let mut best: Option<(f64, Stats)> = None;
    for reference in references {
        let s = align::align(paraphrases, test, reference);
        let score = s.score();
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, s));
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}
