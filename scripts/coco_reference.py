#!/usr/bin/env python3
"""Expected BLEU-1..4, CIDEr-D and ROUGE-L from pycocoevalcap, for the
metric tests: on the test split of a Karpathy-format data set, fold j
takes each image's j-th human caption as the candidate and the other
captions as references (leave one out).

    pip install pycocoevalcap   # its PTBTokenizer needs Java
    python3 scripts/coco_reference.py "$CAPTUNE_FLICKR8K"/dataset_flickr8k.json \
        > tests/data/coco_reference_flickr8k.json
"""
import json
import sys

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer


def main(path):
    images = [i for i in json.load(open(path))["images"] if i["split"] == "test"]
    folds = []
    for j in range(5):
        gts, res = {}, {}
        for n, image in enumerate(images):
            raws = [s["raw"] for s in image["sentences"]]
            if len(raws) <= j:
                continue
            res[n] = [{"caption": raws[j]}]
            gts[n] = [{"caption": r} for k, r in enumerate(raws) if k != j]
        tokenizer = PTBTokenizer()
        gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        cider, _ = Cider().compute_score(gts, res)
        rouge, _ = Rouge().compute_score(gts, res)
        folds.append({
            "fold": j,
            "images": len(res),
            "BLEU-1": bleu[0], "BLEU-2": bleu[1], "BLEU-3": bleu[2], "BLEU-4": bleu[3],
            "CIDEr-D": float(cider), "ROUGE-L": float(rouge),
        })
    json.dump({"source": "pycocoevalcap 1.2, " + path.split("/")[-1], "folds": folds}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
