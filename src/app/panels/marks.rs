//! How the samples panel and the per-token view show a caption's marked
//! words ([`Marker`]): on the shapes world, each fact a caption states in
//! the colour of its verdict; elsewhere, the words no reference uses.

use crate::captioner::word_marks::{Marker, NO_REFERENCE_USES, WordMark};
use crate::shapes::facts::FactMark;
use egui::{Color32, RichText};

/// Words of a caption that no reference of the image uses.
const NOVEL_COLOUR: Color32 = Color32::from_rgb(220, 60, 160);

/// What the marks mean, in their own style.
pub fn legend(ui: &mut egui::Ui, marker: &Marker) {
    if marker.checks_facts() {
        ui.horizontal_wrapped(|ui| {
            ui.label("Facts checked against the scene:");
            for mark in FactMark::ALL {
                ui.label(styled(mark.meaning(), WordMark::Fact(mark)));
            }
        });
    } else {
        ui.label(RichText::new(NO_REFERENCE_USES).color(NOVEL_COLOUR));
    }
}

/// The caption's words, marked.
pub fn show(ui: &mut egui::Ui, marker: &Marker, caption: &str) {
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 4.0;
        for (word, mark) in marker.mark(caption) {
            let word = drawable(&word);
            match mark {
                Some(WordMark::Fact(fact)) => {
                    ui.label(styled(&word, WordMark::Fact(fact)))
                        .on_hover_text(fact.meaning());
                }
                Some(mark) => {
                    ui.label(styled(&word, mark));
                }
                None => {
                    ui.label(word.as_ref());
                }
            }
        }
    });
}

/// `word` with U+FFFD, which egui's fonts cannot draw, as `?`: a BPE
/// captioner's sampled caption holds it where its bytes spell no
/// character, as the tokenizer decodes them.
fn drawable(word: &str) -> std::borrow::Cow<'_, str> {
    if word.contains('\u{FFFD}') {
        word.replace('\u{FFFD}', "?").into()
    } else {
        word.into()
    }
}

/// A fact's words: green when true, blue and underlined when true but in
/// no reference, orange when wrong, red and struck through when the object
/// is not there.
fn styled(text: &str, mark: WordMark) -> RichText {
    let text = RichText::new(text);
    match mark {
        WordMark::Fact(FactMark::True) => text.color(Color32::from_rgb(40, 150, 70)),
        WordMark::Fact(FactMark::NewDetail) => text
            .color(Color32::from_rgb(40, 110, 230))
            .underline()
            .strong(),
        WordMark::Fact(FactMark::Wrong) => text.color(Color32::from_rgb(230, 120, 0)).strong(),
        WordMark::Fact(FactMark::Absent) => text
            .color(Color32::from_rgb(210, 30, 30))
            .strikethrough()
            .strong(),
        WordMark::NoReferenceUses => text.color(NOVEL_COLOUR).strong(),
    }
}
