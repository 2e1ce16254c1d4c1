//! ROUGE-L as pycocoevalcap's `Rouge`: the longest common subsequence with
//! each reference, precision and recall each maximised over the
//! references, then F with beta = 1.2. As there, an empty caption counts
//! as one empty token.

const BETA: f64 = 1.2;

fn lcs<S: AsRef<str>>(a: &[S], b: &[S]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut row = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            row[j + 1] = if x.as_ref() == y.as_ref() {
                prev[j] + 1
            } else {
                row[j].max(prev[j + 1])
            };
        }
        std::mem::swap(&mut prev, &mut row);
    }
    prev[b.len()]
}

/// Length as `str.split(" ")` counts it.
fn split_len<S>(tokens: &[S]) -> usize {
    tokens.len().max(1)
}

pub fn rouge_l<S: AsRef<str>>(candidate: &[S], references: &[Vec<S>]) -> f64 {
    let (mut precision, mut recall) = (0.0f64, 0.0f64);
    for r in references {
        let common = lcs(r, candidate) as f64;
        precision = precision.max(common / split_len(candidate) as f64);
        recall = recall.max(common / split_len(r) as f64);
    }
    if precision == 0.0 || recall == 0.0 {
        return 0.0;
    }
    let b2 = BETA * BETA;
    (1.0 + b2) * precision * recall / (recall + b2 * precision)
}
