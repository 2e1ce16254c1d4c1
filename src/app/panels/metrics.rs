//! Metrics over time: every validation metric per epoch.

use super::{MLE_COLOUR, Panel, View, switch_lines};
use egui::RichText;
use egui_plot::{Line, Plot};

/// Every metric the per-epoch validation records, one small plot each.
const METRICS: [(&str, &str); 10] = [
    ("mean_length", "mean length"),
    ("div1", "Div-1"),
    ("div2", "Div-2"),
    ("mbleu4", "mBLEU-4"),
    ("vocabulary_usage", "vocabulary usage"),
    ("self_retrieval_r1", "self-retrieval R@1"),
    ("CIDEr-D", "CIDEr-D"),
    ("fact_precision", "fact precision"),
    ("fact_recall", "fact recall"),
    ("BLEU-4", "BLEU-4"),
];

/// One small plot per metric, objective switches marked.
#[derive(Default)]
pub struct MetricsPanel;

impl Panel for MetricsPanel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>) {
        let history = view.history;
        if history.metrics.is_empty() {
            ui.label("No validation metrics yet: they come at the end of each epoch.");
        }
        let columns = 3;
        let width = (ui.available_width() / columns as f32 - 12.0).max(120.0);
        egui::ScrollArea::vertical().show(ui, |ui| {
            egui::Grid::new("metric-grid").show(ui, |ui| {
                for (k, (key, title)) in METRICS.iter().enumerate() {
                    let points = history.metric_series(key);
                    ui.vertical(|ui| {
                        let last = points.last().map_or("-".into(), |p| format!("{:.3}", p[1]));
                        ui.label(RichText::new(format!("{title}: {last}")).strong());
                        Plot::new(format!("metric {key}"))
                            .show_background(false)
                            .width(width)
                            .height(150.0)
                            .allow_scroll(false)
                            .show(ui, |plot| {
                                plot.line(Line::new(*title, points).color(MLE_COLOUR));
                                switch_lines(plot, history);
                            });
                    });
                    if k % columns == columns - 1 {
                        ui.end_row();
                    }
                }
            });
        });
    }
}
