//! The sample gallery.

use super::marks;
use super::{Panel, THUMBNAIL, View};
use crate::captioner::word_marks::Marker;
use egui::RichText;

/// The sampled validation images with their greedy caption and samples.
#[derive(Default)]
pub struct SamplesPanel;

impl Panel for SamplesPanel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>) {
        let (data, by_id, history) = (view.data, view.by_id, view.history);
        if history.samples.is_empty() {
            ui.label(
                "No samples yet: they come at the end of each epoch (and every 15 s in a live run).",
            );
            return;
        }
        let mut legend_shown = false;
        egui::ScrollArea::vertical().show(ui, |ui| {
            for s in &history.samples {
                let Some(&i) = by_id.get(&s.image_id) else {
                    continue;
                };
                let marker = Marker::of(&data.data.items[i]);
                if !legend_shown {
                    marks::legend(ui, &marker);
                    legend_shown = true;
                }
                ui.horizontal(|ui| {
                    if let Some(t) = view.thumbnails.get(ui.ctx(), i, &data.data.items[i]) {
                        ui.add(
                            egui::Image::new(&t)
                                .fit_to_exact_size(egui::vec2(THUMBNAIL, THUMBNAIL)),
                        );
                    }
                    ui.vertical(|ui| {
                        ui.label(RichText::new(format!("{} (step {})", s.image_id, s.step)).weak());
                        ui.horizontal(|ui| {
                            ui.label(RichText::new("greedy").strong());
                            marks::show(ui, &marker, &s.caption);
                        });
                        for sample in &s.samples {
                            ui.horizontal(|ui| {
                                ui.label("sample");
                                marks::show(ui, &marker, sample);
                            });
                        }
                    });
                });
                ui.separator();
            }
        });
    }
}
