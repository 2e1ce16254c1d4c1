//! METEOR's aligner: every match the four modules find between a
//! hypothesis and a reference, then the beam search that picks the
//! alignment, and the counts the score is made of.
//!
//! It repeats the jar's choices wherever they change a number, quirks
//! included, because a reimplementation that "fixes" them scores
//! differently:
//! - words are compared by Java's `String.hashCode`, so two words whose
//!   hashes collide count as equal;
//! - the search ranks partial alignments by weighted match counts that it
//!   keeps as integers (a 0.5-weighted one-word match adds nothing);
//! - when a path branches on a match, the match's distance is added to
//!   the path it branched from, not to the branch;
//! - ties keep their order (Java's sort is stable, and so is Rust's).

use super::java;
use super::paraphrase::Paraphrases;
use super::stats::{MODULES, Stats};
use super::stem::stem;
use super::synonyms::Synonyms;
use std::collections::HashSet;

/// The search's beam, as the jar's default.
const BEAM: usize = 40;
/// The weights the search ranks matches by: exact 1, the others 0.5
/// (the scorer's weights, 1.0, 0.6, 0.8 and 0.6, come later).
const SEARCH_WEIGHTS: [f64; MODULES] = [1.0, 0.5, 0.5, 0.5];
const EXACT: usize = 0;
const STEM: usize = 1;
const SYNONYM: usize = 2;
const PARAPHRASE: usize = 3;

/// What the modules know of one word, worked out once per corpus.
pub struct Word {
    /// Its Java hash, by which words are compared.
    key: i32,
    stem: i32,
    /// Its synsets and its base form's, sorted.
    synsets: Vec<i32>,
    /// Its id in the paraphrase table.
    paraphrase_id: i64,
    function: bool,
}

impl Word {
    pub fn new(
        word: &str,
        function_words: &HashSet<String>,
        synonyms: &Synonyms,
        paraphrases: &Paraphrases,
    ) -> Word {
        let mut synsets: Vec<i32> = synonyms.sets_of(word).into_iter().collect();
        synsets.sort_unstable();
        Word {
            key: java::hash(word),
            stem: java::hash(&stem(word)),
            synsets,
            paraphrase_id: paraphrases.id_of(word),
            function: function_words.contains(&word.to_lowercase()),
        }
    }

    /// Whether the two share a synset.
    fn is_synonym(&self, other: &Word) -> bool {
        let (mut a, mut b) = (
            self.synsets.iter().peekable(),
            other.synsets.iter().peekable(),
        );
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            match x.cmp(y) {
                std::cmp::Ordering::Less => _ = a.next(),
                std::cmp::Ordering::Greater => _ = b.next(),
                std::cmp::Ordering::Equal => return true,
            }
        }
        false
    }
}

/// A match of `len` reference words at `start` with `test_len` hypothesis
/// words at `test_start`, found by `module`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Match {
    start: usize,
    len: usize,
    test_start: usize,
    test_len: usize,
    module: usize,
}

/// Every match, by the reference position it starts at, and how many
/// matches cover each word.
struct Candidates {
    at: Vec<Vec<Match>>,
    test_coverage: Vec<u32>,
    reference_coverage: Vec<u32>,
}

impl Candidates {
    fn add(&mut self, m: Match) {
        self.at[m.start].push(m);
        for c in &mut self.test_coverage[m.test_start..m.test_start + m.test_len] {
            *c += 1;
        }
        for c in &mut self.reference_coverage[m.start..m.start + m.len] {
            *c += 1;
        }
    }

    /// One-word matches wherever `same(i, j)` holds, reference word by
    /// reference word.
    fn add_words(&mut self, module: usize, same: impl Fn(usize, usize) -> bool) {
        let (tests, refs) = (self.test_coverage.len(), self.reference_coverage.len());
        for j in 0..refs {
            for i in 0..tests {
                if same(i, j) {
                    self.add(Match {
                        start: j,
                        len: 1,
                        test_start: i,
                        test_len: 1,
                        module,
                    });
                }
            }
        }
    }
}

/// A partial alignment in the beam search.
#[derive(Clone)]
struct Path {
    /// The chosen match starting at each reference position.
    chosen: Vec<Option<Match>>,
    /// Weighted matched words of each side, truncated to whole numbers as
    /// the jar's integer fields truncate them.
    weighted_test: i32,
    weighted_reference: i32,
    chunks: i32,
    /// The next reference position the path has not passed.
    next: usize,
    /// Where the last match ended in the hypothesis, if a chunk is open.
    last_end: Option<usize>,
    distance: i32,
    test_used: Vec<bool>,
    reference_used: Vec<bool>,
}

impl Path {
    fn uses(&self, m: &Match) -> bool {
        self.reference_used[m.start..m.start + m.len]
            .iter()
            .any(|&u| u)
            || self.test_used[m.test_start..m.test_start + m.test_len]
                .iter()
                .any(|&u| u)
    }

    fn mark(&mut self, m: &Match) {
        self.reference_used[m.start..m.start + m.len].fill(true);
        self.test_used[m.test_start..m.test_start + m.test_len].fill(true);
    }

    /// The path's counts after taking `m`, all but its distance.
    fn take(&mut self, m: &Match) {
        let w = SEARCH_WEIGHTS[m.module];
        self.weighted_test = (f64::from(self.weighted_test) + m.test_len as f64 * w) as i32;
        self.weighted_reference = (f64::from(self.weighted_reference) + m.len as f64 * w) as i32;
        if self.last_end.is_some_and(|end| end != m.test_start) {
            self.chunks += 1;
        }
        self.next = m.start + m.len;
        self.last_end = Some(m.test_start + m.test_len);
    }

    /// Ranks paths: more weighted matches, then fewer chunks, then less
    /// distance.
    fn rank(&self) -> (i32, i32, i32) {
        (
            -(self.weighted_test + self.weighted_reference),
            self.chunks,
            self.distance,
        )
    }
}

fn distance(m: &Match) -> i32 {
    (m.start as i32 - m.test_start as i32).abs()
}

/// The best alignment of `test` with `reference` (their words, as
/// normalised), as METEOR's statistics.
pub fn align(paraphrases: &Paraphrases, test: &[&Word], reference: &[&Word]) -> Stats {
    let mut candidates = Candidates {
        at: vec![Vec::new(); reference.len()],
        test_coverage: vec![0; test.len()],
        reference_coverage: vec![0; reference.len()],
    };
    let same = |i: usize, j: usize| test[i].key == reference[j].key;
    candidates.add_words(EXACT, same);
    // Identical sentences need exact matches only (the jar's guard against
    // the search going astray).
    let identical = test.len() == reference.len() && (0..test.len()).all(|i| same(i, i));
    if !identical {
        candidates.add_words(STEM, |i, j| {
            test[i].stem == reference[j].stem && !same(i, j)
        });
        candidates.add_words(SYNONYM, |i, j| {
            test[i].is_synonym(reference[j]) && !same(i, j)
        });
        add_paraphrases(&mut candidates, paraphrases, test, reference);
    }
    let best = search(&candidates, test.len(), reference.len());
    counts(&best.chosen, test, reference)
}

/// The paraphrase module: each phrase of the reference the table knows,
/// found in the hypothesis as one of its paraphrases; then the same from
/// the hypothesis's side.
fn add_paraphrases(
    candidates: &mut Candidates,
    table: &Paraphrases,
    test: &[&Word],
    reference: &[&Word],
) {
    let test_ids: Vec<i64> = test.iter().map(|w| w.paraphrase_id).collect();
    let reference_ids: Vec<i64> = reference.iter().map(|w| w.paraphrase_id).collect();
    let mut add = |start, len, test_start, test_len| {
        candidates.add(Match {
            start,
            len,
            test_start,
            test_len,
            module: PARAPHRASE,
        })
    };
    for (j, len, i, test_len) in phrase_pairs(table, &reference_ids, &test_ids) {
        add(j, len, i, test_len);
    }
    for (i, test_len, j, len) in phrase_pairs(table, &test_ids, &reference_ids) {
        add(j, len, i, test_len);
    }
}

/// Each phrase of `from` the table knows, found in `to` as one of its
/// paraphrases: (start in `from`, its length, start in `to`, its length),
/// by start in `from`, then the table's order, then start in `to`.
fn phrase_pairs(
    table: &Paraphrases,
    from: &[i64],
    to: &[i64],
) -> Vec<(usize, usize, usize, usize)> {
    let found = |at: usize, phrase: &[i64]| {
        phrase.len() <= to.len() - at && to[at..at + phrase.len()] == *phrase
    };
    let mut pairs = Vec::new();
    for a in 0..from.len() {
        for (len, paraphrase) in table.phrases_at(from, a) {
            for b in 0..to.len() {
                if found(b, paraphrase) {
                    pairs.push((a, len, b, paraphrase.len()));
                }
            }
        }
    }
    pairs
}

/// The beam search over the candidates, left to right along the
/// reference, from the path that already holds every match with no rival.
fn search(candidates: &Candidates, tests: usize, refs: usize) -> Path {
    let mut start = Path {
        chosen: vec![None; refs],
        weighted_test: 0,
        weighted_reference: 0,
        chunks: 0,
        next: 0,
        last_end: None,
        distance: 0,
        test_used: vec![false; tests],
        reference_used: vec![false; refs],
    };
    for (j, at) in candidates.at.iter().enumerate() {
        if let [m] = at.as_slice() {
            let alone = candidates.reference_coverage[j..j + m.len]
                .iter()
                .all(|&c| c == 1)
                && candidates.test_coverage[m.test_start..m.test_start + m.test_len]
                    .iter()
                    .all(|&c| c == 1);
            if alone {
                start.chosen[j] = Some(*m);
                start.mark(m);
            }
        }
    }
    let mut next_paths = vec![start];
    for current in 0..=refs {
        let mut paths = std::mem::take(&mut next_paths);
        paths.sort_by_key(Path::rank);
        for mut path in paths.iter().take(BEAM).cloned() {
            if current == refs {
                if path.last_end.is_some() {
                    path.chunks += 1;
                }
                next_paths.push(path);
                continue;
            }
            if path.reference_used[current] {
                if current < path.next {
                    next_paths.push(path);
                } else if let Some(m) = path.chosen[path.next] {
                    // A match fixed from the start is reached.
                    path.take(&m);
                    path.distance += distance(&m);
                    next_paths.push(path);
                }
                continue;
            }
            for m in &candidates.at[current] {
                if path.uses(m) {
                    continue;
                }
                let mut branch = path.clone();
                branch.mark(m);
                branch.chosen[current] = Some(*m);
                branch.take(m);
                path.distance += distance(m);
                next_paths.push(branch);
            }
            // Or leave this reference word unmatched.
            if path.last_end.take().is_some() {
                path.chunks += 1;
            }
            path.next += 1;
            next_paths.push(path);
        }
        if next_paths.is_empty() {
            next_paths.push(paths.swap_remove(0));
        }
    }
    next_paths.sort_by_key(Path::rank);
    next_paths.swap_remove(0)
}

/// Counts `words`, matched by `module`, as content or function words.
fn tally(
    words: &[&Word],
    module: usize,
    content: &mut [f64; MODULES],
    function: &mut [f64; MODULES],
) {
    for w in words {
        let side = if w.function {
            &mut *function
        } else {
            &mut *content
        };
        side[module] += 1.0;
    }
}

/// METEOR's statistics of the chosen matches: matched words by module,
/// content or function word, and the chunks they form.
fn counts(chosen: &[Option<Match>], test: &[&Word], reference: &[&Word]) -> Stats {
    let function_words = |words: &[&Word]| words.iter().filter(|w| w.function).count() as f64;
    let mut s = Stats {
        test_len: test.len() as f64,
        reference_len: reference.len() as f64,
        test_function_words: function_words(test),
        reference_function_words: function_words(reference),
        ..Stats::default()
    };
    for m in chosen.iter().flatten() {
        let matched = &test[m.test_start..m.test_start + m.test_len];
        tally(matched, m.module, &mut s.test_content, &mut s.test_function);
        let matched = &reference[m.start..m.start + m.len];
        tally(
            matched,
            m.module,
            &mut s.reference_content,
            &mut s.reference_function,
        );
    }
    // Chunks: runs of matches contiguous in both sentences, walking the
    // reference.
    let (mut j, mut open_end) = (0, None);
    while j < chosen.len() {
        match chosen[j] {
            None => {
                if open_end.take().is_some() {
                    s.chunks += 1.0;
                }
                j += 1;
            }
            Some(m) => {
                s.test_matches += m.test_len as f64;
                s.reference_matches += m.len as f64;
                if open_end.is_some_and(|end| end != m.test_start) {
                    s.chunks += 1.0;
                }
                j = m.start + m.len;
                open_end = Some(m.test_start + m.test_len);
            }
        }
    }
    if open_end.is_some() {
        s.chunks += 1.0;
    }
    s
}
