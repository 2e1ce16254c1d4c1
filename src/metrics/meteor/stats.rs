//! METEOR's sufficient statistics and the score made from them, for one
//! segment or summed over a corpus, with English's parameters from the
//! jar's default ("rank") task.

/// The modules, in order: exact, stem, synonym, paraphrase.
pub const MODULES: usize = 4;
/// How much a match of each module counts in precision and recall.
const MODULE_WEIGHTS: [f64; MODULES] = [1.0, 0.6, 0.8, 0.6];
/// Recall's share of the harmonic mean.
const ALPHA: f64 = 0.85;
/// The fragmentation penalty's exponent and largest value.
const BETA: f64 = 0.20;
const GAMMA: f64 = 0.60;
/// Content words' weight against function words'.
const DELTA: f64 = 0.75;

/// Word counts of one hypothesis against its chosen reference (or their
/// sums over a corpus): lengths, function words, matched words by module
/// and kind, chunks, and matched words in all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub test_len: f64,
    pub reference_len: f64,
    pub test_function_words: f64,
    pub reference_function_words: f64,
    pub test_content: [f64; MODULES],
    pub reference_content: [f64; MODULES],
    pub test_function: [f64; MODULES],
    pub reference_function: [f64; MODULES],
    pub chunks: f64,
    pub test_matches: f64,
    pub reference_matches: f64,
}

impl Stats {
    fn matched(content: &[f64; MODULES], function: &[f64; MODULES]) -> f64 {
        content.iter().chain(function).sum()
    }

    /// Every word of both sides matched, in one chunk: no fragmentation.
    fn is_whole(&self) -> bool {
        Self::matched(&self.test_content, &self.test_function) == self.test_len
            && Self::matched(&self.reference_content, &self.reference_function)
                == self.reference_len
            && self.chunks == 1.0
    }

    /// The METEOR score: the weighted harmonic mean of precision and
    /// recall, less the fragmentation penalty; 0 where it is undefined.
    pub fn score(&self) -> f64 {
        // Summed in the jar's order, so that the last bits agree too.
        let weighted = |content: &[f64; MODULES], function: &[f64; MODULES]| {
            let mut sum = 0.0;
            for i in 0..MODULES {
                sum += content[i] * MODULE_WEIGHTS[i] * DELTA;
            }
            for i in 0..MODULES {
                sum += function[i] * MODULE_WEIGHTS[i] * (1.0 - DELTA);
            }
            sum
        };
        let length = |len: f64, function_words: f64| {
            DELTA * (len - function_words) + (1.0 - DELTA) * function_words
        };
        let precision = weighted(&self.test_content, &self.test_function)
            / length(self.test_len, self.test_function_words);
        let recall = weighted(&self.reference_content, &self.reference_function)
            / length(self.reference_len, self.reference_function_words);
        let f_mean = 1.0 / ((1.0 - ALPHA) / precision + ALPHA / recall);
        let fragmentation = if self.is_whole() {
            0.0
        } else {
            self.chunks / ((self.test_matches + self.reference_matches) / 2.0)
        };
        let score = f_mean * (1.0 - GAMMA * fragmentation.powf(BETA));
        if score.is_nan() { 0.0 } else { score.max(0.0) }
    }

    /// Adds a segment's statistics to a corpus's. A segment matched whole
    /// adds no chunk, so that a corpus of perfect segments is not
    /// fragmented.
    pub fn add(&mut self, s: &Stats) {
        self.test_len += s.test_len;
        self.reference_len += s.reference_len;
        self.test_function_words += s.test_function_words;
        self.reference_function_words += s.reference_function_words;
        for i in 0..MODULES {
            self.test_content[i] += s.test_content[i];
            self.reference_content[i] += s.reference_content[i];
            self.test_function[i] += s.test_function[i];
            self.reference_function[i] += s.reference_function[i];
        }
        if !s.is_whole() {
            self.chunks += s.chunks;
        }
        self.test_matches += s.test_matches;
        self.reference_matches += s.reference_matches;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics from the jar's 23-number line.
    fn from_line(line: &str) -> Stats {
        let v: Vec<f64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        let module = |k: usize| std::array::from_fn(|i| v[4 + 4 * i + k]);
        Stats {
            test_len: v[0],
            reference_len: v[1],
            test_function_words: v[2],
            reference_function_words: v[3],
            test_content: module(0),
            reference_content: module(1),
            test_function: module(2),
            reference_function: module(3),
            chunks: v[20],
            test_matches: v[21],
            reference_matches: v[22],
        }
    }

    /// The jar's statistics and scores (`-stdio`, SCORE then EVAL) of "a
    /// dog running on grass" against "a dog runs on the grass" (a stem
    /// match, two chunks), of "a cat" against itself, and of both as a
    /// corpus, where the whole match adds no chunk.
    #[test]
    fn scores_equal_the_jars() {
        let partial = from_line(
            "5.0 6.0 2.0 3.0 2.0 2.0 2.0 2.0 1.0 1.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 2.0 5.0 5.0",
        );
        let whole = from_line(
            "2.0 2.0 1.0 1.0 1.0 1.0 1.0 1.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 1.0 2.0 2.0",
        );
        assert_eq!(partial.score(), 0.41388921016683433);
        assert_eq!(whole.score(), 1.0);
        let mut corpus = Stats::default();
        corpus.add(&partial);
        corpus.add(&whole);
        assert_eq!(corpus.chunks, 2.0);
        assert_eq!(corpus.score(), 0.4640436540035525);
    }

    #[test]
    fn an_empty_hypothesis_scores_zero() {
        let empty = Stats {
            reference_len: 4.0,
            ..Stats::default()
        };
        assert_eq!(empty.score(), 0.0);
    }
}
