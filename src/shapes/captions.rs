//! Simulated annotators. Each reference caption comes from one of three
//! verbosities, drawn per caption:
//! - concise (62%): one or two objects, colour and shape plus at most one
//!   more attribute each, about 3-8 words;
//! - medium (30%): every object with one or two more attributes, sometimes
//!   the count or the background;
//! - rich (8%, so rare): the count, every attribute of every object, the
//!   background, positions and a spatial relation, 15 words or more.
//!
//! Templates and synonyms vary within each, so several correct captions
//! exist for one image, they differ in detail, and their syntax differs.

use super::domain::{Domain, Verbosity};
use super::lexicon::{self, cell_phrase};
use super::scene::{Object, Scene};
use rand::Rng;

fn pick<'a>(rng: &mut impl Rng, words: &[&'a str]) -> &'a str {
    words[rng.random_range(0..words.len())]
}

fn article(next: &str) -> &'static str {
    if next.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Which attributes a noun phrase states besides colour and shape.
#[derive(Clone, Copy)]
struct Detail {
    size: bool,
    fill: bool,
}

/// "a big striped red circle" (size, fill, colour, shape: English order).
fn noun_phrase(rng: &mut impl Rng, o: &Object, detail: Detail) -> String {
    let mut words = Vec::new();
    if detail.size {
        words.push(pick(rng, lexicon::size_words(o.size)));
    }
    if detail.fill {
        words.push(pick(rng, lexicon::fill_words(o.fill)));
    }
    words.push(o.colour.word());
    words.push(pick(rng, lexicon::shape_words(o.shape)));
    let body = words.join(" ");
    format!("{} {body}", article(&body))
}

/// "a red circle and a blue star and a green square". With commas between
/// the items ("a red circle, a blue star ..."), the tokenizer would drop
/// them and leave "a" as the word that goes on with a list: a word every
/// reference contains, which reverse subsetting can never penalise.
fn join_list(items: &[String]) -> String {
    items.join(" and ")
}

fn background(rng: &mut impl Rng, scene: &Scene) -> String {
    let word = pick(rng, lexicon::background_words(scene.background));
    let prep = pick(rng, &["on", "against"]);
    format!("{prep} a {word} background")
}

fn concise(rng: &mut impl Rng, scene: &Scene) -> String {
    let n = scene.objects.len();
    let mentioned = if n == 1 { 1 } else { 2 };
    let mut order: Vec<usize> = (0..n).collect();
    rand::seq::SliceRandom::shuffle(order.as_mut_slice(), rng);
    // A lone object gets its size and often its fill; of two, each gets
    // about one attribute besides colour and shape.
    let mut detail = || {
        if mentioned == 1 {
            Detail {
                size: rng.random_bool(0.8),
                fill: rng.random_bool(0.6),
            }
        } else {
            match rng.random_range(0..8) {
                0..=4 => Detail {
                    size: true,
                    fill: false,
                },
                5 => Detail {
                    size: true,
                    fill: true,
                },
                6 => Detail {
                    size: false,
                    fill: true,
                },
                _ => Detail {
                    size: false,
                    fill: false,
                },
            }
        }
    };
    let details: Vec<Detail> = (0..mentioned).map(|_| detail()).collect();
    let phrases: Vec<String> = order[..mentioned]
        .iter()
        .zip(details)
        .map(|(&i, d)| noun_phrase(rng, &scene.objects[i], d))
        .collect();
    match phrases.as_slice() {
        [a] => match rng.random_range(0..4) {
            0 => a.clone(),
            1 => format!("there is {a}"),
            2 => format!("{a} {}", background(rng, scene)),
            _ => format!("{a} {}", cell_phrase(scene.objects[order[0]].cell)),
        },
        [a, b] => match rng.random_range(0..3) {
            0 => format!("{a} and {b}"),
            1 => format!("{a} with {b}"),
            _ => format!("{a} next to {b}"),
        },
        _ => unreachable!("concise captions mention one or two objects"),
    }
}

fn count_phrase(n: usize) -> String {
    let noun = if n == 1 { "shape" } else { "shapes" };
    format!("{} {noun}", lexicon::NUMBERS[n])
}

fn medium(rng: &mut impl Rng, scene: &Scene) -> String {
    let phrases: Vec<String> = scene
        .objects
        .iter()
        .map(|o| {
            let detail = match rng.random_range(0..3) {
                0 => Detail {
                    size: true,
                    fill: false,
                },
                1 => Detail {
                    size: false,
                    fill: true,
                },
                _ => Detail {
                    size: true,
                    fill: true,
                },
            };
            noun_phrase(rng, o, detail)
        })
        .collect();
    let list = join_list(&phrases);
    let n = scene.objects.len();
    match rng.random_range(0..4) {
        0 => list,
        1 => format!("{list} {}", background(rng, scene)),
        2 if n > 1 => format!("{}: {list}", count_phrase(n)),
        _ => format!("a picture of {list}"),
    }
}

/// Where the object at `i` is: its cell, and for the second object (and
/// sometimes later ones) its relation to the object before it.
fn locate(rng: &mut impl Rng, scene: &Scene, i: usize) -> String {
    let cell = scene.objects[i].cell;
    let place = cell_phrase(cell);
    if i == 0 || (i > 1 && rng.random_bool(0.5)) {
        return place.into();
    }
    // Objects are in reading order: below, or to the right on the same row.
    let relation = if cell.row > scene.objects[i - 1].cell.row {
        "below it"
    } else {
        "to the right of it"
    };
    format!("{place}, {relation}")
}

fn rich(rng: &mut impl Rng, scene: &Scene) -> String {
    let full = Detail {
        size: true,
        fill: true,
    };
    let n = scene.objects.len();
    let phrases: Vec<String> = (0..n)
        .map(|i| {
            let np = noun_phrase(rng, &scene.objects[i], full);
            format!("{np} {}", locate(rng, scene, i))
        })
        .collect();
    let bg = background(rng, scene);
    if n == 1 {
        return format!(
            "this picture shows exactly {} {bg}: {}",
            count_phrase(1),
            phrases[0]
        );
    }
    let verb = "there are";
    match rng.random_range(0..2) {
        0 => format!("{verb} {} {bg}: {}", count_phrase(n), join_list(&phrases)),
        _ => format!(
            "{} in all {bg}, namely {}",
            count_phrase(n),
            join_list(&phrases)
        ),
    }
}

/// One reference caption by an annotator of the given verbosity.
pub fn caption(rng: &mut impl Rng, scene: &Scene, verbosity: Verbosity) -> String {
    match verbosity {
        Verbosity::Concise => concise(rng, scene),
        Verbosity::Medium => medium(rng, scene),
        Verbosity::Rich => rich(rng, scene),
    }
}

/// `count` references, each from an annotator drawn by [`Verbosity::share`].
pub fn references(
    rng: &mut impl Rng,
    scene: &Scene,
    domain: Domain,
    count: usize,
) -> Vec<(Verbosity, String)> {
    (0..count)
        .map(|_| {
            let v = domain.verbosity(rng);
            (v, caption(rng, scene, v))
        })
        .collect()
}
