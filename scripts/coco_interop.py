#!/usr/bin/env python3
"""Checks that a results file written by `captune eval` works with the COCO
tools: pycocotools' loadRes accepts it against the split's annotations, and
pycocoevalcap's BLEU, CIDEr-D and ROUGE-L score it. Prints the scores as
JSON (keys as `captune score --json`). Used by tests/suite/cli/commands.rs when
pycocoevalcap is installed (pip install pycocoevalcap).

    python3 scripts/coco_interop.py KARPATHY_SPLIT_FILE SPLIT RESULTS.json

PTBTokenizer needs Java; without it, captions are lower-cased and split
on spaces after dropping the punctuation PTBTokenizer drops, which gives
the same tokens for captions without clitics or brackets (the shapes
world's).
"""
import json
import re
import shutil
import sys
import tempfile

from pycocotools.coco import COCO
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge


def simple_tokens(text):
    return " ".join(re.sub(r"[.,:;!?]", " ", text.lower()).split())


def main(split_file, split, results_file):
    images = [i for i in json.load(open(split_file))["images"] if i["split"] == split]
    ident = lambda i: i.get("cocoid", i.get("imgid"))
    annotations = {
        "images": [{"id": ident(i)} for i in images],
        "annotations": [
            {"id": k, "image_id": ident(i), "caption": s["raw"]}
            for k, (i, s) in enumerate((i, s) for i in images for s in i["sentences"])
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(annotations, f)
    coco = COCO(f.name)
    results = coco.loadRes(results_file)  # fails on ids that are not the annotations'
    ids = results.getImgIds()
    if shutil.which("java"):
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        tok = PTBTokenizer()
        gts = tok.tokenize({i: coco.imgToAnns[i] for i in ids})
        res = tok.tokenize({i: results.imgToAnns[i] for i in ids})
    else:
        gts = {i: [simple_tokens(a["caption"]) for a in coco.imgToAnns[i]] for i in ids}
        res = {i: [simple_tokens(a["caption"]) for a in results.imgToAnns[i]] for i in ids}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    rouge, _ = Rouge().compute_score(gts, res)
    scores = {f"BLEU-{n + 1}": b for n, b in enumerate(bleu)}
    scores.update({"CIDEr-D": cider, "ROUGE-L": rouge, "images": len(ids)})
    print(json.dumps(scores))


if __name__ == "__main__":
    main(*sys.argv[1:])
