//! The few Java library behaviours METEOR's numbers depend on.

/// `StringTokenizer`'s default delimiters: only these five characters
/// separate words (not, say, a vertical tab or a no-break space).
pub const DELIMITERS: [char; 5] = [' ', '\t', '\n', '\r', '\u{c}'];

/// A line's words as `StringTokenizer` splits it.
pub fn words(line: &str) -> Vec<&str> {
    line.split(DELIMITERS).filter(|w| !w.is_empty()).collect()
}

/// `String.trim`: every character up to U+0020 goes from both ends.
pub fn trim(text: &str) -> &str {
    text.trim_matches(|c: char| c <= ' ')
}

/// `String.hashCode`: 31-based over UTF-16 code units, wrapping.
pub fn hash(word: &str) -> i32 {
    word.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_splits_as_java() {
        // Java's "Aa".hashCode() == "BB".hashCode() == 2112, and two
        // lowercase words that collide too.
        assert_eq!(hash("Aa"), 2112);
        assert_eq!(hash("BB"), 2112);
        assert_eq!(hash("wejdaffb"), hash("dwhuazjz"));
        assert_ne!(hash("dog"), hash("dogs"));
        // A vertical tab and a no-break space are no delimiters.
        assert_eq!(
            words(" a\tb\u{b}c\u{a0}d\r\ne "),
            ["a", "b\u{b}c\u{a0}d", "e"]
        );
        assert_eq!(trim("\u{1}\t x \u{a0}\n"), "x \u{a0}");
    }
}
