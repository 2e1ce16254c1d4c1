#!/usr/bin/env python3
"""A tiny METEOR data folder in the layout of METEOR 1.5's (and
pycocoevalcap's): meteor-1.5.jar holding only the resources captune reads
(deflated, as the real jar stores them) and data/paraphrase-en.gz. Its
function words, synonyms and paraphrases are made up here (the
non-breaking prefixes are the test fixture's copy of the jar's list).
The loaders' fuzz test damages copies of it, and the METEOR tests score
written cases with it where pycocoevalcap is not installed.

With `--expected` (needs pycocoevalcap's jar and Java) it also runs the
real jar on the written cases with this folder's function words,
synonyms and paraphrase table (`-s`, `-d`, `-a`), and writes the scores
to tests/data/meteor/tiny_expected.json.

    python3 scripts/meteor_tiny_data.py --expected
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "meteor", "tiny")
EXPECTED = os.path.join(ROOT, "tests", "data", "meteor", "tiny_expected.json")

FUNCTION_WORDS = ["a", "an", "the", "of", "on", "in", "is", "are", "with", "and", "."]
# Base forms and their irregular forms.
EXCEPTIONS = [("goose", ["geese"]), ("run", ["ran"]), ("child", ["children"])]
# Words and their synsets (numbers as WordNet writes them).
SYNSETS = [
    ("big", ["00000001", "00000002"]), ("large", ["00000002"]), ("dog", ["00000003"]),
    ("hound", ["00000003"]), ("goose", ["00000004"]), ("bird", ["00000004"]),
    ("run", ["00000005"]), ("sprint", ["00000005"]), ("child", ["00000006"]),
    ("kid", ["00000006"]), ("happy", ["00000007"]), ("glad", ["00000007"]),
    ("street", ["00000008"]), ("road", ["00000008"]),
]
PARAPHRASES = [
    ("a lot of", "many"), ("rides", "is riding"), ("grass", "lawn"),
    ("next to", "beside"), ("in front of", "before"), ("a small", "a little"),
    ("is running", "runs"), ("on the street", "on the road"),
]
CASES = [
    ("a big dog runs on the grass", ["a large hound is running on the lawn"]),
    ("the dogs ran next to the geese", ["a dog runs beside a bird", "the dog is running"]),
    ("many children are glad", ["a lot of kids are happy", "children happy"]),
    ("a man rides a horse in front of a shop", ["a man is riding a horse before a shop"]),
    ("a small kid is sprinting on the road", ["a little child runs on the street"]),
    ("dog dog dog dog", ["a dog and a dog and a dog"]),
    ("the street the road the street", ["on the road on the street"]),
    ("a dog on the grass", ["a dog on the grass"]),
    ("", ["a dog"]),
    ("Mr. Smith's big dog, in the U.S. -- runs!", ["mr smith 's large hound runs in the us"]),
    ("a kid next to a big bird next to a lawn", ["a child beside a large goose beside the grass",
                                                  "a kid next to a big bird"]),
    ("running dogs runs dogs", ["the dog is running , dogs run"]),
]


def write_folder():
    prefixes = open(os.path.join(ROOT, "tests", "data", "meteor", "english.prefixes")).read()
    resources = {
        "function/english.words": "".join(w + "\n" for w in FUNCTION_WORDS),
        "nonbreaking/english.prefixes": prefixes,
        "synonym/english.exceptions": "".join(f"{b}\n{' '.join(f)}\n" for b, f in EXCEPTIONS),
        "synonym/english.synsets": "".join(f"{w}\n{' '.join(s)}\n" for w, s in SYNSETS),
    }
    os.makedirs(os.path.join(OUT, "data"), exist_ok=True)
    with zipfile.ZipFile(os.path.join(OUT, "meteor-1.5.jar"), "w", zipfile.ZIP_DEFLATED) as jar:
        for name, text in resources.items():
            info = zipfile.ZipInfo(name, date_time=(2015, 3, 12, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            jar.writestr(info, text)
    table = "".join(f"0.5\n{a}\n{b}\n" for a, b in PARAPHRASES)
    with open(os.path.join(OUT, "data", "paraphrase-en.gz"), "wb") as f:
        f.write(gzip.compress(table.encode(), mtime=0))
    return resources


def expected(resources):
    """The real jar's scores of CASES with this folder's data, as
    pycocoevalcap's wrapper sends them."""
    import pycocoevalcap

    jar = os.path.join(list(pycocoevalcap.__path__)[0], "meteor", "meteor-1.5.jar")
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "synonym"))
        for name, text in resources.items():
            if name.startswith("synonym/") or name.startswith("function/"):
                open(os.path.join(tmp, name.replace("function/", "")), "w").write(text)
        command = ["java", "-Xmx1G", "-jar", jar, "-", "-", "-stdio", "-l", "en", "-norm",
                   "-s", os.path.join(tmp, "english.words"), "-d", os.path.join(tmp, "synonym"),
                   "-a", os.path.join(OUT, "data", "paraphrase-en.gz")]
        lines = []
        for candidate, references in CASES:
            hypothesis = candidate.replace("|||", "").replace("  ", " ")
            lines.append(" ||| ".join(["SCORE", " ||| ".join(references), hypothesis]))
        scored = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True,
                                check=True).stdout.splitlines()
        evaluated = subprocess.run(command, input="EVAL ||| " + " ||| ".join(scored) + "\n",
                                   capture_output=True, text=True, check=True).stdout.split()
    values = [float(v) for v in evaluated]
    assert len(values) == len(CASES) + 1, evaluated
    return {"pairs": [{"candidate": c, "references": r} for c, r in CASES],
            "segments": values[:-1], "corpus": values[-1]}


def main():
    resources = write_folder()
    if "--expected" in sys.argv[1:]:
        with open(EXPECTED, "w") as f:
            json.dump(expected(resources), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
