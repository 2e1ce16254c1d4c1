//! The panels, one struct each with its own state and `ui`, as in
//! egui's demo app: loss curves, metrics over time, the sample gallery,
//! the two per-token views (a chosen reference or sample; a typed
//! caption) and the training controls. What every tab panel reads comes
//! in a [`View`].

mod inspector;
mod losses;
mod marks;
mod metrics;
mod per_token;
mod samples;
mod tokens;
pub mod training;

pub use inspector::InspectorPanel;
pub use per_token::PerTokenPanel;

use super::Tab;
use super::history::History;
use super::scorer::Scorer;
use super::thumbnails::Thumbnails;
use crate::source::embeddings::CaptionData;
use egui::Color32;
use egui_plot::VLine;
use std::collections::HashMap;

const MLE_COLOUR: Color32 = Color32::from_rgb(70, 130, 220);
const SMILE_COLOUR: Color32 = Color32::from_rgb(230, 120, 40);
const THUMBNAIL: f32 = 96.0;

/// What the tab panels read, and the workers they share.
pub struct View<'a> {
    pub data: &'a CaptionData,
    /// The validation images' item indices.
    pub val: &'a [usize],
    /// Item index by image id.
    pub by_id: &'a HashMap<String, usize>,
    pub history: &'a History,
    pub scorer: &'a mut Scorer,
    pub thumbnails: &'a mut Thumbnails,
    /// A run is training or followed.
    pub active: bool,
}

/// A tab's panel.
pub trait Panel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>);
}

/// The tabs' panels and their state.
#[derive(Default)]
pub struct Panels {
    pub losses: losses::LossesPanel,
    pub metrics: metrics::MetricsPanel,
    pub samples: samples::SamplesPanel,
    pub per_token: PerTokenPanel,
    pub inspector: InspectorPanel,
}

impl Panels {
    pub fn get(&mut self, tab: Tab) -> &mut dyn Panel {
        match tab {
            Tab::Losses => &mut self.losses,
            Tab::Metrics => &mut self.metrics,
            Tab::Samples => &mut self.samples,
            Tab::PerToken => &mut self.per_token,
            Tab::Inspector => &mut self.inspector,
        }
    }
}

/// Picks a validation image with a slider and shows it; returns its item index.
fn image_picker(ui: &mut egui::Ui, view: &mut View<'_>, chosen: &mut usize) -> usize {
    let (data, val) = (view.data, view.val);
    *chosen = (*chosen).min(val.len().saturating_sub(1));
    let i = val[*chosen];
    ui.horizontal(|ui| {
        if let Some(t) = view.thumbnails.get(ui.ctx(), i, &data.data.items[i]) {
            ui.add(egui::Image::new(&t).fit_to_exact_size(egui::vec2(THUMBNAIL, THUMBNAIL)));
        }
        ui.vertical(|ui| {
            ui.add(egui::Slider::new(chosen, 0..=val.len() - 1).text("validation image"));
            ui.label(format!("id {}", data.data.items[i].id));
        });
    });
    val[*chosen]
}

/// A grey vertical line at each objective change.
fn switch_lines(plot: &mut egui_plot::PlotUi<'_>, history: &History) {
    for s in history.switches.iter().skip(1) {
        plot.vline(
            VLine::new(format!("switch to {}", s.objective), s.step as f64).color(Color32::GRAY),
        );
    }
}
