//! Facts: what a caption states about a shapes-world scene, checked
//! exactly against the scene.
//!
//! A scene's facts are, per object, its shape, colour, size, fill and
//! position (cell), plus the scene's object count and its background.
//! A caption is parsed into noun phrases ("two small striped red circles in
//! the top left corner"), counts ("three shapes"), a background ("on a gray
//! background") and relations ("below it", "to the left of a blue star").
//! The objects the noun phrases speak of are aligned with scene objects
//! all at once, by the assignment that agrees most in all (each scene
//! object used once where possible), so that the order of the phrases does
//! not matter; every attribute the phrase states is then one stated fact,
//! true when the aligned object has it. A count of a kind ("two red circles") and a
//! relation are stated facts of their own.
//!
//! Fact precision = stated facts that hold / stated facts; fact recall =
//! scene facts some true stated fact covers / scene facts.

use super::lexicon::{self, RegionWord};
use super::scene::{Background, Cell, Colour, Fill, Object, Scene, Shape, Size};
use crate::data::tokenize::ptb_tokenize;
use std::collections::HashSet;
use std::ops::Range;

/// The attributes a noun phrase gives (None = not stated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Description {
    pub shape: Option<Shape>,
    pub colour: Option<Colour>,
    pub size: Option<Size>,
    pub fill: Option<Fill>,
    pub cell: Option<Cell>,
}

impl Description {
    /// Whether `o` has each attribute, in the order of
    /// [`SceneFact::of_object`]; None where the description is silent.
    fn checks(&self, o: &Object) -> [Option<bool>; 5] {
        [
            self.shape.map(|s| s == o.shape),
            self.colour.map(|c| c == o.colour),
            self.size.map(|s| s == o.size),
            self.fill.map(|f| f == o.fill),
            self.cell.map(|c| c == o.cell),
        ]
    }

    /// How many stated attributes `o` has.
    fn agreements(&self, o: &Object) -> usize {
        self.checks(o)
            .into_iter()
            .flatten()
            .filter(|&ok| ok)
            .count()
    }

    /// How many attributes the description gives.
    fn stated(&self) -> usize {
        [
            self.shape.is_some(),
            self.colour.is_some(),
            self.size.is_some(),
            self.fill.is_some(),
            self.cell.is_some(),
        ]
        .into_iter()
        .filter(|&s| s)
        .count()
    }

    fn matches(&self, o: &Object) -> bool {
        self.checks(o).into_iter().flatten().all(|ok| ok)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    LeftOf,
    RightOf,
    Above,
    Below,
}

impl Relation {
    fn holds(self, a: Cell, b: Cell) -> bool {
        match self {
            Relation::LeftOf => a.col < b.col,
            Relation::RightOf => a.col > b.col,
            Relation::Above => a.row < b.row,
            Relation::Below => a.row > b.row,
        }
    }
}

/// One noun phrase: how many objects it speaks of and what it says of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phrase {
    pub description: Description,
    /// A number word ("two", "single"), if any.
    pub number: Option<u8>,
    pub plural: bool,
    /// "shape", "objects": no shape stated.
    pub generic: bool,
    /// Where each part stands in the caption's words.
    pub words: PhraseWords,
}

/// The indices of a phrase's words among the caption's PTB tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhraseWords {
    pub number: Option<usize>,
    pub colour: Option<usize>,
    pub size: Option<usize>,
    pub fill: Option<usize>,
    pub noun: usize,
    /// The position words ("top left corner").
    pub cell: Option<Range<usize>>,
}

impl Phrase {
    /// How many scene objects the phrase is aligned with.
    fn instances(&self) -> usize {
        match self.number {
            Some(n) => n as usize,
            None if self.plural => 2,
            None => 1,
        }
    }

    /// "three shapes": a statement about the whole scene, not an object.
    fn is_total_count(&self) -> bool {
        self.generic && self.description == Description::default()
    }
}

/// What a caption states, before it is checked against a scene.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Statements {
    pub phrases: Vec<Phrase>,
    /// The background and its two words ("gray background").
    pub background: Option<(Background, Range<usize>)>,
    /// (subject phrase, relation, object phrase), indices into `phrases`,
    /// and the relation's words.
    pub relations: Vec<(usize, Relation, usize, Range<usize>)>,
}

/// Parses a caption (any case or punctuation) into what it states.
pub fn parse(caption: &str) -> Statements {
    let tokens = ptb_tokenize(caption);
    let words: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut out = Statements::default();
    // A relation seen whose object phrase is still to come.
    let mut pending: Option<(usize, Relation, Range<usize>)> = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let next = words.get(i + 1).copied();
        if let (Some(bg), Some("background")) = (lexicon::parse_background(w), next) {
            out.background = Some((bg, i..i + 2));
            i += 2;
            continue;
        }
        if let Some((relation, len)) = relation_at(&words[i..]) {
            if let Some(subject) = out.phrases.len().checked_sub(1) {
                pending = Some((subject, relation, i..i + len));
            }
            i += len;
            continue;
        }
        if matches!(w, "it" | "that" | "this")
            && let Some((subject, relation, at)) = pending.take()
            && subject > 0
        {
            out.relations
                .push((subject, relation, subject - 1, at.start..i + 1));
            i += 1;
            continue;
        }
        if lexicon::region_word(w).is_some() {
            let (cell, len) = region_at(&words[i..]);
            if let Some(last) = out.phrases.last_mut()
                && last.description.cell.is_none()
                && !last.generic
            {
                last.description.cell = Some(cell);
                last.words.cell = Some(i..i + len);
            }
            i += len;
            continue;
        }
        if let Some((phrase, len)) = phrase_at(&words[i..], i) {
            out.phrases.push(phrase);
            if let Some((subject, relation, at)) = pending.take() {
                out.relations
                    .push((subject, relation, out.phrases.len() - 1, at));
            }
            i += len;
            continue;
        }
        i += 1;
    }
    out
}

fn relation_at(words: &[&str]) -> Option<(Relation, usize)> {
    match words {
        ["to", "the", "left", "of", ..] => Some((Relation::LeftOf, 4)),
        ["to", "the", "right", "of", ..] => Some((Relation::RightOf, 4)),
        ["left", "of", ..] => Some((Relation::LeftOf, 2)),
        ["right", "of", ..] => Some((Relation::RightOf, 2)),
        ["above" | "over", ..] => Some((Relation::Above, 1)),
        ["below" | "under" | "beneath" | "underneath", ..] => Some((Relation::Below, 1)),
        _ => None,
    }
}

/// A run of position words ("top left corner"): a row alone means its
/// middle column, a column alone its middle row.
fn region_at(words: &[&str]) -> (Cell, usize) {
    let (mut row, mut col) = (None, None);
    let mut len = 0;
    for w in words {
        match lexicon::region_word(w) {
            Some(RegionWord::Row(r)) => row = Some(r),
            Some(RegionWord::Col(c)) => col = Some(c),
            Some(RegionWord::Centre) => {}
            None if matches!(*w, "corner" | "side" | "hand" | "-") => {}
            None => break,
        }
        len += 1;
    }
    (
        Cell {
            row: row.unwrap_or(1),
            col: col.unwrap_or(1),
        },
        len,
    )
}

/// [article | number] attributes* noun. Attributes with no noun after them
/// state nothing. `start`: the index of `words[0]` in the caption.
fn phrase_at(words: &[&str], start: usize) -> Option<(Phrase, usize)> {
    let mut i = 0;
    let mut number = None;
    let mut at = PhraseWords::default();
    if let Some(&w) = words.first() {
        if let Some(n) = lexicon::parse_number(w) {
            number = Some(n);
            at.number = Some(start);
            i += 1;
        } else if matches!(w, "a" | "an") {
            i += 1;
        }
    }
    let mut d = Description::default();
    while let Some(&w) = words.get(i) {
        if let Some(c) = lexicon::parse_colour(w) {
            d.colour = Some(c);
            at.colour = Some(start + i);
        } else if let Some(s) = lexicon::parse_size(w) {
            d.size = Some(s);
            at.size = Some(start + i);
        } else if let Some(f) = lexicon::parse_fill(w) {
            d.fill = Some(f);
            at.fill = Some(start + i);
        } else {
            break;
        }
        i += 1;
    }
    let noun = *words.get(i)?;
    at.noun = start + i;
    let (generic, plural) = if let Some((shape, plural)) = lexicon::parse_shape(noun) {
        d.shape = Some(shape);
        (false, plural)
    } else {
        (true, lexicon::parse_generic(noun)?)
    };
    Some((
        Phrase {
            description: d,
            number,
            plural,
            generic,
            words: at,
        },
        i + 1,
    ))
}

/// One scene fact: an attribute of object `i`, the count, or the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SceneFact {
    Shape(usize),
    Colour(usize),
    Size(usize),
    Fill(usize),
    Cell(usize),
    Count,
    Background,
}

impl SceneFact {
    /// The attributes of object `i`.
    fn of_object(i: usize) -> [SceneFact; 5] {
        [
            SceneFact::Shape(i),
            SceneFact::Colour(i),
            SceneFact::Size(i),
            SceneFact::Fill(i),
            SceneFact::Cell(i),
        ]
    }
}

pub fn scene_facts(scene: &Scene) -> Vec<SceneFact> {
    let mut facts: Vec<SceneFact> = (0..scene.objects.len())
        .flat_map(SceneFact::of_object)
        .collect();
    facts.extend([SceneFact::Count, SceneFact::Background]);
    facts
}

/// A caption's stated facts checked against one scene.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub stated: usize,
    pub true_stated: usize,
    pub covered: HashSet<SceneFact>,
    pub scene_facts: usize,
}

impl Checked {
    /// Stated facts that hold / stated facts; undefined (None) when
    /// nothing is stated: a caption that says nothing is not precise.
    pub fn precision(&self) -> Option<f64> {
        (self.stated > 0).then(|| self.true_stated as f64 / self.stated as f64)
    }

    pub fn recall(&self) -> f64 {
        self.covered.len() as f64 / self.scene_facts as f64
    }

    /// Every stated fact holds.
    pub fn consistent(&self) -> bool {
        self.true_stated == self.stated
    }
}

impl Statements {
    /// How many objects the caption speaks of, and how many attributes
    /// (shape, colour, size, fill, position) it gives them in all: a
    /// caption's breadth and its detail.
    pub fn described(&self) -> (usize, usize) {
        let objects = self.objects();
        (objects.len(), objects.iter().map(Description::stated).sum())
    }

    /// Every object the phrases speak of, in order: a phrase's description
    /// once per instance ("two red circles" twice), total counts left out.
    fn objects(&self) -> Vec<Description> {
        self.phrases
            .iter()
            .filter(|p| !p.is_total_count())
            .flat_map(|p| std::iter::repeat_n(p.description, p.instances()))
            .collect()
    }

    pub fn check(&self, scene: &Scene) -> Checked {
        let mut c = Checked {
            stated: 0,
            true_stated: 0,
            covered: HashSet::new(),
            scene_facts: scene_facts(scene).len(),
        };
        for fact in self.stated_facts(scene) {
            c.stated += 1;
            if fact.holds {
                c.true_stated += 1;
                c.covered.extend(fact.covers);
            }
        }
        c
    }

    /// Every fact the caption states, checked against `scene`, with the
    /// words that state it.
    pub fn stated_facts(&self, scene: &Scene) -> Vec<StatedFact> {
        let mut facts = Vec::new();
        let mut state = |kind, holds, covers, words: Vec<usize>| {
            facts.push(StatedFact {
                kind,
                holds,
                covers,
                words,
            })
        };
        if let Some((bg, words)) = &self.background {
            let holds = *bg == scene.background;
            state(
                FactKind::Background,
                holds,
                Some(SceneFact::Background),
                words.clone().collect(),
            );
        }
        // The scene object each object the phrases speak of goes with.
        let mut aligned = align(&self.objects(), &scene.objects).into_iter();
        // The scene object each phrase's first instance was aligned with.
        let mut anchor: Vec<Option<usize>> = vec![None; self.phrases.len()];
        for (p, phrase) in self.phrases.iter().enumerate() {
            let (d, at) = (&phrase.description, &phrase.words);
            let number: Vec<usize> = at.number.into_iter().collect();
            if phrase.is_total_count() {
                if let Some(n) = phrase.number {
                    let holds = n as usize == scene.objects.len();
                    let words = number.iter().copied().chain([at.noun]).collect();
                    state(FactKind::Count, holds, Some(SceneFact::Count), words);
                }
                continue;
            }
            if let Some(n) = phrase.number.filter(|&n| n >= 2) {
                let count = scene.objects.iter().filter(|o| d.matches(o)).count();
                state(FactKind::Count, count == n as usize, None, number.clone());
            }
            let cell_words: Vec<usize> = at.cell.clone().into_iter().flatten().collect();
            let words_of = [
                vec![at.noun],
                at.colour.into_iter().collect(),
                at.size.into_iter().collect(),
                at.fill.into_iter().collect(),
                cell_words,
            ];
            for i in aligned.by_ref().take(phrase.instances()) {
                anchor[p].get_or_insert(i);
                let checks = d.checks(&scene.objects[i]);
                for (k, (holds, fact)) in
                    checks.into_iter().zip(SceneFact::of_object(i)).enumerate()
                {
                    if let Some(holds) = holds {
                        // The first check is the shape's, stated whenever it is checked.
                        let kind = match d.shape {
                            Some(shape) if k == 0 => FactKind::Object(shape),
                            _ => FactKind::Attribute,
                        };
                        state(kind, holds, Some(fact), words_of[k].clone());
                    }
                }
            }
        }
        for (a, relation, b, words) in &self.relations {
            let holds = match (anchor[*a], anchor[*b]) {
                (Some(a), Some(b)) => relation.holds(scene.objects[a].cell, scene.objects[b].cell),
                _ => false,
            };
            state(FactKind::Relation, holds, None, words.clone().collect());
        }
        facts
    }
}

/// What kind of fact a caption states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactKind {
    /// An object of a shape (its noun).
    Object(Shape),
    /// A colour, size, fill or position of an object.
    Attribute,
    /// How many objects, or how many of a kind.
    Count,
    Background,
    /// One object left of, right of, above or below another.
    Relation,
}

/// One fact a caption states, checked against a scene.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatedFact {
    pub kind: FactKind,
    pub holds: bool,
    /// The scene fact it states, when it states one (a relation or a count
    /// of a kind covers none).
    pub covers: Option<SceneFact>,
    /// Its words, indices into the caption's PTB tokens.
    pub words: Vec<usize>,
}

/// How a word of a caption fares against the scene's facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FactMark {
    /// True, and some reference of the image states it too.
    True,
    /// True, and no reference of the image states it: a detail the
    /// references leave out.
    NewDetail,
    /// A wrong colour, size, fill, position, count, background or relation,
    /// or a shape the scene holds said of another of its objects.
    Wrong,
    /// An object of a shape the scene does not hold.
    Absent,
}

impl FactMark {
    /// What the mark means, for a legend.
    pub fn meaning(self) -> &'static str {
        match self {
            FactMark::True => "true, as a reference says",
            FactMark::NewDetail => "true, and no reference says it",
            FactMark::Wrong => "wrong colour, size, fill, position, count, background or relation",
            FactMark::Absent => "an object that is not there",
        }
    }

    pub const ALL: [FactMark; 4] = [
        FactMark::True,
        FactMark::NewDetail,
        FactMark::Wrong,
        FactMark::Absent,
    ];
}

/// The caption's PTB tokens, each with its mark where it states a fact
/// (the worst of the facts it takes part in): checked by the same parser
/// and alignment as fact precision and recall, and compared with what
/// the image's `references` state.
pub fn mark(
    caption: &str,
    scene: &Scene,
    references: &[String],
) -> Vec<(String, Option<FactMark>)> {
    let referenced: HashSet<SceneFact> = references
        .iter()
        .flat_map(|r| check(r, scene).covered)
        .collect();
    let words = ptb_tokenize(caption);
    let mut marks: Vec<Option<FactMark>> = vec![None; words.len()];
    for fact in parse(caption).stated_facts(scene) {
        let mark = match (fact.holds, fact.kind) {
            (false, FactKind::Object(shape)) if !scene.objects.iter().any(|o| o.shape == shape) => {
                FactMark::Absent
            }
            (false, _) => FactMark::Wrong,
            (true, _) if fact.covers.is_some_and(|f| !referenced.contains(&f)) => {
                FactMark::NewDetail
            }
            (true, _) => FactMark::True,
        };
        for w in fact.words {
            marks[w] = marks[w].max(Some(mark));
        }
    }
    words.into_iter().zip(marks).collect()
}

/// The scene object each described object is aligned with: of all
/// assignments that use as many distinct scene objects as there are (each
/// once where possible), the one with the most agreeing attributes in all;
/// among equals, the earliest objects for the earliest descriptions. Empty
/// for an empty scene.
fn align(descriptions: &[Description], objects: &[Object]) -> Vec<usize> {
    let (k, n) = (descriptions.len(), objects.len());
    if n == 0 {
        return Vec::new();
    }
    // The choices for description i with the objects in `used` taken: an
    // untaken object, or a taken one again when the descriptions after i
    // can still take every untaken object.
    let choices = |i: usize, used: usize| {
        let untaken = n - used.count_ones() as usize;
        let may_repeat = k - i > untaken;
        (0..n).filter_map(move |j| {
            let taken = used & (1 << j) != 0;
            (!taken || may_repeat).then_some((j, used | (1 << j)))
        })
    };
    let agree = |i: usize, j: usize| descriptions[i].agreements(&objects[j]);
    // best[i][used]: the most agreements descriptions i.. can still make.
    let mut best = vec![vec![0usize; 1 << n]; k + 1];
    for i in (0..k).rev() {
        for used in 0..1usize << n {
            best[i][used] = choices(i, used)
                .map(|(j, next)| agree(i, j) + best[i + 1][next])
                .max()
                .unwrap_or(0);
        }
    }
    let mut used = 0;
    (0..k)
        .map(|i| {
            let (j, next) = choices(i, used)
                .find(|&(j, next)| agree(i, j) + best[i + 1][next] == best[i][used])
                .expect("the best choice is among the choices");
            used = next;
            j
        })
        .collect()
}

/// Parses `caption` and checks it against `scene`.
pub fn check(caption: &str, scene: &Scene) -> Checked {
    parse(caption).check(scene)
}
