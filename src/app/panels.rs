//! The panels: loss curves, metrics over time, the sample gallery, and
//! the two per-token views (a chosen reference or sample; a typed caption).

use super::history::{History, TRAINING_SERIES};
use super::scorer::{Asker, Request, Scorer};
use super::thumbnails::Thumbnails;
use super::{InspectorInput, PerTokenChoice};
use crate::captioner::inspect::{Prediction, TokenScore};
use crate::captioner::train::CaptionData;
use crate::data::tokenize::ptb_tokenize;
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Legend, Line, LineStyle, Plot, VLine};
use std::collections::{HashMap, HashSet};

const MLE_COLOUR: Color32 = Color32::from_rgb(70, 130, 220);
const SMILE_COLOUR: Color32 = Color32::from_rgb(230, 120, 40);
/// Words of a generated caption that no reference of the image uses.
const NOVEL_COLOUR: Color32 = Color32::from_rgb(220, 60, 160);
const THUMBNAIL: f32 = 96.0;

/// Every series the objectives logged (MLE and SMILE on the same batches
/// whatever trains, then whatever else an objective reports: reward,
/// baseline, entropy...), objective switches marked; the trainer's own
/// series (learning rate, gradient norm, throughput) in small plots below.
/// `running`: a run is training or followed (else the panel says how to start one).
pub fn losses(ui: &mut egui::Ui, history: &History, running: bool) {
    if history.losses.is_empty() {
        ui.label(if running {
            "No loss yet: the first log line comes after `log_every` steps."
        } else {
            "No run yet. Press Start on the left to train here, or open a run folder: \
             `captune app --follow runs/NAME` (a folder `captune train` writes)."
        });
    }
    // The objective's loss last, over the terms it often equals.
    let mut names = history.objective_series_names();
    names.sort_by_key(|n| n == "loss");
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
    let plot_height = (ui.available_height() - 140.0).max(120.0);
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

/// A grey vertical line at each objective change.
fn switch_lines(plot: &mut egui_plot::PlotUi<'_>, history: &History) {
    for s in history.switches.iter().skip(1) {
        plot.vline(
            VLine::new(format!("switch to {}", s.objective), s.step as f64).color(Color32::GRAY),
        );
    }
}

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

pub fn metrics(ui: &mut egui::Ui, history: &History) {
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

/// The words of `caption`, those absent from every reference highlighted.
fn highlighted(ui: &mut egui::Ui, caption: &str, references: &HashSet<String>) {
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 4.0;
        for word in caption.split_whitespace() {
            let text = RichText::new(word);
            if references.contains(word) {
                ui.label(text);
            } else {
                ui.label(text.color(NOVEL_COLOUR).strong());
            }
        }
    });
}

fn reference_words(data: &CaptionData, i: usize) -> HashSet<String> {
    data.data.items[i]
        .captions
        .iter()
        .flat_map(|c| c.tokens.iter().cloned())
        .collect()
}

/// The sampled validation images with their greedy caption and samples.
pub fn samples(
    ui: &mut egui::Ui,
    data: &CaptionData,
    by_id: &HashMap<String, usize>,
    history: &History,
    thumbnails: &mut Thumbnails,
) {
    if history.samples.is_empty() {
        ui.label(
            "No samples yet: they come at the end of each epoch (and every 15 s in a live run).",
        );
        return;
    }
    ui.label(
        RichText::new("Words that no reference of the image uses are highlighted.")
            .color(NOVEL_COLOUR),
    );
    egui::ScrollArea::vertical().show(ui, |ui| {
        for s in &history.samples {
            let Some(&i) = by_id.get(&s.image_id) else {
                continue;
            };
            let references = reference_words(data, i);
            ui.horizontal(|ui| {
                if let Some(t) = thumbnails.get(ui.ctx(), i, &data.data.items[i]) {
                    ui.add(
                        egui::Image::new(&t).fit_to_exact_size(egui::vec2(THUMBNAIL, THUMBNAIL)),
                    );
                }
                ui.vertical(|ui| {
                    ui.label(RichText::new(format!("{} (step {})", s.image_id, s.step)).weak());
                    ui.horizontal(|ui| {
                        ui.label(RichText::new("greedy").strong());
                        highlighted(ui, &s.caption, &references);
                    });
                    for sample in &s.samples {
                        ui.horizontal(|ui| {
                            ui.label("sample");
                            highlighted(ui, sample, &references);
                        });
                    }
                });
            });
            ui.separator();
        }
    });
}

/// Picks a validation image with a slider and shows it; returns its item index.
fn image_picker(
    ui: &mut egui::Ui,
    data: &CaptionData,
    val: &[usize],
    chosen: &mut usize,
    thumbnails: &mut Thumbnails,
) -> usize {
    *chosen = (*chosen).min(val.len().saturating_sub(1));
    let i = val[*chosen];
    ui.horizontal(|ui| {
        if let Some(t) = thumbnails.get(ui.ctx(), i, &data.data.items[i]) {
            ui.add(egui::Image::new(&t).fit_to_exact_size(egui::vec2(THUMBNAIL, THUMBNAIL)));
        }
        ui.vertical(|ui| {
            ui.add(egui::Slider::new(chosen, 0..=val.len() - 1).text("validation image"));
            ui.label(format!("id {}", data.data.items[i].id));
        });
    });
    val[*chosen]
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

pub fn per_token(
    ui: &mut egui::Ui,
    data: &CaptionData,
    val: &[usize],
    history: &History,
    choice: &mut PerTokenChoice,
    scorer: &mut Scorer,
    thumbnails: &mut Thumbnails,
) {
    let i = image_picker(ui, data, val, &mut choice.image, thumbnails);
    let options = caption_options(data, history, i);
    choice.caption = choice.caption.min(options.len().saturating_sub(1));
    ui.horizontal_wrapped(|ui| {
        for (k, (name, _)) in options.iter().enumerate() {
            ui.selectable_value(&mut choice.caption, k, name);
        }
    });
    let Some((_, caption)) = options.get(choice.caption) else {
        ui.label("This image has no captions.");
        return;
    };
    let references = reference_words(data, i);
    highlighted(ui, &ptb_tokenize(caption).join(" "), &references);
    scorer.ask(Request {
        asker: Asker::PerToken,
        item: i,
        caption: caption.clone(),
    });
    scores(ui, scorer, Asker::PerToken);
}

pub fn inspector(
    ui: &mut egui::Ui,
    data: &CaptionData,
    val: &[usize],
    input: &mut InspectorInput,
    scorer: &mut Scorer,
    thumbnails: &mut Thumbnails,
) {
    let i = image_picker(ui, data, val, &mut input.image, thumbnails);
    ui.collapsing("references", |ui| {
        for c in &data.data.items[i].captions {
            ui.label(&c.raw);
        }
    });
    ui.horizontal(|ui| {
        let label = ui.label("caption:");
        ui.add(
            egui::TextEdit::singleline(&mut input.text)
                .desired_width(f32::INFINITY)
                .hint_text("type a caption for this image"),
        )
        .labelled_by(label.id);
    });
    scorer.ask(Request {
        asker: Asker::Inspector,
        item: i,
        caption: input.text.clone(),
    });
    scores(ui, scorer, Asker::Inspector);
}

fn top(predictions: &[Prediction]) -> String {
    predictions
        .iter()
        .map(|p| format!("{} {:.2}", p.token, p.probability))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The scorer's answer for `asker`: per-token loss bars and the table.
fn scores(ui: &mut egui::Ui, scorer: &Scorer, asker: Asker) {
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
    let bars = |f: fn(&TokenScore) -> f32, offset: f64| -> Vec<Bar> {
        tokens
            .iter()
            .enumerate()
            .map(|(k, t)| Bar::new(k as f64 + offset, f(t) as f64).width(0.38))
            .collect()
    };
    let labels: Vec<String> = tokens.iter().map(|t| t.token.clone()).collect();
    Plot::new("token-bars")
        .show_background(false)
        .height(180.0)
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
            plot.bar_chart(BarChart::new("MLE loss", bars(|t| t.mle_loss, -0.2)).color(MLE_COLOUR));
            plot.bar_chart(
                BarChart::new("SMILE loss", bars(|t| t.smile_loss, 0.2)).color(SMILE_COLOUR),
            );
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
