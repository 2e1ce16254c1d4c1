#!/usr/bin/env python3
"""The perplexity of captions under tests/data/gpt2-tiny as transformers
computes it (its perplexity guide: the model's own loss with the ids as
labels), for tests/suite/evaluation/fluency.rs. CI needs no torch.

Each caption is read as `<|endoftext|>` and then the folder tokenizer's
pieces of it, cut to the model's positions; the loss is the mean negative
log-likelihood of every id after the first, so each piece is scored and
no end is. Writes tests/data/gpt2_tiny_perplexity.json: each caption's
summed negative log-likelihood and scored-token count, and the mean and
corpus perplexities, in float64.

    pip install torch transformers
    python3 scripts/perplexity_fixtures.py
"""
import json
import math
from pathlib import Path

import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
FOLDER = DATA / "gpt2-tiny"
CAPTIONS = [
    "a dog runs through the grass",
    "two children are playing on a swing in the park .",
    "dog",
    "",
    "A man, in a red shirt; climbs -- a (very) tall rock!",
    "a girl in a pink dress is jumping into a pool while her brother and a small brown dog "
    "watch from the steps beside a blue umbrella on a sunny afternoon",
    "caf\u00e9 na\u00efve \u00fcber",
]


def main():
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    model = GPT2LMHeadModel.from_pretrained(FOLDER).to(torch.float64).eval()
    end, positions = tokenizer.eos_token_id, model.config.n_positions
    rows = []
    for text in CAPTIONS:
        ids = ([end] + tokenizer(text, add_special_tokens=False)["input_ids"])[:positions]
        if len(ids) < 2:
            rows.append({"text": text, "nll": 0.0, "tokens": 0})
            continue
        ids = torch.tensor([ids])
        with torch.no_grad():
            loss = float(model(ids, labels=ids).loss)
        rows.append({"text": text, "nll": loss * (ids.shape[1] - 1), "tokens": ids.shape[1] - 1})
    scored = [r for r in rows if r["tokens"]]
    mean = sum(math.exp(r["nll"] / r["tokens"]) for r in scored) / len(scored)
    corpus = math.exp(sum(r["nll"] for r in scored) / sum(r["tokens"] for r in scored))
    out = {"made_by": "scripts/perplexity_fixtures.py (PyTorch " + torch.__version__ + ", float64)",
           "captions": rows, "mean": mean, "corpus": corpus}
    (DATA / "gpt2_tiny_perplexity.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for r in rows:
        print(f"{r['tokens']:3} {r['nll']:10.4f} {r['text']!r}")
    print(f"mean {mean:.6f} corpus {corpus:.6f}")


if __name__ == "__main__":
    main()
