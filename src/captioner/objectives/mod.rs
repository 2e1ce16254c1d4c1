//! The objectives, and the registry that knows them by name. Each file
//! holds objectives written against the interface in
//! [`crate::captioner::objective`]:
//!
//! - [`token`]: MLE and the SMILE family (teacher-forced, token-level).
//! - [`sequence`]: SCST, SLL-ME and SLE (REINFORCE on sampled captions).
//! - [`discritune`]: DiscriTune (REINFORCE with the frozen retriever's
//!   discriminative reward).
//! - [`relevance`]: CLIP relevance (Gumbel-softmax captions through the
//!   frozen text tower).
//! - [`reinforce`]: what the REINFORCE objectives share (no objective of
//!   its own).
//!
//! An objective is known by name through [`OBJECTIVES`], with its settings
//! declared there once ([`settings`]); [`build`] makes one from a name and
//! settings. Adding an objective: its file, an entry in `OBJECTIVES` and
//! an arm in `build`.

pub mod discritune;
pub mod reinforce;
pub mod relevance;
pub mod sequence;
pub mod settings;
pub mod token;

use super::mle_mix::MleMix;
use super::objective::{MLE_WEIGHT, Objective, ObjectiveInfo, SeriesGroup};
use crate::backend::Backend;
use anyhow::{Result, bail};
use settings::{Setting, Settings};

/// Every objective's series groups, each once, in the order of `OBJECTIVES`.
pub fn series_groups() -> Vec<&'static SeriesGroup> {
    let mut all: Vec<&'static SeriesGroup> = Vec::new();
    for g in OBJECTIVES.iter().flat_map(|o| o.plots.iter()) {
        if !all.iter().any(|d| d.title == g.title) {
            all.push(g);
        }
    }
    all
}

/// Every objective, by name.
pub const OBJECTIVES: [&ObjectiveInfo; 9] = [
    &token::MLE,
    &token::SMILE,
    &token::SMILE_RANDOM,
    &token::SMILE_REVERSE,
    &sequence::SCST,
    &sequence::SLL_ME,
    &sequence::SLE,
    &discritune::DISCRITUNE,
    &relevance::CLIP_RELEVANCE,
];

/// The objective called `name`.
pub fn find(name: &str) -> Result<&'static ObjectiveInfo> {
    match OBJECTIVES.iter().find(|o| o.name == name) {
        Some(info) => Ok(info),
        None => {
            let names: Vec<&str> = OBJECTIVES.iter().map(|o| o.name).collect();
            bail!(
                "no objective {name:?}; the objectives are {}",
                names.join(", ")
            )
        }
    }
}

/// The peak learning rate of a run of objective `name` when none is
/// given: its fine-tuning rate when the run starts from a checkpoint and
/// the objective declares one, else `config_lr`.
pub fn default_lr(name: &str, from_checkpoint: bool, config_lr: f32) -> f32 {
    let declared = find(name).ok().and_then(|o| o.fine_tune_lr);
    match declared {
        Some(lr) if from_checkpoint => lr,
        _ => config_lr,
    }
}

/// Every setting some objective declares, each key once, in the order
/// of `OBJECTIVES`.
pub fn declared_settings() -> Vec<&'static Setting> {
    let mut all: Vec<&'static Setting> = Vec::new();
    for s in OBJECTIVES.iter().flat_map(|o| o.settings.iter()) {
        if !all.iter().any(|d| d.key == s.key) {
            all.push(s);
        }
    }
    all
}

/// Refuses a key no objective declares and a value its declaration
/// refuses; `origin` names where they came from. Keys of other
/// objectives than the one training are kept, for a switch back.
pub fn check_settings(settings: &Settings, origin: &str) -> Result<()> {
    let declared = declared_settings();
    for (key, value) in settings {
        let Some(setting) = declared.iter().find(|s| s.key == key) else {
            let keys: Vec<&str> = declared.iter().map(|s| s.key).collect();
            bail!(
                "{origin}: unknown key {key:?}; besides the training fields, [train] takes the \
                 objectives' settings: {}",
                keys.join(", ")
            );
        };
        if let Some(why) = setting.refuse(value) {
            bail!("{origin}: {key}: {why}");
        }
    }
    Ok(())
}

/// "name (setting: value, ...)" over the objective's own settings, as
/// the log's `objective` field and the app show it.
pub fn describe(name: &str, settings: &Settings) -> String {
    find(name).map_or_else(|_| name.into(), |info| info.describe(settings))
}

/// `own` mixed with MLE at the `mle_weight` of `settings`, when above 0.
fn mixed<B: Backend>(
    own: Box<dyn Objective<B>>,
    settings: &Settings,
    vocab: usize,
) -> Box<dyn Objective<B>> {
    match MLE_WEIGHT.number(settings) as f32 {
        w if w > 0.0 => {
            let mle = token::TokenLevel::new(token::TokenObjective::mle(), vocab);
            Box::new(MleMix::new(own, Box::new(mle), w))
        }
        _ => own,
    }
}

/// The objective `name` with `settings` (defaults for those not given),
/// for a vocabulary of `vocab` ids.
pub fn build<B: Backend>(
    name: &str,
    settings: &Settings,
    vocab: usize,
) -> Result<Box<dyn Objective<B>>> {
    let info = find(name)?;
    check_settings(settings, &format!("objective {name}"))?;
    let own: Box<dyn Objective<B>> = match info.name {
        // The SMILE family mixes MLE inside its own softmax pass.
        "mle" | "smile" | "smile-random" | "smile-reverse" => {
            return Ok(Box::new(token::TokenLevel::new(
                token::TokenObjective::from_settings(info.name, settings)?,
                vocab,
            )));
        }
        "scst" | "sll-me" | "sle" => Box::new(sequence::SequenceLevel::new(info.name, settings)?),
        "discritune" => Box::new(discritune::DiscriTune::new(settings)),
        "clip-relevance" => Box::new(relevance::ClipRelevance::new(settings)),
        other => unreachable!("objective {other} is listed but not built"),
    };
    Ok(mixed(own, settings, vocab))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_from_a_checkpoint_takes_its_objectives_fine_tuning_rate() {
        let config_lr = 1e-3;
        let scst = find("scst").unwrap().fine_tune_lr.unwrap();
        assert_ne!(scst, config_lr);
        assert_eq!(default_lr("scst", true, config_lr), scst);
        // From fresh weights, or for an objective without one: the config's.
        assert_eq!(default_lr("scst", false, config_lr), config_lr);
        assert_eq!(find("mle").unwrap().fine_tune_lr, None);
        assert_eq!(default_lr("mle", true, config_lr), config_lr);
        assert_eq!(default_lr("no-such-objective", true, config_lr), config_lr);
    }

    #[test]
    fn series_groups_hold_every_objectives_groups_once_in_order() {
        let titles: Vec<&str> = series_groups().iter().map(|g| g.title).collect();
        for o in OBJECTIVES {
            for g in o.plots {
                assert!(titles.contains(&g.title), "{}: {}", o.name, g.title);
            }
        }
        let mut unique = titles.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), titles.len(), "{titles:?}");
        let first = OBJECTIVES.iter().find_map(|o| o.plots.first()).unwrap();
        assert_eq!(titles[0], first.title);
    }
}
