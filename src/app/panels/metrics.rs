//! Metrics over time: every validation metric a run records, per epoch
//! (and at step 0 for a run started from a checkpoint).

use super::{MLE_COLOUR, Panel, View, switch_lines};
use egui::RichText;
use egui_plot::{Line, Plot, Points};

/// Titles of the metrics the per-epoch validation records, in the order
/// they are shown; a metric not listed comes after them under its key.
const TITLES: [(&str, &str); 24] = [
    ("mean_length", "mean length"),
    ("div1", "Div-1"),
    ("div2", "Div-2"),
    ("mbleu4", "mBLEU-4"),
    ("vocabulary_usage", "vocabulary usage"),
    ("lexical_diversity", "lexical diversity"),
    ("self_retrieval_r1", "self-retrieval R@1"),
    ("self_retrieval_r5", "self-retrieval R@5"),
    ("p1_among_100", "P@1 among 100"),
    ("clipscore", "CLIPScore-style"),
    ("refcompare", "RefCompare"),
    ("CLIP-S", "CLIP-S"),
    ("RefCLIP-S", "RefCLIP-S"),
    ("CIDEr-D", "CIDEr-D"),
    ("BLEU-1", "BLEU-1"),
    ("BLEU-2", "BLEU-2"),
    ("BLEU-3", "BLEU-3"),
    ("BLEU-4", "BLEU-4"),
    ("ROUGE-L", "ROUGE-L"),
    ("METEOR", "METEOR"),
    ("fact_precision", "fact precision"),
    ("fact_recall", "fact recall"),
    ("objects_named", "objects named"),
    ("attributes_per_object", "attributes per object"),
];

/// The metrics `keys` in the order of `TITLES`, each with its title.
fn ordered(keys: &[String]) -> Vec<(String, String)> {
    let rank = |key: &str| {
        TITLES
            .iter()
            .position(|(k, _)| *k == key)
            .unwrap_or(TITLES.len())
    };
    let mut out: Vec<(String, String)> = keys
        .iter()
        .map(|key| {
            let title = TITLES
                .iter()
                .find(|(k, _)| k == key)
                .map_or(key.as_str(), |t| t.1);
            (key.clone(), title.to_string())
        })
        .collect();
    out.sort_by_key(|(key, _)| rank(key));
    out
}

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
                for (k, (key, title)) in ordered(&history.metric_keys).iter().enumerate() {
                    let points = history.metric_series(key);
                    // The newest validation's value: undefined ones (fact
                    // precision of captions stating no fact) show as "–".
                    let newest = history.metrics.last().and_then(|m| m.values.get(key));
                    let shown = newest.map_or("–".into(), |v| format!("{v:.3}"));
                    ui.vertical(|ui| {
                        ui.label(RichText::new(format!("{title}: {shown}")).strong());
                        Plot::new(format!("metric {key}"))
                            .show_background(false)
                            .width(width)
                            .height(150.0)
                            .allow_scroll(false)
                            .show(ui, |plot| {
                                // Markers too: a one-epoch run has one point per
                                // metric, which a line alone does not draw.
                                plot.points(
                                    Points::new(title.as_str(), points.clone())
                                        .radius(3.0)
                                        .color(MLE_COLOUR),
                                );
                                plot.line(Line::new(title.as_str(), points).color(MLE_COLOUR));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_come_in_title_order_and_unknown_ones_last() {
        let keys: Vec<String> = ["my_metric", "fact_precision", "refcompare", "mean_length"]
            .map(String::from)
            .to_vec();
        let titles: Vec<String> = ordered(&keys).into_iter().map(|(_, t)| t).collect();
        assert_eq!(
            titles,
            ["mean length", "RefCompare", "fact precision", "my_metric"]
        );
    }
}
