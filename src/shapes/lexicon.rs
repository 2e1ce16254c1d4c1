//! The words of the shapes world, shared by the simulated annotators (which
//! write them) and the fact parser (which reads them back). The first word
//! of each list is the default; the others are synonyms.

use super::scene::{Background, Cell, Colour, Fill, Shape, Size};

pub fn shape_words(s: Shape) -> &'static [&'static str] {
    match s {
        Shape::Circle => &["circle"],
        Shape::Square => &["square", "box"],
        Shape::Triangle => &["triangle"],
        Shape::Star => &["star"],
        Shape::Cross => &["cross", "plus"],
        Shape::Diamond => &["diamond", "rhombus"],
    }
}

pub fn plural(noun: &str) -> String {
    if noun.ends_with('s') || noun.ends_with('x') {
        format!("{noun}es")
    } else {
        format!("{noun}s")
    }
}

pub fn size_words(s: Size) -> &'static [&'static str] {
    match s {
        Size::Small => &["small", "little", "tiny"],
        Size::Big => &["big", "large"],
    }
}

pub fn fill_words(f: Fill) -> &'static [&'static str] {
    match f {
        Fill::Solid => &["solid", "filled"],
        Fill::Striped => &["striped", "stripy"],
        Fill::Outline => &["outlined", "hollow"],
    }
}

pub fn background_words(b: Background) -> &'static [&'static str] {
    match b {
        Background::White => &["white"],
        Background::Gray => &["gray", "grey"],
        Background::Black => &["black"],
        Background::Beige => &["beige"],
        Background::Teal => &["teal"],
    }
}

/// Nouns for "an object" of no stated shape.
pub const GENERIC_NOUNS: &[&str] = &["shape", "object", "thing", "figure"];

pub const NUMBERS: &[&str] = &["zero", "one", "two", "three", "four", "five", "six"];

/// Where a cell is, as the annotators say it ("in the top left corner").
pub fn cell_phrase(cell: Cell) -> &'static str {
    match (cell.row, cell.col) {
        (0, 0) => "in the top left corner",
        (0, 1) => "at the top",
        (0, 2) => "in the top right corner",
        (1, 0) => "on the left",
        (1, 1) => "in the middle",
        (1, 2) => "on the right",
        (2, 0) => "in the bottom left corner",
        (2, 1) => "at the bottom",
        _ => "in the bottom right corner",
    }
}

/// How a position word constrains the cell: a row, a column or both.
pub enum RegionWord {
    Row(u8),
    Col(u8),
    Centre,
}

pub fn region_word(word: &str) -> Option<RegionWord> {
    Some(match word {
        "top" | "upper" => RegionWord::Row(0),
        "bottom" | "lower" => RegionWord::Row(2),
        "left" => RegionWord::Col(0),
        "right" => RegionWord::Col(2),
        "middle" | "centre" | "center" => RegionWord::Centre,
        _ => return None,
    })
}

fn lookup<T: Copy>(
    all: &[T],
    words: impl Fn(T) -> &'static [&'static str],
    word: &str,
) -> Option<T> {
    all.iter().copied().find(|&v| words(v).contains(&word))
}

pub fn parse_colour(word: &str) -> Option<Colour> {
    Colour::ALL.iter().copied().find(|c| c.word() == word)
}

pub fn parse_size(word: &str) -> Option<Size> {
    lookup(Size::ALL, size_words, word)
}

pub fn parse_fill(word: &str) -> Option<Fill> {
    lookup(Fill::ALL, fill_words, word)
}

pub fn parse_background(word: &str) -> Option<Background> {
    lookup(Background::ALL, background_words, word)
}

/// A shape noun, singular or plural: (shape, plural).
pub fn parse_shape(word: &str) -> Option<(Shape, bool)> {
    Shape::ALL.iter().find_map(|&s| {
        shape_words(s).iter().find_map(|&w| {
            if w == word {
                Some((s, false))
            } else if plural(w) == word {
                Some((s, true))
            } else {
                None
            }
        })
    })
}

/// A generic noun ("shape", "objects"): whether it is plural.
pub fn parse_generic(word: &str) -> Option<bool> {
    GENERIC_NOUNS.iter().find_map(|&w| {
        if w == word {
            Some(false)
        } else if plural(w) == word {
            Some(true)
        } else {
            None
        }
    })
}

pub fn parse_number(word: &str) -> Option<u8> {
    match word {
        "single" => Some(1),
        _ => NUMBERS.iter().position(|&w| w == word).map(|n| n as u8),
    }
}
