//! METEOR 1.5's text normalisation for English, as `meteor-1.5.jar -l en
//! -norm` (pycocoevalcap's METEOR) applies it to every hypothesis and
//! reference: the jar's tokenising normaliser with punctuation kept, then
//! Java's `toLowerCase()`.
//!
//! The normaliser is a Moses-style tokenizer: a fixed sequence of regular
//! expression rewrites, then one pass over the words that decides which
//! final dots belong to their word (abbreviations such as `Mr.`, `U.S.`)
//! and which are split off as sentence ends. That pass needs the
//! nonbreaking-prefix list, `nonbreaking/english.prefixes` inside the jar,
//! which the caller reads and passes to [`Normalizer::new`].
//!
//! Java's regular expressions are matched here with the same semantics:
//! `\p{Digit}` and `\p{Lower}` are ASCII only, `\s` is `[ \t\n\x0B\f\r]`,
//! and `StringTokenizer` splits on `[ \t\n\r\f]`.
//! `tests/data/meteor/normalize.jsonl` holds the jar's own output
//! (`scripts/meteor_normalize_fixture.py`).

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;

use super::java;

/// The characters METEOR's patterns count as letters: ASCII, Latin-1 and
/// Latin Extended-A letters (without `×` and `÷`), Cyrillic with its
/// supplement and Extended-B, and the phonetic extensions. Greek, CJK,
/// Arabic, digits other than ASCII and the like are not letters to it.
const LETTERS: &str = "A-Za-z\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{17E}\u{400}-\u{527}\
                       \u{A640}-\u{A66E}\u{A67E}-\u{A697}\u{1D00}-\u{1D7F}";

/// Java's `\s` (without the UNICODE_CHARACTER_CLASS flag).
const JAVA_SPACE: &str = r" \t\n\x0B\x0C\r";

/// What the last stage turns into single spaces (tabs and the other ASCII
/// separators are gone by then: the word pass rejoins words with spaces).
const WIDE_SPACES: &str = " \u{A0}\u{2000}-\u{200A}\u{202F}\u{205F}\u{3000}";

/// Marks dot runs (`...`) while single dots are being split off.
const DOT_RUN: &str = "DOTMULTI";
const DOT_RUN_DOT: &str = "DOTMULTI.";
const DOT_RUN_MORE: &str = "DOTDOTMULTI";

enum Step {
    /// Every match replaced, as Java's `Matcher.replaceAll` does (matches do
    /// not overlap, so `a,b,c` only splits its first comma).
    Rewrite(Regex, &'static str),
    /// Every occurrence of a literal string replaced, left to right.
    Literal(&'static str, &'static str),
    /// Dot runs hidden behind `DOTMULTI` markers (one `DOT` per extra dot)
    /// until the word pass is done.
    EscapeDotRuns,
}

struct Patterns {
    /// The rewrites before the word pass, in order.
    steps: Vec<Step>,
    /// Dots followed by more dots.
    dot_run: Regex,
    /// A marker and a dot before something that is not a dot.
    dot_run_end: Regex,
    /// One of [`LETTERS`].
    letter: Regex,
    /// A run of [`WIDE_SPACES`].
    wide_space: Regex,
}

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("METEOR's normalisation patterns are valid")
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| {
    let l = LETTERS;
    let rewrite = |pattern: String, replacement| Step::Rewrite(regex(&pattern), replacement);
    let steps = vec![
        // Pad with spaces every character that is not a letter, a digit,
        // whitespace, a dot, a comma, a hyphen or an apostrophe-like quote.
        rewrite(
            format!("([^0-9{l}{JAVA_SPACE}.'`,\\-\u{2018}\u{2019}])"),
            " ${1} ",
        ),
        Step::EscapeDotRuns,
        // Split commas off, except between two digits.
        rewrite("([^0-9]),([^0-9])".into(), "${1} , ${2}"),
        rewrite("([0-9]),([^0-9])".into(), "${1} , ${2}"),
        rewrite("([^0-9]),([0-9])".into(), "${1} , ${2}"),
        // Backquotes and curly single quotes become apostrophes; curly
        // double quotes and two apostrophes become a separate `"`.
        rewrite("[`\u{2018}\u{2019}]".into(), "'"),
        rewrite("[\u{201C}\u{201D}]|''".into(), " \" "),
        // En dashes and double hyphens become single hyphens.
        Step::Literal("\u{2013}", "-"),
        Step::Literal("--", "-"),
        // A hyphen inside a word (or after a dot: `U.S.-based`) becomes a
        // space.
        rewrite(format!("([0-9{l}.])-([0-9{l}])"), "${1} ${2}"),
        // Apostrophes: split off on both sides, except that between two
        // letters, and between a digit and `s`, the apostrophe stays with
        // the word after it (`can't` -> `can 't`, `1990's` -> `1990 's`);
        // between a digit and a letter other than `s` it stays put.
        rewrite(format!("([^{l}])'([^{l}])"), "${1} ' ${2}"),
        rewrite(format!("([^{l}0-9])'([{l}])"), "${1} ' ${2}"),
        rewrite(format!("([{l}])'([^{l}])"), "${1} ' ${2}"),
        rewrite(format!("([{l}])'([{l}])"), "${1} '${2}"),
        rewrite("([0-9])'(s)".into(), "${1} '${2}"),
    ];
    Patterns {
        steps,
        dot_run: regex(r"\.(\.+)"),
        dot_run_end: regex(r"DOTMULTI\.([^.])"),
        letter: regex(&format!("[{l}]")),
        wide_space: regex(&format!("[{WIDE_SPACES}]+")),
    }
});

/// How a nonbreaking prefix keeps its dot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prefix {
    /// Always (`Mr.`).
    Always,
    /// Only before a number (`No. 5`); marked `#NUMERIC_ONLY#` in the list.
    BeforeNumber,
}

/// METEOR's English normaliser with its nonbreaking-prefix list.
#[derive(Clone, Debug)]
pub struct Normalizer {
    prefixes: HashMap<String, Prefix>,
}

impl Normalizer {
    /// Takes the text of the jar's `nonbreaking/english.prefixes`, read as
    /// METEOR reads it: per line, the first word is a prefix unless it
    /// starts with `#`; a second word `#NUMERIC_ONLY#` makes it keep its dot
    /// only before a number; blank lines are skipped; a later entry for the
    /// same prefix wins.
    pub fn new(nonbreaking_prefixes: &str) -> Normalizer {
        let mut prefixes = HashMap::new();
        for line in nonbreaking_prefixes.split(['\n', '\r']) {
            let mut words = line.split(java::DELIMITERS).filter(|w| !w.is_empty());
            let Some(prefix) = words.next() else { continue };
            if prefix.starts_with('#') {
                continue;
            }
            let kind = if words.next() == Some("#NUMERIC_ONLY#") {
                Prefix::BeforeNumber
            } else {
                Prefix::Always
            };
            prefixes.insert(prefix.to_owned(), kind);
        }
        Normalizer { prefixes }
    }

    /// The line as the jar normalises and lowercases it: words separated
    /// by single spaces, no space at either end.
    pub fn normalize(&self, line: &str) -> String {
        let patterns = &*PATTERNS;
        let mut text = format!(" {line} ");
        for step in &patterns.steps {
            text = match step {
                Step::Rewrite(re, replacement) => re.replace_all(&text, *replacement).into_owned(),
                Step::Literal(from, to) => text.replace(from, to),
                Step::EscapeDotRuns => escape_dot_runs(patterns, text),
            };
        }
        let mut text = self.split_final_dots(patterns, &text);
        // Restore the dot runs.
        while text.contains(DOT_RUN_MORE) {
            text = text.replace(DOT_RUN_MORE, DOT_RUN_DOT);
        }
        let text = text.replace(DOT_RUN, ".");
        let text = patterns.wide_space.replace_all(&text, " ");
        java::trim(&text).to_lowercase()
    }

    /// The word pass: a final dot stays on its word for abbreviations and
    /// is split off as ` .` otherwise. Words are rejoined with spaces.
    fn split_final_dots(&self, patterns: &Patterns, text: &str) -> String {
        let words: Vec<&str> = text
            .split(java::DELIMITERS)
            .filter(|w| !w.is_empty())
            .collect();
        let mut out = String::with_capacity(text.len() + 8);
        for (i, &word) in words.iter().enumerate() {
            let next = words.get(i + 1).copied().unwrap_or("");
            match word.strip_suffix('.') {
                Some(stem) if !stem.is_empty() => {
                    if stem.contains('.') && patterns.letter.is_match(stem) {
                        // Dotted abbreviations lose their dots: `U.S.` -> `US`.
                        out.extend(word.chars().filter(|&c| c != '.'));
                    } else if self.keeps_dot(stem, next) {
                        out.push_str(word);
                    } else {
                        out.push_str(stem);
                        out.push_str(" .");
                    }
                }
                _ => out.push_str(word),
            }
            out.push(' ');
        }
        out
    }

    /// Whether `stem.` stays one word before the word `next` (empty at the
    /// end of the line): listed prefixes, and any word before a word that
    /// starts with an ASCII lowercase letter (`Inc. is`).
    fn keeps_dot(&self, stem: &str, next: &str) -> bool {
        let kind = self.prefixes.get(stem).copied();
        kind == Some(Prefix::Always)
            || next.starts_with(|c: char| c.is_ascii_lowercase())
            || (kind == Some(Prefix::BeforeNumber)
                && next.starts_with(|c: char| c.is_ascii_digit()))
    }
}

/// Hides runs of two or more dots: `a... b` becomes `a DOTDOTDOTMULTI  b`
/// (one `DOT` per dot after the first, and a space after the run), so that
/// the word pass leaves them alone.
fn escape_dot_runs(patterns: &Patterns, text: String) -> String {
    let mut text = patterns
        .dot_run
        .replace_all(&text, " DOTMULTI${1}")
        .into_owned();
    // Each round removes at least one dot, so this ends.
    while text.contains(DOT_RUN_DOT) {
        text = patterns
            .dot_run_end
            .replace_all(&text, "DOTDOTMULTI ${1}")
            .into_owned();
        text = text.replace(DOT_RUN_DOT, DOT_RUN_MORE);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn data(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/meteor")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn english() -> Normalizer {
        Normalizer::new(&data("english.prefixes"))
    }

    #[derive(serde::Deserialize)]
    struct Case {
        line: String,
        normalized: String,
    }

    /// Every line of the fixture normalises exactly as the jar did.
    #[test]
    fn matches_the_jar() {
        let normalizer = english();
        let cases: Vec<Case> = data("normalize.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
            .collect();
        assert!(cases.len() > 500, "fixture has {} lines", cases.len());
        let mismatches: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                let got = normalizer.normalize(&c.line);
                (got != c.normalized).then(|| {
                    format!(
                        "{:?}\n    jar:  {:?}\n    ours: {got:?}",
                        c.line, c.normalized
                    )
                })
            })
            .collect();
        assert!(
            mismatches.is_empty(),
            "{} of {} lines differ from the jar; the first:\n{}",
            mismatches.len(),
            cases.len(),
            mismatches[..mismatches.len().min(10)].join("\n")
        );
    }

    #[test]
    fn reads_the_prefix_list_as_meteor_does() {
        let n = Normalizer::new(
            "# comment\n\nMr\r\nNo #NUMERIC_ONLY# \n  Art\t#NUMERIC_ONLY#\nxy z\n#Dr\n",
        );
        assert_eq!(n.prefixes.get("Mr"), Some(&Prefix::Always));
        assert_eq!(n.prefixes.get("No"), Some(&Prefix::BeforeNumber));
        assert_eq!(n.prefixes.get("Art"), Some(&Prefix::BeforeNumber));
        assert_eq!(n.prefixes.get("xy"), Some(&Prefix::Always));
        assert_eq!(n.prefixes.len(), 4);
        assert_eq!(n.normalize("Mr. X"), "mr. x");
        assert_eq!(n.normalize("No. 5"), "no. 5");
        assert_eq!(n.normalize("No. X"), "no . x");
    }

    #[test]
    fn never_panics() {
        let without = Normalizer::new("");
        let with = english();
        let lines = [
            "",
            "\0",
            ".",
            "'",
            "DOTMULTI.",
            "DOTDOTMULTI.DOTMULTI..",
            "\u{FFFF}\u{10FFFF}\u{D7FF}",
            "\r\n\x0B\x0C\u{85}\u{2028}",
            "İ̇Σ.ς'",
        ];
        let long = ".".repeat(2000) + &"a.".repeat(500) + &"'".repeat(300);
        for line in lines.iter().copied().chain([long.as_str()]) {
            for n in [&without, &with] {
                let out = n.normalize(line);
                assert!(!out.starts_with(' ') && !out.ends_with(' ') && !out.contains("  "));
            }
        }
    }
}
