//! A shapes-world scene: a background and 1-6 objects on a 3x3 grid, each
//! with a shape, colour, size and fill. Scenes are drawn from a seeded RNG
//! per image, so image i of a split never depends on the others.

use serde::{Deserialize, Serialize};

macro_rules! attribute {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word a caption uses by default.
            pub fn word(self) -> &'static str {
                match self { $($name::$variant => $word),+ }
            }
        }
    };
}

attribute!(Shape {
    Circle = "circle",
    Square = "square",
    Triangle = "triangle",
    Star = "star",
    Cross = "cross",
    Diamond = "diamond",
});

attribute!(Colour {
    Red = "red",
    Green = "green",
    Blue = "blue",
    Yellow = "yellow",
    Purple = "purple",
    Orange = "orange",
    Pink = "pink",
    Brown = "brown",
});

attribute!(Size { Small = "small", Big = "big" });

attribute!(Fill {
    Solid = "solid",
    Striped = "striped",
    Outline = "outlined",
});

attribute!(Background {
    White = "white",
    Gray = "gray",
    Black = "black",
    // Only the shifted world draws these (domain.rs).
    Beige = "beige",
    Teal = "teal",
});

/// A grid cell: row 0 is the top, column 0 the left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cell {
    pub row: u8,
    pub col: u8,
}

pub const GRID: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    pub shape: Shape,
    pub colour: Colour,
    pub size: Size,
    pub fill: Fill,
    pub cell: Cell,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scene {
    pub background: Background,
    pub objects: Vec<Object>,
}

impl Scene {}
