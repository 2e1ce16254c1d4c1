//! The per-token view of a chosen caption: a reference of a validation
//! image, or its newest greedy caption or sample.

use super::tokens::scores;
use super::{Panel, View, highlighted, image_picker, reference_words};
use crate::app::history::History;
use crate::app::scorer::{Asker, Request};
use crate::captioner::train::CaptionData;
use crate::data::tokenize::ptb_tokenize;

/// The image and caption shown: a validation image and one of its
/// captions (references first, then the newest samples).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerTokenPanel {
    /// Index into the validation images.
    pub image: usize,
    pub caption: usize,
}

impl Panel for PerTokenPanel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>) {
        let i = image_picker(ui, view, &mut self.image);
        let (data, history) = (view.data, view.history);
        let options = caption_options(data, history, i);
        self.caption = self.caption.min(options.len().saturating_sub(1));
        ui.horizontal_wrapped(|ui| {
            for (k, (name, _)) in options.iter().enumerate() {
                ui.selectable_value(&mut self.caption, k, name);
            }
        });
        let Some((_, caption)) = options.get(self.caption) else {
            ui.label("This image has no captions.");
            return;
        };
        let references = reference_words(data, i);
        highlighted(ui, &ptb_tokenize(caption).join(" "), &references);
        view.scorer.ask(Request {
            asker: Asker::PerToken,
            item: i,
            caption: caption.clone(),
        });
        scores(ui, view.scorer, Asker::PerToken);
    }
}

/// The captions the per-token view offers for item `i`: its references,
/// then the newest greedy caption and samples when the run sampled it.
fn caption_options(data: &CaptionData, history: &History, i: usize) -> Vec<(String, String)> {
    let item = &data.data.items[i];
    let mut options: Vec<(String, String)> = item
        .captions
        .iter()
        .enumerate()
        .map(|(k, c)| (format!("reference {}", k + 1), c.raw.clone()))
        .collect();
    if let Some(s) = history.samples.iter().find(|s| s.image_id == item.id) {
        options.push(("greedy".into(), s.caption.clone()));
        for (k, sample) in s.samples.iter().enumerate() {
            options.push((format!("sample {}", k + 1), sample.clone()));
        }
    }
    options
}
