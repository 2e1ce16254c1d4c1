//! The labelled-fraction setting of Jin, "Self-Supervised Image Captioning
//! with CLIP" (2023)
//! (`[train] labelled`, `--labelled`): only that fraction of the training
//! images keeps its reference captions. Objectives that learn from
//! captions (MLE, SMILE, SCST...) train on the labelled images alone; the
//! ones that learn from images alone (CLIP relevance, DiscriTune) train
//! on the unlabelled rest, and their MLE mix on batches of labelled ones.
//!
//! Which images are labelled depends only on their ids and the fraction,
//! never on the run's seed, so an MLE stage and the relevance stage after
//! it (two runs) agree; and a smaller fraction's images are among a
//! larger one's.

use super::objective::TrainsOn;
use crate::data::Dataset;
use crate::tensorfile::fingerprint;

/// The training images (items of the data set) split by the fraction.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelledSplit {
    /// The fraction asked for, in (0, 1].
    pub fraction: f64,
    /// Items whose captions training may read, in data set order.
    pub labelled: Vec<usize>,
    /// The other training items, in data set order (empty at fraction 1).
    pub unlabelled: Vec<usize>,
}

impl LabelledSplit {
    /// The first `round(fraction * n)` (at least one) of `train_items`
    /// in the order of their ids' fingerprints are labelled.
    pub fn new(data: &Dataset, train_items: &[usize], fraction: f64) -> LabelledSplit {
        let n = train_items.len();
        let keep = if fraction >= 1.0 {
            n
        } else {
            ((fraction * n as f64).round() as usize).clamp(1, n)
        };
        let mut ranked: Vec<(String, usize)> = train_items
            .iter()
            .map(|&i| (fingerprint(data.items[i].id.as_bytes()), i))
            .collect();
        // Ties in the fingerprint (equal ids) fall back on the item.
        ranked.sort();
        let mut labelled: Vec<usize> = ranked[..keep].iter().map(|&(_, i)| i).collect();
        let mut unlabelled: Vec<usize> = ranked[keep..].iter().map(|&(_, i)| i).collect();
        labelled.sort_unstable();
        unlabelled.sort_unstable();
        LabelledSplit {
            fraction,
            labelled,
            unlabelled,
        }
    }

    /// Whether every training image is labelled.
    pub fn is_full(&self) -> bool {
        self.unlabelled.is_empty()
    }

    /// Whether an objective that learns from `trains_on` trains on the
    /// unlabelled images (its batches then carry no captions).
    pub fn trains_unlabelled(&self, trains_on: TrainsOn) -> bool {
        trains_on == TrainsOn::Images && !self.is_full()
    }

    /// The images an objective that learns from `trains_on` trains on.
    pub fn images_for(&self, trains_on: TrainsOn) -> &[usize] {
        if self.trains_unlabelled(trains_on) {
            &self.unlabelled
        } else {
            &self.labelled
        }
    }

    /// `data` with the unlabelled images' captions dropped: what the
    /// vocabulary is built from.
    pub fn captioned(&self, data: &Dataset) -> Dataset {
        let mut captioned = data.clone();
        for &i in &self.unlabelled {
            captioned.items[i].captions.clear();
        }
        captioned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Item, Split};

    fn dataset(n: usize) -> Dataset {
        Dataset {
            name: "ids".into(),
            items: (0..n)
                .map(|i| Item {
                    id: format!("{i}"),
                    split: if i % 10 == 9 {
                        Split::Val
                    } else {
                        Split::Train
                    },
                    image: Default::default(),
                    captions: Vec::new(),
                    extensions: Default::default(),
                })
                .collect(),
            report: Default::default(),
        }
    }

    #[test]
    fn fractions_nest_cover_the_training_images_and_round() {
        let data = dataset(1000);
        let train: Vec<usize> = (0..1000).filter(|i| i % 10 != 9).collect();
        let two = LabelledSplit::new(&data, &train, 0.02);
        let ten = LabelledSplit::new(&data, &train, 0.1);
        let all = LabelledSplit::new(&data, &train, 1.0);
        assert_eq!(two.labelled.len(), 18); // round(0.02 * 900)
        assert_eq!(ten.labelled.len(), 90);
        assert!(two.labelled.iter().all(|i| ten.labelled.contains(i)));
        for split in [&two, &ten] {
            let mut both = [split.labelled.clone(), split.unlabelled.clone()].concat();
            both.sort_unstable();
            assert_eq!(both, train);
        }
        assert!(all.is_full() && all.labelled == train);
        // Not the first items: the order is the ids' fingerprints'.
        assert_ne!(two.labelled, train[..18].to_vec());
        // A tiny fraction keeps one image.
        assert_eq!(LabelledSplit::new(&data, &train, 1e-9).labelled.len(), 1);
    }
}
