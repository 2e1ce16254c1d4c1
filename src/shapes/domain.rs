//! The distributions a shapes world is drawn from. The default world is
//! the one everything is trained on; the shifted world moves every
//! frequency a model could have learnt (colours, sizes, the number of
//! objects, the backgrounds, the annotators' mix), so that a model trained
//! on the default world can be evaluated out of domain, as DiscriTune
//! evaluates COCO-trained captioners on other data sets.

use super::scene::{Background, Cell, Colour, Fill, GRID, Object, Scene, Shape, Size};
use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// 1-4 objects; every shape, colour, size and fill equally likely; a
    /// white, gray or black background; 62% concise, 30% medium and 8%
    /// rich captions.
    #[default]
    Default,
    /// 3-6 objects; purple, orange, pink and brown six times as likely as
    /// red, green and blue (yellow twice); 80% small; beige, teal or black
    /// backgrounds (beige and teal unseen in the default world); 30%
    /// concise, 40% medium and 30% rich captions.
    Shifted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    Concise,
    Medium,
    Rich,
}

impl Verbosity {
    pub const ALL: [Verbosity; 3] = [Verbosity::Concise, Verbosity::Medium, Verbosity::Rich];

    /// The share of captions each annotator writes in the default world.
    pub fn share(self) -> f64 {
        match self {
            Verbosity::Concise => 0.62,
            Verbosity::Medium => 0.30,
            Verbosity::Rich => 0.08,
        }
    }
}

fn pick<T: Copy>(rng: &mut impl Rng, items: &[T]) -> T {
    items[rng.random_range(0..items.len())]
}

/// One of `items` with probability proportional to its weight.
fn weighted<T: Copy>(rng: &mut impl Rng, items: &[(T, f64)]) -> T {
    let total: f64 = items.iter().map(|i| i.1).sum();
    let mut u = rng.random::<f64>() * total;
    for &(item, weight) in items {
        if u < weight {
            return item;
        }
        u -= weight;
    }
    items[items.len() - 1].0
}

impl Domain {
    /// A scene: objects in distinct cells, listed in reading order, drawn
    /// from this world's distributions.
    pub fn scene(self, rng: &mut impl Rng) -> Scene {
        let count = self.object_count(rng);
        let mut cells: Vec<Cell> = (0..GRID)
            .flat_map(|row| (0..GRID).map(move |col| Cell { row, col }))
            .collect();
        cells.shuffle(rng);
        let mut cells = cells[..count].to_vec();
        cells.sort_by_key(|c| (c.row, c.col));
        let objects = cells
            .into_iter()
            .map(|cell| Object {
                shape: self.shape(rng),
                colour: self.colour(rng),
                size: self.size(rng),
                fill: self.fill(rng),
                cell,
            })
            .collect();
        Scene {
            background: self.background(rng),
            objects,
        }
    }

    pub fn is_default(&self) -> bool {
        *self == Domain::Default
    }

    /// What a data set of this world is called.
    pub fn data_name(self) -> &'static str {
        match self {
            Domain::Default => "shapes",
            Domain::Shifted => "shapes-shifted",
        }
    }

    pub fn object_count(self, rng: &mut impl Rng) -> usize {
        match self {
            Domain::Default => rng.random_range(1..=4),
            Domain::Shifted => rng.random_range(3..=6),
        }
    }

    pub fn shape(self, rng: &mut impl Rng) -> Shape {
        pick(rng, Shape::ALL)
    }

    pub fn colour(self, rng: &mut impl Rng) -> Colour {
        use Colour::*;
        match self {
            Domain::Default => pick(
                rng,
                &[Red, Green, Blue, Yellow, Purple, Orange, Pink, Brown],
            ),
            Domain::Shifted => weighted(
                rng,
                &[
                    (Red, 1.0),
                    (Green, 1.0),
                    (Blue, 1.0),
                    (Yellow, 2.0),
                    (Purple, 6.0),
                    (Orange, 6.0),
                    (Pink, 6.0),
                    (Brown, 6.0),
                ],
            ),
        }
    }

    pub fn size(self, rng: &mut impl Rng) -> Size {
        match self {
            Domain::Default => pick(rng, &[Size::Small, Size::Big]),
            Domain::Shifted => weighted(rng, &[(Size::Small, 0.8), (Size::Big, 0.2)]),
        }
    }

    pub fn fill(self, rng: &mut impl Rng) -> Fill {
        pick(rng, Fill::ALL)
    }

    pub fn background(self, rng: &mut impl Rng) -> Background {
        use Background::*;
        match self {
            Domain::Default => pick(rng, &[White, Gray, Black]),
            Domain::Shifted => weighted(rng, &[(Beige, 0.4), (Teal, 0.4), (Black, 0.2)]),
        }
    }

    /// The annotator of one reference caption.
    pub fn verbosity(self, rng: &mut impl Rng) -> Verbosity {
        let shares = match self {
            Domain::Default => [0.62, 0.30],
            Domain::Shifted => [0.30, 0.40],
        };
        let u: f64 = rng.random();
        if u < shares[0] {
            Verbosity::Concise
        } else if u < shares[0] + shares[1] {
            Verbosity::Medium
        } else {
            Verbosity::Rich
        }
    }
}
