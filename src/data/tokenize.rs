//! Caption tokenisation as pycocoevalcap does it: Stanford's PTBTokenizer
//! with lower-casing, then the punctuation tokens `'' ' `` ` -LRB- -RRB-
//! -LCB- -RCB- . ? ! , : - -- ... ;` dropped.
//!
//! The PTB rules kept here: punctuation is split from words, except a
//! comma, colon or period between digits ("1,000", "3.5", "12:30") and the
//! period of an abbreviation ("mr.", "u.s."); "..." is one token; hyphens
//! inside a word stay ("t-shirt", "black-and-white"); clitics split off
//! ("don't" -> "do n't", "it's" -> "it 's", "dogs'" -> "dogs '");
//! "cannot", "gonna", "gotta", "wanna" split in two; "$" splits from a
//! number it leads and "%" from one it ends; brackets become -LRB-, -RRB-,
//! -LSB-, -RSB-, -LCB-, -RCB- (lower-cased), of which PTB drops the round
//! and curly ones.

/// Tokens pycocoevalcap removes after PTB tokenisation (lower-cased).
const DROPPED: &[&str] = &[
    "''", "'", "``", "`", "-lrb-", "-rrb-", "-lcb-", "-rcb-", ".", "?", "!", ",", ":", "-", "--",
    "...", ";",
];

/// Words whose final period belongs to them.
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "inc", "co", "ltd", "mt", "ave",
];

const CLITICS: &[&str] = &["'s", "'re", "'ve", "'ll", "'d", "'m"];

const SPLIT_WORDS: &[(&str, &str, &str)] = &[
    ("cannot", "can", "not"),
    ("gonna", "gon", "na"),
    ("gotta", "got", "ta"),
    ("wanna", "wan", "na"),
];

/// PTB-tokenises `text` and drops punctuation, as pycocoevalcap does.
pub fn ptb_tokenize(text: &str) -> Vec<String> {
    if text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ') {
        return plain_words(text);
    }
    any_text(text)
}

fn any_text(text: &str) -> Vec<String> {
    ptb_tokens(&text.to_lowercase())
        .into_iter()
        .filter(|t| !DROPPED.contains(&t.as_str()))
        .collect()
}

/// The tokens of text of ASCII letters, digits and spaces alone (most
/// captions), without the general path's copies: its words, but for
/// the few that PTB splits in two.
fn plain_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let word = word.to_ascii_lowercase();
        match SPLIT_WORDS.iter().find(|(whole, ..)| *whole == word) {
            Some(&(_, a, b)) => out.extend([a.to_string(), b.to_string()]),
            None => out.push(word),
        }
    }
    out
}

/// The PTB tokens of lower-cased text, punctuation included.
fn ptb_tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if let Some(bracket) = bracket(c) {
            out.push(bracket.to_string());
            i += 1;
        } else if c == '"' {
            // Opening or closing, both dropped later.
            out.push("''".into());
            i += 1;
        } else if matches!(c, ';' | '!' | '?' | ',' | ':') {
            out.push(c.to_string());
            i += 1;
        } else {
            let start = i;
            while i < chars.len() && in_word(&chars, i) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            split_word(&word, &mut out);
        }
    }
    out
}

fn bracket(c: char) -> Option<&'static str> {
    Some(match c {
        '(' => "-lrb-",
        ')' => "-rrb-",
        '[' => "-lsb-",
        ']' => "-rsb-",
        '{' => "-lcb-",
        '}' => "-rcb-",
        _ => return None,
    })
}

/// Whether chars[i] continues the word it is in: separators only between
/// digits.
fn in_word(chars: &[char], i: usize) -> bool {
    let c = chars[i];
    if c.is_whitespace() || c == '"' || bracket(c).is_some() || matches!(c, ';' | '!' | '?') {
        return false;
    }
    if matches!(c, ',' | ':') {
        let digit = |j: Option<usize>| {
            j.and_then(|j| chars.get(j))
                .is_some_and(char::is_ascii_digit)
        };
        return digit(i.checked_sub(1)) && digit(Some(i + 1));
    }
    true
}

/// Splits one whitespace-and-punctuation-delimited word into PTB tokens.
fn split_word(word: &str, out: &mut Vec<String>) {
    let mut w = word;
    let mut leading = Vec::new();
    let mut trailing = Vec::new();
    loop {
        if let Some(rest) = w.strip_prefix("--") {
            leading.push("--".to_string());
            w = rest;
        } else if w.len() > 1
            && let Some(rest) = w.strip_prefix(['-', '`', '$', '\''])
            && !CLITICS.contains(&w)
        {
            let mark = &w[..1];
            leading.push(if mark == "'" { "`".into() } else { mark.into() });
            w = rest;
        } else {
            break;
        }
    }
    loop {
        if let Some(rest) = w.strip_suffix("...") {
            trailing.push("...".to_string());
            w = rest;
        } else if let Some(rest) = w.strip_suffix("--") {
            trailing.push("--".to_string());
            w = rest;
        } else if w.len() > 1 && w.ends_with('.') && !is_abbreviation(w) {
            trailing.push(".".to_string());
            w = &w[..w.len() - 1];
        } else if w.len() > 1 && (w.ends_with('-') || w.ends_with('%') || w.ends_with('\'')) {
            // A trailing quote is a closing quote or a plural possessive ("dogs'").
            trailing.push(w[w.len() - 1..].to_string());
            w = &w[..w.len() - 1];
        } else {
            break;
        }
    }
    out.extend(leading);
    split_clitic(w, out);
    out.extend(trailing.into_iter().rev());
}

fn is_abbreviation(w: &str) -> bool {
    let stem = &w[..w.len() - 1];
    stem.contains('.') || ABBREVIATIONS.contains(&stem)
}

fn split_clitic(w: &str, out: &mut Vec<String>) {
    if w.is_empty() {
        return;
    }
    if let Some(&(_, a, b)) = SPLIT_WORDS.iter().find(|(whole, ..)| *whole == w) {
        out.extend([a.to_string(), b.to_string()]);
        return;
    }
    if w.len() > 3 && w.ends_with("n't") {
        out.extend([w[..w.len() - 3].to_string(), "n't".to_string()]);
        return;
    }
    if let Some(clitic) = CLITICS
        .iter()
        .find(|c| w.len() > c.len() && w.ends_with(*c))
    {
        out.extend([w[..w.len() - clitic.len()].to_string(), clitic.to_string()]);
        return;
    }
    out.push(w.to_string());
}

#[cfg(test)]
mod tests {
    use super::{any_text, plain_words, ptb_tokenize};
    use rand::{Rng, SeedableRng};

    fn tok(s: &str) -> String {
        ptb_tokenize(s).join(" ")
    }

    #[test]
    fn lower_cases_and_drops_punctuation() {
        assert_eq!(
            tok("A Dog runs, jumps; and BARKS!"),
            "a dog runs jumps and barks"
        );
        assert_eq!(
            tok("What is it? (A cat.) {Maybe}"),
            "what is it a cat maybe"
        );
        assert_eq!(
            tok("\"Quoted\" words... here -- and `there'"),
            "quoted words here and there"
        );
        assert_eq!(tok("A man : a plan"), "a man a plan");
        assert_eq!(tok("  \t  "), "");
        assert_eq!(tok("..."), "");
    }

    #[test]
    fn square_brackets_are_kept_as_ptb_escapes() {
        assert_eq!(tok("a [big] dog"), "a -lsb- big -rsb- dog");
    }

    #[test]
    fn splits_clitics() {
        assert_eq!(tok("The dog's ball"), "the dog 's ball");
        assert_eq!(
            tok("They're here, we've gone, I'm sure, she'll go, he'd stay"),
            "they 're here we 've gone i 'm sure she 'll go he 'd stay"
        );
        assert_eq!(tok("Don't, can't, won't"), "do n't ca n't wo n't");
        assert_eq!(tok("The dogs' bowls"), "the dogs bowls");
        assert_eq!(tok("I cannot, I'm gonna"), "i can not i 'm gon na");
    }

    #[test]
    fn keeps_hyphenated_words_and_numbers() {
        assert_eq!(
            tok("A black-and-white T-shirt"),
            "a black-and-white t-shirt"
        );
        assert_eq!(tok("a man - running"), "a man running");
        assert_eq!(
            tok("3.5 miles, 1,000 people at 12:30."),
            "3.5 miles 1,000 people at 12:30"
        );
        assert_eq!(tok("costs $5 or 50%"), "costs $ 5 or 50 %");
        assert_eq!(tok("and/or"), "and/or");
    }

    #[test]
    fn keeps_abbreviation_periods() {
        assert_eq!(
            tok("Mr. Smith in the U.S. army."),
            "mr. smith in the u.s. army"
        );
        assert_eq!(tok("A dog. A cat."), "a dog a cat");
    }

    #[test]
    fn splits_a_separator_with_a_digit_on_one_side_only() {
        // Stanford's PTBTokenizer (pycocoevalcap's) gives these: a comma
        // or colon stays inside a number only between two digits.
        assert_eq!(tok("2, 3 dogs"), "2 3 dogs");
        assert_eq!(tok("at 10: 5:30, then 4,"), "at 10 5:30 then 4");
        assert_eq!(tok("the 1990s, 2. next"), "the 1990s 2 next");
        assert_eq!(tok("room 12,000,5"), "room 12,000,5");
    }

    #[test]
    fn plain_text_takes_a_shortcut_to_the_same_tokens() {
        let words = [
            "A", "dog", "CANNOT", "gonna", "Gotta", "wanna", "2", "x9", "Wanna9",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..2_000 {
            let n = rng.random_range(0..8);
            let text: String = (0..n)
                .map(|_| {
                    let spaces = " ".repeat(rng.random_range(1..3));
                    format!("{spaces}{}", words[rng.random_range(0..words.len())])
                })
                .collect();
            assert_eq!(plain_words(&text), any_text(&text), "{text:?}");
        }
        assert_eq!(tok("I CANNOT  go"), "i can not go");
    }
}
