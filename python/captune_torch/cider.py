"""CIDEr-D (Vedantam et al., 2015) as SCST's reward, as pycocoevalcap
computes it (n-grams 1 to 4, sigma 6, clipped counts, the length
penalty, times 10), with the document frequencies and log(#images) of the
training references, counted once: captune's reward, in Python and
without Java."""

import math
from collections import Counter

N, SIGMA = 4, 6.0


def grams(words):
    """Every 1- to 4-gram of `words`, with its count."""
    return Counter(tuple(words[i:i + n]) for n in range(1, N + 1) for i in range(len(words) - n + 1))


class CiderD:
    def __init__(self, references):
        """`references[i]`: image i's reference captions, each a list of
        words; image i is one document."""
        self.df = Counter()
        for image in references:
            self.df.update({g for r in image for g in grams(r)})
        self.log_images = math.log(float(len(references)))
        self.references = [[self.vector(r) for r in image] for image in references]

    def vector(self, words):
        counts = grams(words)
        weights = [dict() for _ in range(N)]
        norms = [0.0] * N
        for g, tf in counts.items():
            n = len(g) - 1
            w = float(tf) * (self.log_images - math.log(max(1.0, self.df.get(g, 0.0))))
            weights[n][g] = w
            norms[n] += w * w
        # pycocoevalcap measures a caption's length in bigrams.
        length = sum(tf for g, tf in counts.items() if len(g) == 2)
        return weights, [math.sqrt(x) for x in norms], length

    def score(self, image, words):
        """CIDEr-D of `words` against training image `image`'s references."""
        refs = self.references[image]
        cand, cand_norms, cand_length = self.vector(words)
        total = [0.0] * N
        for ref, ref_norms, ref_length in refs:
            delta = cand_length - ref_length
            penalty = math.exp(-(delta * delta) / (2 * SIGMA * SIGMA))
            for n in range(N):
                value = sum(min(w, ref[n][g]) * ref[n][g] for g, w in cand[n].items() if g in ref[n])
                if cand_norms[n] != 0 and ref_norms[n] != 0:
                    value /= cand_norms[n] * ref_norms[n]
                total[n] += value * penalty
        return sum(total) / N / max(len(refs), 1) * 10.0
