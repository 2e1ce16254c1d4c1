#!/usr/bin/env python3
"""Expected metric values on small hand-made cases, from pycocoevalcap,
for the branches that Flickr8k's folds may not reach: a corpus shorter
than its references (BLEU's brevity penalty), reference lengths tied
around a candidate's (the shorter one counts), repeated words (clipped
counts), an empty reference, and the diversity of caption sets (Div-1,
Div-2, mBLEU-4).

Captions are already tokenised (lower case, split on spaces), so no
tokenizer (and no Java) is needed.

    pip install pycocoevalcap
    python3 scripts/metric_cases_reference.py > tests/data/metric_cases_reference.json
"""
import json
import sys

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

# Each corpus: one candidate per image, with that image's references.
CORPORA = {
    # Every candidate shorter than its closest reference: the brevity
    # penalty is active for the corpus and for each sentence.
    "brevity": [
        ("a red circle", ["a big red circle on the left", "a red circle at the top of it"]),
        ("two blue squares", ["two small blue squares next to a star", "blue squares"]),
        ("green star", ["a green star below a yellow triangle"]),
    ],
    # Reference lengths tied around the candidate's (4 words: 3 and 5,
    # 6 words: 5 and 7): pycocoevalcap takes the shorter, so no penalty;
    # the longer would make one.
    "tied_lengths": [
        ("a red circle left", ["a red circle", "a red circle on left"]),
        ("one small green star at top", ["small green star at top", "a small green star at the top"]),
    ],
    # An empty reference (length 0): no brevity penalty, and every
    # precision the smoothing's 1e-15 over the candidate's n-grams.
    "empty_reference": [
        ("a red circle", [""]),
        ("two squares", ["two squares"]),
    ],
    # Repeated words: matches are clipped at the references' counts.
    "repeats": [
        ("a a a red red circle", ["a red circle and a red square", "a circle"]),
        ("the the the the", ["the cat on the mat"]),
        ("blue blue square square", ["a blue square", "two blue squares and a blue circle"]),
    ],
}

# Caption sets of one image each (five samples), for the diversity metrics.
SETS = [
    [
        "a red circle on the left",
        "a red circle",
        "a big red circle on the left of a blue square",
        "a red circle on the left",
        "two circles",
    ],
    [
        "a small green star",
        "a green star at the top",
        "one small green star at the top of the picture",
        "a star",
        "a small green star",
    ],
]


def scores(pairs):
    gts = {n: refs for n, (_, refs) in enumerate(pairs)}
    res = {n: [cand] for n, (cand, _) in enumerate(pairs)}
    bleu, bleu_sentences = Bleu(4).compute_score(gts, res, verbose=0)
    cider, cider_sentences = Cider().compute_score(gts, res)
    rouge, rouge_sentences = Rouge().compute_score(gts, res)
    return {
        "candidates": [c for c, _ in pairs],
        "references": [r for _, r in pairs],
        "bleu": list(bleu),
        # Each candidate alone against its references, as its own corpus.
        "sentence_bleu": [
            list(Bleu(4).compute_score({0: refs}, {0: [cand]}, verbose=0)[0]) for cand, refs in pairs
        ],
        "cider": float(cider),
        "cider_sentences": [float(s) for s in cider_sentences],
        "rouge": float(rouge),
        "rouge_sentences": [float(s) for s in rouge_sentences],
    }


def distinct_ngrams(captions, n):
    grams = set()
    for caption in captions:
        words = caption.split()
        grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return len(grams)


def diversity(sets):
    div1, div2, mbleu4 = [], [], []
    for captions in sets:
        words = sum(len(c.split()) for c in captions)
        div1.append(distinct_ngrams(captions, 1) / words)
        div2.append(distinct_ngrams(captions, 2) / words)
        # Each caption's BLEU-4 against the others.
        per_caption = []
        for i, caption in enumerate(captions):
            others = captions[:i] + captions[i + 1:]
            per_caption.append(Bleu(4).compute_score({0: others}, {0: [caption]}, verbose=0)[0][3])
        mbleu4.append(sum(per_caption) / len(per_caption))
    mean = lambda xs: sum(xs) / len(xs)
    return {"sets": sets, "div1": mean(div1), "div2": mean(div2), "mbleu4": mean(mbleu4)}


def main():
    out = {
        "source": "pycocoevalcap 1.2 (Bleu, Cider, Rouge); Div-n counted here",
        "corpora": {name: scores(pairs) for name, pairs in CORPORA.items()},
        "diversity": diversity(SETS),
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
