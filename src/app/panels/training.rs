//! The training controls: the objective and a knob for each setting it
//! declares, the learning rate, batch size and epochs, and the buttons
//! that steer a live run.

use crate::app::live::{Command, LiveStatus, State};
use crate::captioner::objectives;
use crate::captioner::objectives::settings::{SettingKind, SettingValue, Settings};
use crate::captioner::run::RunConfig;

/// The training settings the UI edits.
#[derive(Clone, Debug, PartialEq)]
pub struct Knobs {
    /// The objective's name.
    pub objective: String,
    /// Every objective's settings: switching objective keeps each one's.
    pub settings: Settings,
    pub lr: f32,
    pub batch: usize,
    pub epochs: usize,
    /// The run starts from a checkpoint: choosing an objective sets the
    /// learning rate to its fine-tuning rate (as it does while a run is
    /// live, for a switch).
    pub from_checkpoint: bool,
    /// The config's learning rate, for objectives that declare none.
    pub config_lr: f32,
}

impl Knobs {
    /// The knobs of `config`, for a run that starts from a checkpoint or not.
    pub fn of(config: &RunConfig, from_checkpoint: bool) -> Knobs {
        let t = &config.train;
        let mut settings = t.settings.clone();
        for s in objectives::declared_settings() {
            settings
                .entry(s.key.to_string())
                .or_insert_with(|| s.default_value());
        }
        Knobs {
            objective: t.objective.clone(),
            settings,
            lr: objectives::default_lr(&t.objective, from_checkpoint, t.lr),
            batch: t.batch,
            epochs: t.epochs,
            from_checkpoint,
            config_lr: t.lr,
        }
    }

    /// The objective and its own settings, as a config holds them.
    pub fn objective_settings(&self) -> Settings {
        let info = objectives::find(&self.objective).expect("the knobs hold a known objective");
        info.settings
            .iter()
            .filter_map(|s| Some((s.key.to_string(), self.settings.get(s.key)?.clone())))
            .collect()
    }
}

/// The objective's combo box, then a knob for each of its declared
/// settings: a slider for a number, a combo box for a choice. When the
/// model is being fine-tuned (started from a checkpoint, or a live run
/// switching objective), choosing an objective sets the learning rate to
/// its fine-tuning rate.
fn objective_knobs(ui: &mut egui::Ui, knobs: &mut Knobs, fine_tuning: bool) {
    let before = knobs.objective.clone();
    egui::ComboBox::from_label("objective")
        .selected_text(knobs.objective.as_str())
        .show_ui(ui, |ui| {
            for o in objectives::OBJECTIVES {
                ui.selectable_value(&mut knobs.objective, o.name.to_string(), o.name)
                    .on_hover_text(o.help);
            }
        });
    if knobs.objective != before {
        knobs.lr = objectives::default_lr(&knobs.objective, fine_tuning, knobs.config_lr);
    }
    let Ok(info) = objectives::find(&knobs.objective) else {
        return;
    };
    for setting in info.settings {
        let value = knobs
            .settings
            .entry(setting.key.to_string())
            .or_insert_with(|| setting.default_value());
        match (setting.kind, value) {
            (SettingKind::Number { min, max, .. }, SettingValue::Number(v)) => {
                ui.add(egui::Slider::new(v, min..=max).text(setting.label))
                    .on_hover_text(setting.help);
            }
            (SettingKind::Choice { choices, .. }, SettingValue::Choice(c)) => {
                egui::ComboBox::from_label(setting.label)
                    .selected_text(c.as_str())
                    .show_ui(ui, |ui| {
                        for choice in choices {
                            ui.selectable_value(c, choice.to_string(), *choice);
                        }
                    })
                    .response
                    .on_hover_text(setting.help);
            }
            // The config was checked against the declaration.
            (_, value) => *value = setting.default_value(),
        }
    }
}

/// What the controls ask of the app.
#[derive(Clone, Debug, PartialEq)]
pub enum TrainingAction {
    /// Start a run with the knobs' settings.
    Start,
    /// Send the live run a command.
    Send(Command),
}

/// The knobs and the buttons.
pub struct TrainingPanel {
    pub knobs: Knobs,
}

impl TrainingPanel {
    /// `status`: the live run's, once one was started.
    pub fn ui(&mut self, ui: &mut egui::Ui, status: Option<LiveStatus>) -> Option<TrainingAction> {
        let running = status
            .as_ref()
            .is_some_and(|s| matches!(s.state, State::Starting | State::Running | State::Paused));
        ui.heading("Training");
        let k = &mut self.knobs;
        let fine_tuning = k.from_checkpoint || running;
        objective_knobs(ui, k, fine_tuning);
        ui.add(
            egui::Slider::new(&mut k.lr, 1e-5..=1e-2)
                .logarithmic(true)
                .text("learning rate"),
        );
        ui.add_enabled(
            !running,
            egui::Slider::new(&mut k.batch, 4..=512)
                .logarithmic(true)
                .text("batch"),
        );
        ui.add_enabled(
            !running,
            egui::Slider::new(&mut k.epochs, 1..=50).text("epochs"),
        );
        ui.separator();
        let mut action = None;
        match status {
            Some(s) if running => {
                ui.horizontal(|ui| {
                    if s.state == State::Paused {
                        if ui.button("Resume").clicked() {
                            action = Some(TrainingAction::Send(Command::Resume));
                        }
                    } else if ui.button("Pause").clicked() {
                        action = Some(TrainingAction::Send(Command::Pause));
                    }
                    if ui.button("Stop").clicked() {
                        action = Some(TrainingAction::Send(Command::Stop));
                    }
                    if ui.button("Save checkpoint").clicked() {
                        action = Some(TrainingAction::Send(Command::Save));
                    }
                });
                if ui
                    .button("Apply objective")
                    .on_hover_text(
                        "Train on with the objective, its settings and the learning rate above",
                    )
                    .clicked()
                {
                    action = Some(TrainingAction::Send(Command::Switch {
                        objective: self.knobs.objective.clone(),
                        settings: self.knobs.objective_settings(),
                        lr: self.knobs.lr,
                    }));
                }
                ui.label(format!("step {} of {}", s.step, s.total));
                ui.add(egui::ProgressBar::new(
                    s.step as f32 / s.total.max(1) as f32,
                ));
                ui.label(&s.backend);
                ui.label(&s.note);
            }
            status => {
                if let Some(s) = status {
                    let text = match &s.state {
                        State::Failed(why) => format!("failed: {why}"),
                        other => format!("{other:?} at step {}", s.step),
                    };
                    ui.label(text);
                }
                if ui.button("Start").clicked() {
                    action = Some(TrainingAction::Start);
                }
            }
        }
        action
    }
}
