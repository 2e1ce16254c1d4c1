//! The collapse guard. Fine-tuning a converged captioner at too high a
//! rate can wreck it within a hundred steps (every greedy caption "and
//! and and ..."), and the loss alone does not show it. The guard reads
//! each log line as it is written and looks for three signs:
//!
//! - the captions the objective generated repeat one word: `repetition`,
//!   the mean share of a caption's words taken by its most frequent word,
//!   is at least [`REPETITION`] and [`REPETITION_RISE`] above its first
//!   logged value;
//! - the next-token distribution has no entropy left (below
//!   [`ENTROPY`] nats) while every caption runs to the maximum length,
//!   which the first logged step did not show;
//! - the objective's own reward ([`RewardWatch`]) has fallen far below
//!   its first logged value.
//!
//! Each sign is a change since the first logged step: a barely trained
//! captioner's captions repeat a word from the start, and that is no
//! collapse of this run. The converse is the guard's blind spot: a rate so
//! high that the captions collapse before the first log line (`log_every`
//! steps) shows nothing to compare against.
//!
//! The first logged step that shows a sign is warned about at once; after
//! [`STOP_AFTER`] logged steps in a row the run stops (unless the run
//! says otherwise), keeping its last good checkpoint.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// `repetition` at which captions count as one repeated word.
pub const REPETITION: f64 = 0.5;
/// How far `repetition` must have risen since the first logged step.
pub const REPETITION_RISE: f64 = 0.2;
/// Nats of mean next-token entropy below which sampling is deterministic.
pub const ENTROPY: f64 = 0.05;
/// Logged steps in a row showing a sign before the run stops.
pub const STOP_AFTER: usize = 3;

/// The series an objective raises, and how far below its first logged
/// value counts as a collapse: below start - max(|start| / 2, `min_drop`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RewardWatch {
    pub series: &'static str,
    /// The smallest fall that counts, in the reward's own units (a
    /// log-probability near 0 has no useful "half").
    pub min_drop: f64,
}

/// The mean over captions (of words) of the share of a caption's words
/// taken by its most frequent word; 0 for no captions. Near 1 when the
/// captions are one word repeated, about 0.2 for ordinary captions.
pub fn repetition<S: AsRef<str>>(captions: &[Vec<S>]) -> f64 {
    let shares = captions.iter().filter(|c| !c.is_empty()).map(|c| {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for w in c {
            *counts.entry(w.as_ref()).or_default() += 1;
        }
        *counts.values().max().expect("a word") as f64 / c.len() as f64
    });
    let (sum, n) = shares.fold((0.0, 0), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// What a logged step showed.
#[derive(Clone, Debug, PartialEq)]
pub struct Collapse {
    /// Each sign, as the warning says it.
    pub signs: Vec<String>,
    /// Logged steps in a row with a sign, this one included.
    pub streak: usize,
    /// The step of the streak's first sign.
    pub since: usize,
}

impl Collapse {
    /// Whether the run should stop now.
    pub fn stops(&self) -> bool {
        self.streak >= STOP_AFTER
    }
}

/// Watches a run's log lines for a collapse.
#[derive(Clone, Debug)]
pub struct CollapseGuard {
    reward: Option<RewardWatch>,
    /// Words of a caption that runs to the model's maximum length.
    max_words: usize,
    seen: GuardState,
}

/// What the guard has seen of a run, saved with the run's state so that a
/// resumed run compares with the same first log line and keeps its streak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GuardState {
    /// What the first logged step showed.
    first: Option<First>,
    /// Logged steps in a row with a sign, and the step of its first.
    streak: usize,
    since: usize,
}

/// The first logged step's values, which later ones are compared with.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct First {
    repetition: Option<f64>,
    no_entropy_at_full_length: bool,
    reward: Option<f64>,
}

impl CollapseGuard {
    /// For a run whose objective's reward is watched as `reward` (its
    /// `ObjectiveInfo::reward`; None where it has none or it is not known)
    /// on a model whose captions have at most `max_words`.
    pub fn new(reward: Option<RewardWatch>, max_words: usize) -> Self {
        CollapseGuard {
            reward,
            max_words,
            seen: GuardState::default(),
        }
    }

    /// What it has seen, to save with the run's state.
    pub fn state(&self) -> GuardState {
        self.seen
    }

    /// Goes on from a saved `state`.
    pub fn restore(&mut self, state: GuardState) {
        self.seen = state;
    }

    /// The signs of collapse in the values of the log line of `step`, if
    /// it shows any.
    pub fn observe(&mut self, step: usize, values: &BTreeMap<String, f32>) -> Option<Collapse> {
        let value = |key: &str| values.get(key).map(|&v| v as f64);
        let repetition = value("repetition");
        let entropy = value("entropy");
        let no_entropy_at_full_length = match (entropy, value("sample_length")) {
            (Some(h), Some(length)) => h < ENTROPY && length >= self.max_words as f64 - 1e-3,
            _ => false,
        };
        let reward = self.reward.and_then(|w| value(w.series));
        let first = *self.seen.first.get_or_insert(First {
            repetition,
            no_entropy_at_full_length,
            reward,
        });
        let mut signs = Vec::new();
        if let (Some(r), Some(r0)) = (repetition, first.repetition)
            && r >= REPETITION
            && r >= r0 + REPETITION_RISE
        {
            signs.push(format!(
                "the captions repeat one word (repetition {r:.2}, from {r0:.2} at the first \
                 logged step: the share of a caption's words taken by its most frequent one)"
            ));
        }
        if no_entropy_at_full_length && !first.no_entropy_at_full_length {
            signs.push(format!(
                "the next-token entropy is {:.3} nats with every caption at the maximum length \
                 ({} words)",
                entropy.unwrap_or_default(),
                self.max_words
            ));
        }
        if let (Some(watch), Some(now), Some(start)) = (self.reward, reward, first.reward) {
            let floor = start - (start.abs() / 2.0).max(watch.min_drop);
            if now < floor {
                signs.push(format!(
                    "{} fell from {start:.3} at the first logged step to {now:.3}",
                    watch.series
                ));
            }
        }
        let seen = &mut self.seen;
        if signs.is_empty() {
            seen.streak = 0;
            return None;
        }
        if seen.streak == 0 {
            seen.since = step;
        }
        seen.streak += 1;
        Some(Collapse {
            signs,
            streak: seen.streak,
            since: seen.since,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(pairs: &[(&str, f32)]) -> BTreeMap<String, f32> {
        pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn repetition_is_the_share_of_the_most_frequent_word() {
        let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        // "a" twice in 7 words; "and" 4 times in 4.
        let ordinary = words("a red circle and a blue star");
        assert!((repetition(std::slice::from_ref(&ordinary)) - 2.0 / 7.0).abs() < 1e-12);
        assert_eq!(repetition(&[words("and and and and")]), 1.0);
        let both = repetition(&[ordinary, words("and and and and")]);
        assert!((both - (2.0 / 7.0 + 1.0) / 2.0).abs() < 1e-12);
        assert_eq!(repetition::<String>(&[]), 0.0);
    }

    #[test]
    fn each_sign_is_a_change_since_the_first_logged_step_and_three_in_a_row_stop() {
        let mut g = CollapseGuard::new(None, 31);
        g.reward = Some(RewardWatch {
            series: "reward",
            min_drop: 1.0,
        });
        let first = [("reward", -0.2), ("repetition", 0.2), ("entropy", 1.5)];
        assert_eq!(g.observe(1, &line(&first)), None);
        // A small fall is no sign; below -0.2 - max(0.1, 1) is.
        assert_eq!(g.observe(2, &line(&[("reward", -0.9)])), None);
        let c = g.observe(3, &line(&[("reward", -1.3)])).unwrap();
        assert_eq!(
            (c.signs.len(), c.streak, c.since, c.stops()),
            (1, 1, 3, false)
        );
        assert!(c.signs[0].contains("reward fell from -0.200"), "{c:?}");
        let c = g
            .observe(4, &line(&[("reward", -0.5), ("repetition", 0.97)]))
            .unwrap();
        assert!(
            c.signs[0].contains("repeat one word") && c.streak == 2,
            "{c:?}"
        );
        let full = [("entropy", 0.01), ("sample_length", 31.0)];
        let c = g.observe(5, &line(&full)).unwrap();
        assert!(c.signs[0].contains("entropy") && c.stops(), "{c:?}");
        assert_eq!(c.since, 3, "the streak began at its first sign");
        // A clean line ends the streak; low entropy with short captions is no sign.
        let short = [("entropy", 0.01), ("sample_length", 12.0)];
        assert_eq!(g.observe(6, &line(&short)), None);
        let c = g.observe(7, &line(&[("repetition", 0.6)])).unwrap();
        assert_eq!((c.streak, c.since), (1, 7));
        // Under REPETITION, or not REPETITION_RISE above the start: no sign.
        assert_eq!(g.observe(8, &line(&[("repetition", 0.45)])), None);
        let mut g = CollapseGuard::new(None, 31);
        assert_eq!(g.observe(1, &line(&[("repetition", 0.9)])), None);
        assert_eq!(g.observe(2, &line(&[("repetition", 1.0)])), None);
        // Degenerate from the first logged step: not this run's collapse.
        let mut g = CollapseGuard::new(None, 31);
        assert_eq!(g.observe(1, &line(&full)), None);
        assert_eq!(g.observe(2, &line(&full)), None);
        // Saved and restored (a resumed run), the guard keeps its first
        // line and its streak: the third sign in a row still stops.
        let mut g = CollapseGuard::new(None, 31);
        assert_eq!(g.observe(1, &line(&[("repetition", 0.2)])), None);
        assert!(g.observe(2, &line(&[("repetition", 0.9)])).is_some());
        assert!(g.observe(3, &line(&[("repetition", 0.9)])).is_some());
        let mut resumed = CollapseGuard::new(None, 31);
        resumed.restore(g.state());
        let c = resumed.observe(4, &line(&[("repetition", 0.95)])).unwrap();
        assert_eq!((c.streak, c.since, c.stops()), (3, 2, true));
        // A positive reward counts from half its start, or min_drop.
        let mut g = CollapseGuard::new(None, 31);
        g.reward = Some(RewardWatch {
            series: "cosine",
            min_drop: 0.0,
        });
        assert_eq!(g.observe(1, &line(&[("cosine", 0.6)])), None);
        assert_eq!(g.observe(2, &line(&[("cosine", 0.31)])), None);
        // Exactly half (0.3f32 is half of 0.6f32) is not below it.
        assert_eq!(g.observe(3, &line(&[("cosine", 0.3)])), None);
        assert!(g.observe(4, &line(&[("cosine", 0.29)])).is_some());
    }

    #[test]
    fn each_threshold_sits_where_its_constant_says() {
        let signs = |first: &[(&str, f32)], then: &[(&str, f32)]| {
            let mut g = CollapseGuard::new(None, 31);
            assert_eq!(g.observe(1, &line(first)), None);
            g.observe(2, &line(then)).map_or(0, |c| c.signs.len())
        };
        let calm = [
            ("entropy", 1.0),
            ("sample_length", 31.0),
            ("repetition", 0.25),
        ];
        // Entropy just under and over 0.05 nats, at full length (within
        // 1e-3 words of it, as a mean over captions lands).
        let at = |h: f32, length: f32| [("entropy", h), ("sample_length", length)];
        assert_eq!(signs(&calm, &at(0.049, 31.0)), 1);
        assert_eq!(signs(&calm, &at(0.049, 30.9995)), 1);
        assert_eq!(signs(&calm, &at(0.051, 31.0)), 0);
        assert_eq!(signs(&calm, &at(0.049, 30.99)), 0);
        // Repetition at 0.5 (its floor) and 0.2 above the start.
        assert_eq!(signs(&calm, &[("repetition", 0.5)]), 1);
        assert_eq!(signs(&calm, &[("repetition", 0.49)]), 0);
        assert_eq!(signs(&[("repetition", 0.3)], &[("repetition", 0.51)]), 1);
        assert_eq!(signs(&[("repetition", 0.32)], &[("repetition", 0.51)]), 0);
    }
}
