//! The inspector: any caption typed for a validation image, scored per
//! token as it is typed.

use super::tokens::scores;
use super::{Panel, View, image_picker};
use crate::app::scorer::{Asker, Request};

/// The image and the caption typed for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InspectorPanel {
    /// Index into the validation images.
    pub image: usize,
    pub text: String,
}

impl Panel for InspectorPanel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>) {
        let i = image_picker(ui, view, &mut self.image);
        let data = view.data;
        ui.collapsing("references", |ui| {
            for c in &data.data.items[i].captions {
                ui.label(&c.raw);
            }
        });
        ui.horizontal(|ui| {
            let label = ui.label("caption:");
            ui.add(
                egui::TextEdit::singleline(&mut self.text)
                    .desired_width(f32::INFINITY)
                    .hint_text("type a caption for this image"),
            )
            .labelled_by(label.id);
        });
        view.scorer.ask(Request {
            asker: Asker::Inspector,
            explain_under: None,
            item: i,
            caption: self.text.clone(),
        });
        scores(ui, view.scorer, Asker::Inspector);
    }
}
