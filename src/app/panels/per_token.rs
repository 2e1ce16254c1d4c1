//! The per-token view of a chosen caption: a reference of a validation
//! image, or its newest greedy caption or sample.

use super::marks;
use super::tokens::{bars, paired_bars, scores};
use super::{Panel, View, image_picker};
use crate::app::history::History;
use crate::app::scorer::{Asker, Request};
use crate::captioner::explain::{Explanation, TokenTerm};
use crate::captioner::objectives::OBJECTIVES;
use crate::captioner::word_marks::Marker;
use crate::source::embeddings::CaptionData;
use egui::RichText;
use egui_plot::BarChart;

/// The image and caption shown: a validation image and one of its
/// captions (references first, then the newest samples).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerTokenPanel {
    /// Index into the validation images.
    pub image: usize,
    pub caption: usize,
    /// The objective that explains the caption beside the losses, if any.
    pub explain_under: Option<&'static str>,
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
        let marker = Marker::of(&data.data.items[i]);
        marks::legend(ui, &marker);
        marks::show(ui, &marker, caption);
        ui.horizontal(|ui| {
            ui.label("rewarded as the image's caption under:");
            ui.selectable_value(&mut self.explain_under, None, "none");
            for info in OBJECTIVES.iter().filter(|o| o.explains) {
                ui.selectable_value(&mut self.explain_under, Some(info.name), info.name);
            }
        });
        view.scorer.ask(Request {
            asker: Asker::PerToken,
            item: i,
            caption: caption.clone(),
            explain_under: self.explain_under,
        });
        if let Some(answer) = view.scorer.answer(Asker::PerToken) {
            match &answer.explained {
                Some(Ok(e)) => explanation_view(ui, e),
                Some(Err(why)) => {
                    ui.colored_label(ui.visuals().error_fg_color, why);
                }
                None => {}
            }
        }
        scores(ui, view.scorer, Asker::PerToken);
    }
}

/// A caption's reward, baseline and advantage, what they were measured
/// against, and each token's term of the loss as bars (negative: the
/// token is pushed up).
fn explanation_view(ui: &mut egui::Ui, e: &Explanation) {
    let figures = if e.figures.0.is_empty() {
        String::new()
    } else {
        format!(", {}", e.figures)
    };
    ui.label(format!(
        "{}: reward {:.3} ({}), baseline {:.3}, advantage {:+.3}{figures}",
        e.objective, e.reward, e.reward_is, e.baseline, e.advantage
    ));
    for c in &e.compared_with {
        let line = format!("{} ({}): {}", c.kind, c.figures, c.what);
        ui.label(RichText::new(line).weak());
    }
    let labels: Vec<String> = e.tokens.iter().map(|t| t.token.clone()).collect();
    let terms = |f: fn(&TokenTerm) -> f32, offset| bars(&e.tokens, f, offset);
    paired_bars(
        ui,
        "reward-bars",
        140.0,
        labels,
        [
            BarChart::new("-advantage x log p", terms(|t| t.likelihood_term, -0.2)),
            BarChart::new("entropy bonus", terms(|t| t.entropy_term, 0.2)),
        ],
    );
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
