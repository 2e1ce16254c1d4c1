//! The loss curves.

use super::{MLE_COLOUR, Panel, SMILE_COLOUR, View, switch_lines};
use crate::app::history::TRAINING_SERIES;
use crate::captioner::objectives::series_groups;
use egui::Color32;
use egui_plot::{Legend, Line, LineStyle, Plot};

/// Every series the objectives logged (MLE and SMILE on the same batches
/// whatever trains, then whatever else an objective reports), objective
/// switches marked; the series an objective groups (rewards, diversity of
/// the samples...: `ObjectiveInfo::plots`) a plot per group below; the
/// trainer's own series (learning rate, gradient norm, throughput) in
/// small plots at the bottom.
#[derive(Default)]
pub struct LossesPanel;

impl Panel for LossesPanel {
    fn ui(&mut self, ui: &mut egui::Ui, view: &mut View<'_>) {
        let (history, running) = (view.history, view.active);
        if history.losses.is_empty() {
            ui.label(if running {
                "No loss yet: the first log line comes after `log_every` steps."
            } else {
                "No run yet. Press Start on the left to train here, or open a run folder: \
                 `captune app --follow runs/NAME` (a folder `captune train` writes)."
            });
        }
        let groups = series_groups();
        let grouped = |n: &str| groups.iter().any(|g| g.series.contains(&n));
        // The objective's loss last, over the terms it often equals.
        let mut names = history.objective_series_names();
        names.retain(|n| !grouped(n));
        names.sort_by_key(|n| n == "loss");
        // The groups of series this run logged, each plotted apart.
        let logged = history.objective_series_names();
        let shown: Vec<_> = groups
            .into_iter()
            .filter(|g| g.series.iter().any(|s| logged.iter().any(|l| l == s)))
            .collect();
        if let Some(last) = history.losses.last() {
            let values: Vec<String> = last
                .objective_series()
                .map(|(k, v)| format!("{} {v:.3}", short_name(k)))
                .collect();
            ui.label(format!(
                "step {}: {}; objective {}, lr {:.2e}, {:.0} tokens/s",
                last.step,
                values.join(", "),
                last.objective,
                last.get("lr"),
                last.get("tokens_per_s")
            ));
        }
        let group_height = if shown.is_empty() { 0.0 } else { 150.0 };
        let plot_height = (ui.available_height() - 140.0 - group_height).max(120.0);
        Plot::new("losses")
            .show_background(false)
            .legend(Legend::default())
            .height(plot_height)
            .x_axis_label("step")
            .y_axis_label("per token (losses) or per caption")
            .show(ui, |plot| {
                for (i, name) in names.iter().enumerate() {
                    let mut line = Line::new(series_label(name), history.log_series(name))
                        .color(series_colour(name, i));
                    // The objective's loss often equals one of its terms (MLE,
                    // or SMILE at lambda 0): dashed, so that both show.
                    if name == "loss" {
                        line = line.style(LineStyle::dashed_loose()).width(2.0);
                    }
                    plot.line(line);
                }
                switch_lines(plot, history);
            });
        if !shown.is_empty() {
            ui.columns(shown.len(), |columns| {
                for (ui, group) in columns.iter_mut().zip(&shown) {
                    ui.label(group.title);
                    Plot::new(format!("series {}", group.title))
                        .show_background(false)
                        .legend(Legend::default())
                        .height(120.0)
                        .show(ui, |plot| {
                            for (i, name) in group.series.iter().enumerate() {
                                let line = Line::new(short_name(name), history.log_series(name))
                                    .color(series_colour(name, i));
                                plot.line(line);
                            }
                            switch_lines(plot, history);
                        });
                }
            });
        }
        ui.columns(TRAINING_SERIES.len(), |columns| {
            for (ui, (key, label)) in columns.iter_mut().zip([
                ("lr", "learning rate"),
                ("grad_norm", "gradient norm"),
                ("tokens_per_s", "tokens/s"),
            ]) {
                ui.label(label);
                Plot::new(format!("training {key}"))
                    .show_background(false)
                    .height(100.0)
                    .show(ui, |plot| {
                        plot.line(Line::new(label, history.log_series(key)))
                    });
            }
        });
    }
}

/// The legend's name of a logged series.
fn series_label(name: &str) -> String {
    match name {
        "mle" | "smile" => format!("{} loss", short_name(name)),
        "loss" => "objective's loss".into(),
        other => short_name(other),
    }
}

/// A logged series' name in the status line.
fn short_name(name: &str) -> String {
    match name {
        "mle" => "MLE".into(),
        "smile" => "SMILE".into(),
        other => other.replace('_', " "),
    }
}

/// MLE and SMILE keep their colours in every panel; other series take
/// the palette's in turn.
fn series_colour(name: &str, index: usize) -> Color32 {
    const PALETTE: [Color32; 6] = [
        Color32::from_rgb(90, 170, 90),
        Color32::from_rgb(160, 90, 200),
        Color32::from_rgb(200, 170, 40),
        Color32::from_rgb(60, 180, 190),
        Color32::from_rgb(200, 80, 80),
        Color32::from_rgb(140, 140, 140),
    ];
    match name {
        "mle" => MLE_COLOUR,
        "smile" => SMILE_COLOUR,
        _ => PALETTE[index % PALETTE.len()],
    }
}
