//! The per-token scores both per-token panels show: loss bars and a
//! table of probabilities and top predictions.

use super::{MLE_COLOUR, SMILE_COLOUR};
use crate::app::scorer::{Asker, Scorer};
use crate::captioner::inspect::{Prediction, TokenScore};
use egui::RichText;
use egui_plot::{Bar, BarChart, Legend, Plot};

fn top(predictions: &[Prediction]) -> String {
    predictions
        .iter()
        .map(|p| format!("{} {:.2}", p.token, p.probability))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The scorer's answer for `asker`: per-token loss bars and the table.
pub fn scores(ui: &mut egui::Ui, scorer: &Scorer, asker: Asker) {
    let Some(answer) = scorer.answer(asker) else {
        ui.label(scorer.model.as_deref().unwrap_or("waiting for the model"));
        return;
    };
    if !scorer.is_current(asker) {
        ui.label(RichText::new("scoring...").weak());
    }
    match &answer.result {
        Err(why) => {
            ui.colored_label(ui.visuals().error_fg_color, why);
        }
        Ok(tokens) => {
            ui.label(format!(
                "total: MLE {:.3}, SMILE {:.3} over {} tokens",
                tokens.iter().map(|t| t.mle_loss).sum::<f32>(),
                tokens.iter().map(|t| t.smile_loss).sum::<f32>(),
                tokens.len()
            ));
            token_bars(ui, tokens);
            token_table(ui, tokens);
        }
    }
}

fn token_bars(ui: &mut egui::Ui, tokens: &[TokenScore]) {
    let labels: Vec<String> = tokens.iter().map(|t| t.token.clone()).collect();
    paired_bars(
        ui,
        "token-bars",
        180.0,
        labels,
        [
            BarChart::new("MLE loss", bars(tokens, |t| t.mle_loss, -0.2)).color(MLE_COLOUR),
            BarChart::new("SMILE loss", bars(tokens, |t| t.smile_loss, 0.2)).color(SMILE_COLOUR),
        ],
    );
}

/// One bar per token of `f`, shifted by `offset` so that two series pair up.
pub(super) fn bars<T>(tokens: &[T], f: impl Fn(&T) -> f32, offset: f64) -> Vec<Bar> {
    tokens
        .iter()
        .enumerate()
        .map(|(k, t)| Bar::new(k as f64 + offset, f(t) as f64).width(0.38))
        .collect()
}

/// Two bar series over a caption's tokens, the tokens on the x axis.
pub(super) fn paired_bars(
    ui: &mut egui::Ui,
    id: &str,
    height: f32,
    labels: Vec<String>,
    charts: [BarChart; 2],
) {
    Plot::new(id)
        .show_background(false)
        .height(height)
        .legend(Legend::default())
        .allow_scroll(false)
        .include_y(0.0)
        .x_axis_formatter(move |mark, _| {
            let k = mark.value.round();
            if (mark.value - k).abs() < 1e-6 && k >= 0.0 {
                labels.get(k as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .show(ui, |plot| {
            for chart in charts {
                plot.bar_chart(chart);
            }
        });
}

fn token_table(ui: &mut egui::Ui, tokens: &[TokenScore]) {
    egui::ScrollArea::both().show(ui, |ui| {
        egui::Grid::new("token-table").striped(true).show(ui, |ui| {
            for h in [
                "token",
                "MLE loss",
                "SMILE loss",
                "p (vocabulary)",
                "p (subset)",
                "top-5 over the vocabulary",
                "top-5 over the subset",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for t in tokens {
                ui.label(&t.token);
                ui.label(RichText::new(format!("{:.3}", t.mle_loss)).color(MLE_COLOUR));
                ui.label(RichText::new(format!("{:.3}", t.smile_loss)).color(SMILE_COLOUR));
                ui.label(format!("{:.3}", t.p_full));
                ui.label(format!("{:.3}", t.p_subset));
                ui.label(top(&t.top5_full));
                ui.label(top(&t.top5_subset));
                ui.end_row();
            }
        });
    });
}
