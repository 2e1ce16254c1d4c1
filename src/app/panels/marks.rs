//! How the samples panel and the per-token view mark a caption's words.
//! On the shapes world, where every image's scene is known, each word that
//! states a fact is marked by the fact checker behind fact precision and
//! recall (true as a reference says, a true detail no reference states, a
//! wrong attribute, an object that is not there). On other data sets no
//! fact can be checked, and the words no reference of the image uses are
//! highlighted instead, labelled as such.

use crate::data::Item;
use crate::shapes::{self, facts, facts::FactMark, scene::Scene};
use egui::{Color32, RichText};
use std::collections::HashSet;

/// Words of a caption that no reference of the image uses.
const NOVEL_COLOUR: Color32 = Color32::from_rgb(220, 60, 160);

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

    /// What the marks mean, in their own style.
    pub fn legend(&self, ui: &mut egui::Ui) {
        match self {
            Marker::Facts { .. } => {
                ui.horizontal_wrapped(|ui| {
                    ui.label("Facts checked against the scene:");
                    for mark in FactMark::ALL {
                        ui.label(styled(mark.meaning(), mark));
                    }
                });
            }
            Marker::ReferenceWords(_) => {
                ui.label(
                    RichText::new(
                        "Words that no reference of the image uses are highlighted (this data \
                         set has no scene to check facts against).",
                    )
                    .color(NOVEL_COLOUR),
                );
            }
        }
    }

    /// The caption's words, marked.
    pub fn show(&self, ui: &mut egui::Ui, caption: &str) {
        ui.horizontal_wrapped(|ui| {
            ui.spacing_mut().item_spacing.x = 4.0;
            match self {
                Marker::Facts { scene, references } => {
                    for (word, mark) in facts::mark(caption, scene, references) {
                        match mark {
                            Some(mark) => ui.label(styled(&word, mark)).on_hover_text(mark.meaning()),
                            None => ui.label(word),
                        };
                    }
                }
                Marker::ReferenceWords(references) => {
                    for word in caption.split_whitespace() {
                        let text = RichText::new(word);
                        if references.contains(word) {
                            ui.label(text);
                        } else {
                            ui.label(text.color(NOVEL_COLOUR).strong());
                        }
                    }
                }
            }
        });
    }
}

/// A fact's words: green when true, blue and underlined when true but in
/// no reference, orange when wrong, red and struck through when the object
/// is not there.
fn styled(text: &str, mark: FactMark) -> RichText {
    let text = RichText::new(text);
    match mark {
        FactMark::True => text.color(Color32::from_rgb(40, 150, 70)),
        FactMark::NewDetail => text.color(Color32::from_rgb(40, 110, 230)).underline().strong(),
        FactMark::Wrong => text.color(Color32::from_rgb(230, 120, 0)).strong(),
        FactMark::Absent => text.color(Color32::from_rgb(210, 30, 30)).strikethrough().strong(),
    }
}
