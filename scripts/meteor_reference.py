#!/usr/bin/env python3
"""METEOR 1.5 as pycocoevalcap computes it (the jar through Java), for
captune's METEOR tests: per-segment and corpus scores of

- Flickr8k's test split, fold j taking each image's j-th caption as the
  candidate and the other four as references (PTB-tokenised as
  pycocoevalcap tokenises them); only the scores are written, the
  captions stay in the data set;
- captions captune generated for that split (given as `results` files:
  [{"image_id", "caption"}]), against the split's references;
- cases written here and made from METEOR's own data: punctuation, case,
  contractions and numbers that the normaliser rewrites; stems, WordNet
  synonyms and phrases from the paraphrase table that only the later
  modules match; long and repetitive captions that give the aligner's
  beam search a choice; and a Java hash collision.

    sudo apt install default-jre && pip install pycocoevalcap
    python3 scripts/meteor_reference.py "$CAPTUNE_FLICKR8K"/dataset_flickr8k.json \\
        RESULTS.json... > tests/data/meteor_reference.json
"""
import gzip
import json
import os
import random
import sys

import pycocoevalcap
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

METEOR_DIR = os.path.join(list(pycocoevalcap.__path__)[0], "meteor")
SEED = 7


def scored(meteor, pairs):
    """The jar's corpus and segment scores of (candidate, references) pairs."""
    gts = {i: refs for i, (_, refs) in enumerate(pairs)}
    res = {i: [c] for i, (c, _) in enumerate(pairs)}
    corpus, segments = meteor.compute_score(gts, res)
    # Nine decimals keep the file small and the tests' 1e-6 meaningful.
    return {"corpus": corpus, "segments": [round(s, 9) for s in segments]}


def tokenized(pairs):
    """`pairs` PTB-tokenised as COCOEvalCap tokenises them before scoring."""
    gts = {i: [{"caption": r} for r in refs] for i, (_, refs) in enumerate(pairs)}
    res = {i: [{"caption": c}] for i, (c, _) in enumerate(pairs)}
    tokenizer = PTBTokenizer()
    gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
    return [(res[i][0], gts[i]) for i in range(len(pairs))]


def paraphrase_records(count, rng):
    """`count` records of the paraphrase table with phrases of two to four
    plain words, drawn evenly over the table."""
    chosen = []
    with gzip.open(os.path.join(METEOR_DIR, "data", "paraphrase-en.gz"), "rt", encoding="utf-8") as f:
        while True:
            if not f.readline():
                break
            phrase, paraphrase = f.readline().strip(), f.readline().strip()
            if all(2 <= len(p.split()) <= 4 and p.replace(" ", "").isalpha() for p in (phrase, paraphrase)):
                if rng.random() < 0.0004:
                    chosen.append((phrase, paraphrase))
    rng.shuffle(chosen)
    return chosen[:count]


def synonym_pairs(count, rng):
    """`count` pairs of different plain words that share a WordNet synset
    in the jar's dictionary."""
    import zipfile
    with zipfile.ZipFile(os.path.join(METEOR_DIR, "meteor-1.5.jar")) as jar:
        lines = jar.read("synonym/english.synsets").decode("utf-8").splitlines()
    by_set = {}
    for word, ids in zip(lines[0::2], lines[1::2]):
        if word.isalpha() and 3 <= len(word) <= 10:
            for i in ids.split():
                by_set.setdefault(i, []).append(word)
    groups = sorted(ws for ws in by_set.values() if len(ws) >= 2)
    return [tuple(rng.sample(g, 2)) for g in rng.sample(groups, count)]


TEMPLATES = [
    "a man {} near the water",
    "two children {} in the park",
    "{} is what the woman does on the street",
    "the dog {} while people watch",
]

HAND_WRITTEN = [
    ("A dog runs on the grass.", ["The dog is running on grass!", "a dog running."]),
    ("Mr. Smith's dog, a U.S.-based terrier, can't jump 3,000 ft.",
     ["mr smith 's dog can not jump", "A terrier (from the U.S.) jumps 3.5 feet..."]),
    ("\"Quoted\" words -- and dashes - everywhere; e-mail at 3:30 p.m.",
     ["``quoted'' words and dashes everywhere", "e-mail at 3:30 pm"]),
    ("It's the kids' toy, isn't it?", ["it is the toy of the kids", "the kids ' toy"]),
    ("A café's naïve über-dog", ["a cafe 's naive uber dog", "A CAFÉ DOG"]),
    ("", ["an empty caption scores nothing"]),
    ("a man rides a horse", ["a man rides a horse"]),
    ("a a a a a a a a", ["a dog and a cat and a bird and a fish"]),
    ("the dogs were running and jumped happily",
     ["a dog runs and jumps happy", "dogs run , jump , and are happy"]),
    # Different words with one Java hash: the jar counts them as the same.
    ("a wejdaffb on the grass", ["a dwhuazjz on the grass"]),
    ("a child in a red shirt climbs ||| a wall", ["a kid climbing a rock wall"]),
    ("a man in a blue shirt and a woman in a red dress walk down a street past a man in a "
     "red shirt and a woman in a blue dress near a shop with a red sign and a blue door",
     ["a woman in a red dress and a man in a blue shirt walk past a shop with a blue door and "
      "a red sign while a woman in a blue dress and a man in a red shirt stand near the street",
      "people walk down the street"]),
    ("three brown dogs are playing together in the snow outside", ["brown dogs play in snow"]),
    ("NO. 5 ... etc. the end", ["number 5 and so on the end", "no . 5 etc the end"]),
    ("$5.00 for 2 hot-dogs & a soda @ the fair", ["five dollars for two hot dogs and a soda at the fair"]),
    ("\ttabs\tand   spaces  ", ["tabs and spaces"]),
]


def cases(rng):
    """Hand-written cases, then stem, synonym and paraphrase ones."""
    out = list(HAND_WRITTEN)
    for a, b in [("run", "running"), ("dogs", "dog"), ("jumped", "jumps"), ("happily", "happy"),
                 ("swimming", "swims"), ("climbers", "climbing"), ("generously", "generous")]:
        out.append((f"the people {a} together", [f"the people {b} together"]))
    for a, b in synonym_pairs(120, rng):
        t = rng.choice(TEMPLATES)
        out.append((t.format(a), [t.format(b), rng.choice(TEMPLATES).format(b)]))
    for phrase, paraphrase in paraphrase_records(300, rng):
        t = rng.choice(TEMPLATES)
        if rng.random() < 0.5:
            out.append((t.format(paraphrase), [t.format(phrase), rng.choice(TEMPLATES).format(phrase)]))
        else:
            out.append((t.format(phrase), [rng.choice(TEMPLATES).format(paraphrase), t.format(paraphrase)]))
    return out


def main(dataset, results):
    rng = random.Random(SEED)
    images = [i for i in json.load(open(dataset))["images"] if i["split"] == "test"]
    by_id = {i["imgid"]: [s["raw"] for s in i["sentences"]] for i in images}
    meteor = Meteor()
    folds = []
    for j in range(5):
        pairs = [(raws[j], [r for k, r in enumerate(raws) if k != j])
                 for raws in ([s["raw"] for s in i["sentences"]] for i in images) if len(raws) > j]
        folds.append({"fold": j, **scored(meteor, tokenized(pairs))})
    generated = []
    for path in results:
        captions = json.load(open(path))
        pairs = tokenized([(c["caption"], by_id[c["image_id"]]) for c in captions])
        generated.append({"name": os.path.basename(path),
                          "captions": [[c["image_id"], c["caption"]] for c in captions], **scored(meteor, pairs)})
    written = cases(rng)
    json.dump({
        "source": "pycocoevalcap 1.2 (meteor-1.5.jar -l en -norm), " + os.path.basename(dataset),
        "flickr8k_folds": folds,
        "generated": generated,
        "cases": {"pairs": [{"candidate": c, "references": r} for c, r in written], **scored(meteor, written)},
    }, sys.stdout, separators=(",", ":"), ensure_ascii=False)
    print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
