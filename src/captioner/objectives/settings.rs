//! An objective's settings, declared once where the objective is written
//! (`Setting`) and read from that one declaration by the run config's
//! `[train]` table (the key), the command line (`--key-in-kebab-case`,
//! `captune train --help` shows the help) and the app's knobs (a slider
//! or a choice).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One setting of an objective.
#[derive(Debug)]
pub struct Setting {
    /// The `[train]` key; the flag is the key with `-` for `_`.
    pub key: &'static str,
    /// What the app's knob says.
    pub label: &'static str,
    pub help: &'static str,
    pub kind: SettingKind,
}

#[derive(Clone, Copy, Debug)]
pub enum SettingKind {
    /// A number in `[min, max]`.
    Number { min: f64, max: f64, default: f64 },
    /// One of `choices`.
    Choice {
        choices: &'static [&'static str],
        default: &'static str,
    },
}

/// A setting's value as the config holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SettingValue {
    Number(f64),
    Choice(String),
}

/// Settings by key.
pub type Settings = BTreeMap<String, SettingValue>;

impl Setting {
    pub fn default_value(&self) -> SettingValue {
        match self.kind {
            SettingKind::Number { default, .. } => SettingValue::Number(default),
            SettingKind::Choice { default, .. } => SettingValue::Choice(default.into()),
        }
    }

    /// The command-line flag, without its dashes.
    pub fn flag(&self) -> String {
        self.key.replace('_', "-")
    }

    /// Why `value` is not one this setting takes, if it is not.
    pub fn refuse(&self, value: &SettingValue) -> Option<String> {
        match (self.kind, value) {
            (SettingKind::Number { min, max, .. }, SettingValue::Number(v)) => {
                (!(min..=max).contains(v)).then(|| format!("{v} is outside [{min}, {max}]"))
            }
            (SettingKind::Choice { choices, .. }, SettingValue::Choice(c)) => (!choices
                .contains(&c.as_str()))
            .then(|| format!("{c:?} is not one of {}", choices.join(", "))),
            (SettingKind::Number { .. }, other) => Some(format!("{other:?} is not a number")),
            (SettingKind::Choice { choices, .. }, other) => {
                Some(format!("{other:?} is not one of {}", choices.join(", ")))
            }
        }
    }

    /// A value from command-line text, checked.
    pub fn parse(&self, text: &str) -> Result<SettingValue, String> {
        let value = match self.kind {
            SettingKind::Number { .. } => SettingValue::Number(
                text.parse()
                    .map_err(|_| format!("--{}: {text:?} is not a number", self.flag()))?,
            ),
            SettingKind::Choice { .. } => SettingValue::Choice(text.into()),
        };
        match self.refuse(&value) {
            Some(why) => Err(format!("--{}: {why}", self.flag())),
            None => Ok(value),
        }
    }

    /// Its value in `settings` as a number, or its default.
    pub fn number(&self, settings: &Settings) -> f64 {
        match (settings.get(self.key), self.kind) {
            (Some(SettingValue::Number(v)), _) => *v,
            (_, SettingKind::Number { default, .. }) => default,
            (_, SettingKind::Choice { .. }) => f64::NAN,
        }
    }

    /// Its value in `settings` as a choice, or its default.
    pub fn choice<'s>(&self, settings: &'s Settings) -> &'s str {
        match (settings.get(self.key), self.kind) {
            (Some(SettingValue::Choice(c)), _) => c,
            (_, SettingKind::Choice { default, .. }) => default,
            (_, SettingKind::Number { .. }) => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: Setting = Setting {
        key: "mle_weight",
        label: "MLE weight",
        help: "",
        kind: SettingKind::Number {
            min: 0.0,
            max: 1.0,
            default: 0.25,
        },
    };
    const SIDE: Setting = Setting {
        key: "first_token",
        label: "first token",
        help: "",
        kind: SettingKind::Choice {
            choices: &["mle", "none"],
            default: "mle",
        },
    };

    #[test]
    fn values_are_parsed_checked_and_read_back_with_their_defaults() {
        assert_eq!(RATE.flag(), "mle-weight");
        assert_eq!(RATE.parse("0.5"), Ok(SettingValue::Number(0.5)));
        // The bounds are inside the range.
        assert_eq!(RATE.parse("1"), Ok(SettingValue::Number(1.0)));
        assert_eq!(
            RATE.parse("1.5"),
            Err("--mle-weight: 1.5 is outside [0, 1]".to_string())
        );
        assert_eq!(
            RATE.parse("lots"),
            Err("--mle-weight: \"lots\" is not a number".to_string())
        );
        assert_eq!(SIDE.parse("none"), Ok(SettingValue::Choice("none".into())));
        assert_eq!(
            SIDE.parse("last"),
            Err("--first-token: \"last\" is not one of mle, none".to_string())
        );
        assert_eq!(
            RATE.refuse(&SettingValue::Choice("mle".into())),
            Some("Choice(\"mle\") is not a number".to_string())
        );
        assert_eq!(
            SIDE.refuse(&SettingValue::Number(1.0)),
            Some("Number(1.0) is not one of mle, none".to_string())
        );

        let mut settings = Settings::new();
        assert_eq!(RATE.number(&settings), 0.25);
        assert_eq!(SIDE.choice(&settings), "mle");
        assert_eq!(RATE.default_value(), SettingValue::Number(0.25));
        assert_eq!(SIDE.default_value(), SettingValue::Choice("mle".into()));
        settings.insert("mle_weight".into(), SettingValue::Number(0.75));
        settings.insert("first_token".into(), SettingValue::Choice("none".into()));
        assert_eq!(RATE.number(&settings), 0.75);
        assert_eq!(SIDE.choice(&settings), "none");
        // Asked as the other kind: no value.
        assert!(SIDE.number(&settings).is_nan());
        assert_eq!(RATE.choice(&settings), "");
    }
}
