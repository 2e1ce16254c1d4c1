//! Which words of a caption to mark, for the app and the report. On the
//! shapes world, where every image's scene is known, each word that states
//! a fact gets the fact checker's mark (the checker behind fact precision
//! and recall). Elsewhere no fact can be checked, and the words no
//! reference of the image uses are marked instead.

use crate::data::Item;
use crate::data::tokenize::ptb_tokenize;
use crate::shapes::facts::{self, FactMark};
use crate::shapes::{self, scene::Scene};
use std::collections::HashSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordMark {
    Fact(FactMark),
    /// No reference of the image uses the word (data without scenes).
    NoReferenceUses,
}

/// How one image's captions are marked.
pub enum Marker {
    Facts {
        scene: Scene,
        references: Vec<String>,
    },
    ReferenceWords(HashSet<String>),
}

impl Marker {
    pub fn of(item: &Item) -> Marker {
        match shapes::scene(item) {
            Some(scene) => Marker::Facts {
                scene,
                references: item.captions.iter().map(|c| c.raw.clone()).collect(),
            },
            None => Marker::ReferenceWords(
                item.captions
                    .iter()
                    .flat_map(|c| c.tokens.iter().cloned())
                    .collect(),
            ),
        }
    }

    pub fn checks_facts(&self) -> bool {
        matches!(self, Marker::Facts { .. })
    }

    /// The caption's PTB tokens, each with its mark, if any.
    pub fn mark(&self, caption: &str) -> Vec<(String, Option<WordMark>)> {
        match self {
            Marker::Facts { scene, references } => facts::mark(caption, scene, references)
                .into_iter()
                .map(|(w, m)| (w, m.map(WordMark::Fact)))
                .collect(),
            Marker::ReferenceWords(references) => ptb_tokenize(caption)
                .into_iter()
                .map(|w| {
                    let mark = (!references.contains(&w)).then_some(WordMark::NoReferenceUses);
                    (w, mark)
                })
                .collect(),
        }
    }
}

/// What the marks mean where no fact can be checked.
pub const NO_REFERENCE_USES: &str = "Words that no reference of the image uses are highlighted (this data set has no scene to \
     check facts against).";
