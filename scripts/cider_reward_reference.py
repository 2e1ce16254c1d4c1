#!/usr/bin/env python3
"""Expected CIDEr-D rewards from pycocoevalcap's CiderScorer with the
TRAINING statistics (document frequencies and log(#images) over every
training image's references), as SCST computes its reward: for the first
12 training images of a Karpathy-format data set, three candidates each
(the image's second reference; the next image's first reference; the
first four words of its first reference), scored against all of the
image's references. Words are the split file's `tokens`, joined by spaces.

    pip install pycocoevalcap
    python3 scripts/cider_reward_reference.py "$CAPTUNE_FLICKR8K"/dataset_flickr8k.json \
        > tests/data/cider_reward_flickr8k.json
"""
import json
import sys

from pycocoevalcap.cider.cider_scorer import CiderScorer

IMAGES = 12


def candidates(train):
    """The candidate sets: (name, [candidate of image i for i < IMAGES])."""
    first = [" ".join(img["sentences"][0]["tokens"]) for img in train]
    return [
        ("second_reference", [" ".join(train[i]["sentences"][1]["tokens"]) for i in range(IMAGES)]),
        ("next_image", [first[i + 1] for i in range(IMAGES)]),
        ("first_four_words", [" ".join(train[i]["sentences"][0]["tokens"][:4]) for i in range(IMAGES)]),
    ]


def main(path):
    train = [i for i in json.load(open(path))["images"] if i["split"] == "train"]
    refs = [[" ".join(s["tokens"]) for s in img["sentences"]] for img in train]
    out = {"images": IMAGES, "training_images": len(train), "sets": []}
    for name, cands in candidates(train):
        # Every training image takes part, so that the scorer's document
        # frequencies and log(#images) are the training set's; only the
        # first IMAGES have a candidate that is kept.
        scorer = CiderScorer(n=4, sigma=6.0)
        for i, r in enumerate(refs):
            scorer += (cands[i] if i < IMAGES else r[0], r)
        _, scores = scorer.compute_score()
        out["sets"].append({"name": name, "candidates": cands, "cider_d": [float(s) for s in scores[:IMAGES]]})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
