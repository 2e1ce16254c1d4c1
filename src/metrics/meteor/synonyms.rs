//! METEOR's synonym module's dictionary: WordNet 3.0's synsets by word,
//! its irregular forms, and WordNet's suffix rules for the rest, as the
//! jar ships them (`synonym/english.synsets` and `english.exceptions`).

use anyhow::{Result, bail};
use std::collections::{HashMap, HashSet};

/// WordNet's detachment rules, in its order: a word ending in the suffix
/// may be the base form made by putting the ending in its place (nouns,
/// then verbs, then adjectives).
const RULES: [(&str, &str); 20] = [
    ("s", ""),
    ("ses", "s"),
    ("xes", "x"),
    ("zes", "z"),
    ("ches", "ch"),
    ("shes", "sh"),
    ("men", "man"),
    ("ies", "y"),
    ("s", ""),
    ("ies", "y"),
    ("es", "e"),
    ("es", ""),
    ("ed", "e"),
    ("ed", ""),
    ("ing", "e"),
    ("ing", ""),
    ("er", ""),
    ("est", ""),
    ("er", "e"),
    ("est", "e"),
];

pub struct Synonyms {
    /// Irregular forms' base forms ("geese" -> "goose").
    bases: HashMap<String, Vec<String>>,
    synsets: HashMap<String, Vec<i32>>,
}

/// The lines of a file of two-line records, in pairs. (Lines end at
/// `\n`: Java's reader also ends them at a lone `\r`, which the jar's
/// files do not hold.)
fn records<'a>(text: &'a str, name: &str) -> Result<Vec<(&'a str, &'a str)>> {
    let lines: Vec<&str> = text.lines().collect();
    if !lines.len().is_multiple_of(2) {
        bail!(
            "{name}: {} lines, but its records are pairs of lines: the file is cut short; \
             install METEOR's data (pycocoevalcap) again",
            lines.len()
        );
    }
    Ok(lines.chunks(2).map(|p| (p[0], p[1])).collect())
}

impl Synonyms {
    /// Reads the jar's `english.exceptions` and `english.synsets` (their
    /// text, and their names for errors).
    pub fn parse(exceptions: (&str, &str), synsets: (&str, &str)) -> Result<Synonyms> {
        let mut bases: HashMap<String, Vec<String>> = HashMap::new();
        for (base, forms) in records(exceptions.0, exceptions.1)? {
            for form in forms.split_ascii_whitespace() {
                bases
                    .entry(form.to_string())
                    .or_default()
                    .push(base.to_string());
            }
        }
        let mut sets = HashMap::new();
        for (n, (word, ids)) in records(synsets.0, synsets.1)?.into_iter().enumerate() {
            let ids = ids
                .split_ascii_whitespace()
                .map(|id| {
                    id.parse().map_err(|_| {
                        anyhow::anyhow!(
                            "{}: line {}: synset id {id:?} is not a number",
                            synsets.1,
                            2 * n + 2
                        )
                    })
                })
                .collect::<Result<Vec<i32>>>()?;
            sets.insert(word.to_string(), ids);
        }
        Ok(Synonyms {
            bases,
            synsets: sets,
        })
    }

    fn add_sets(&self, word: &str, out: &mut HashSet<i32>) {
        if let Some(ids) = self.synsets.get(word) {
            out.extend(ids);
        }
    }

    /// The synsets of `word` and of its base form: its listed irregular
    /// bases if it has any, else the first base WordNet's rules give that
    /// has synsets.
    pub fn sets_of(&self, word: &str) -> HashSet<i32> {
        let mut out = HashSet::new();
        self.add_sets(word, &mut out);
        if let Some(bases) = self.bases.get(word) {
            for base in bases {
                self.add_sets(base, &mut out);
            }
        } else if let Some(base) = self.base_form(word) {
            self.add_sets(base.as_ref(), &mut out);
        }
        out
    }

    /// WordNet's `morphword` for a regular form. Words of two UTF-16 units
    /// or fewer, and words in "ss", are their own base.
    fn base_form<'a>(&self, word: &'a str) -> Option<std::borrow::Cow<'a, str>> {
        if word.ends_with("ss") || word.encode_utf16().count() <= 2 {
            return Some(word.into());
        }
        RULES.iter().find_map(|(suffix, ending)| {
            let stem = word.strip_suffix(suffix)?;
            let base = format!("{stem}{ending}");
            self.synsets.contains_key(&base).then_some(base.into())
        })
    }
}
