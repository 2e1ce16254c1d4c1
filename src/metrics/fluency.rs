//! Fluency as the SMILE paper (Yue et al., 2023) reports it: the
//! perplexity of the generated captions under GPT-2, after transformers'
//! perplexity guide (perplexity = exp of the mean negative log-likelihood
//! per token). `model::gpt2_lm` says which tokens of a caption are scored.

use serde::Serialize;

/// What a language model makes of one text: the summed negative
/// log-likelihood of its scored tokens (natural log) and their count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TextLikelihood {
    pub nll: f64,
    pub tokens: usize,
}

/// The perplexity of a set of captions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Perplexity {
    /// The mean over captions of each one's perplexity.
    pub mean: f64,
    /// exp(every caption's negative log-likelihood over every scored
    /// token): the corpus read as one text, long captions weighing more.
    pub corpus: f64,
    /// Captions with a token to score (an empty caption has none).
    pub captions: usize,
}

/// The perplexity of the captions with a token to score; None when none has.
pub fn perplexity(likelihoods: &[TextLikelihood]) -> Option<Perplexity> {
    let scored: Vec<&TextLikelihood> = likelihoods.iter().filter(|l| l.tokens > 0).collect();
    if scored.is_empty() {
        return None;
    }
    let n = scored.len() as f64;
    let mean = scored
        .iter()
        .map(|l| (l.nll / l.tokens as f64).exp())
        .sum::<f64>()
        / n;
    let nll: f64 = scored.iter().map(|l| l.nll).sum();
    let tokens: usize = scored.iter().map(|l| l.tokens).sum();
    Some(Perplexity {
        mean,
        corpus: (nll / tokens as f64).exp(),
        captions: scored.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_weighs_captions_and_the_corpus_weighs_tokens() {
        let l = |nll: f64, tokens| TextLikelihood { nll, tokens };
        // Per-token NLLs ln 2 (1 token) and ln 8 (3 tokens); an empty caption.
        let got = perplexity(&[l(2f64.ln(), 1), l(3.0 * 8f64.ln(), 3), l(0.0, 0)]).unwrap();
        assert!((got.mean - 5.0).abs() < 1e-12, "{got:?}");
        // exp((ln 2 + 3 ln 8) / 4) = (2 * 512)^(1/4).
        assert!((got.corpus - 1024f64.powf(0.25)).abs() < 1e-12, "{got:?}");
        assert_eq!(got.captions, 2);
        assert_eq!(perplexity(&[l(0.0, 0)]), None);
    }
}
