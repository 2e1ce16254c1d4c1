#!/usr/bin/env python3
"""A tiny METEOR data folder in the layout of METEOR 1.5's (and
pycocoevalcap's): meteor-1.5.jar holding only the resources captune reads
(deflated, as the real jar stores them) and data/paraphrase-en.gz. Its
words are made up here; the loaders' fuzz test damages copies of it.

    python3 scripts/meteor_tiny_data.py   # writes tests/data/meteor/tiny/
"""
import gzip
import os
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "meteor", "tiny")

RESOURCES = {
    "function/english.words": "a\nthe\nof\non\nis\n",
    "nonbreaking/english.prefixes": "# prefixes\nMr\nNo #NUMERIC_ONLY#\n",
    "synonym/english.exceptions": "goose\ngeese\nrun\nran\n",
    "synonym/english.synsets": "big\n00000001 00000002\nlarge\n00000002\ndog\n00000003\nhound\n00000003\n",
}
PARAPHRASES = [("0.5", "a lot of", "many"), ("0.4", "rides", "is riding"), ("0.1", "grass", "lawn")]


def main():
    os.makedirs(os.path.join(OUT, "data"), exist_ok=True)
    with zipfile.ZipFile(os.path.join(OUT, "meteor-1.5.jar"), "w", zipfile.ZIP_DEFLATED) as jar:
        for name, text in RESOURCES.items():
            info = zipfile.ZipInfo(name, date_time=(2015, 3, 12, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            jar.writestr(info, text)
    table = "".join(f"{p}\n{a}\n{b}\n" for p, a, b in PARAPHRASES)
    with open(os.path.join(OUT, "data", "paraphrase-en.gz"), "wb") as f:
        f.write(gzip.compress(table.encode(), mtime=0))


if __name__ == "__main__":
    main()
