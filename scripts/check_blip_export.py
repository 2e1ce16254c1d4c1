#!/usr/bin/env python3
"""Checks a BLIP folder that `captune export` wrote with transformers itself:
the folder loads as BlipForConditionalGeneration, and its `generate` gives
the pieces captune gave for the same pictures.

    captune export RUN --hf OUT
    captune caption --checkpoint hf:OUT --json --max-words 9 [--prompt TEXT] A.png B.png > captions.jsonl
    python3 scripts/check_blip_export.py OUT --captions captions.jsonl --max-words 9 [--prompt TEXT]
    python3 scripts/check_blip_export.py OUT --same-as BLIP_FOLDER

With --same-as, every tensor of the export equals the BLIP folder's bit for
bit and its config.json is that folder's: what an untrained decoder must
give. Greedy decoding as captune's: the padding and start ids suppressed,
max_new_tokens = --max-words + 1, a caption that did not end cut to
--max-words pieces. Pixels come from BLIP's PIL image
processor, as captune computes them. It exits with status 1 on any
difference.
"""
import argparse
import json
import sys

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import BlipForConditionalGeneration
from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil


def same_as(folder, base):
    different = []
    with safe_open(f"{folder}/model.safetensors", "pt") as ours, safe_open(f"{base}/model.safetensors", "pt") as theirs:
        if set(ours.keys()) != set(theirs.keys()):
            different.append(f"tensor names differ: {sorted(set(ours.keys()) ^ set(theirs.keys()))}")
        for name in sorted(set(ours.keys()) & set(theirs.keys())):
            if not torch.equal(ours.get_tensor(name), theirs.get_tensor(name).to(torch.float32)):
                different.append(name)
    with open(f"{folder}/config.json") as a, open(f"{base}/config.json") as b:
        if json.load(a) != json.load(b):
            different.append("config.json")
    return different


def generated(folder, captions, max_words, prompt):
    model = BlipForConditionalGeneration.from_pretrained(folder).eval()
    processor = BlipImageProcessorPil.from_pretrained(folder)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    pad, start = model.config.text_config.pad_token_id, model.config.text_config.bos_token_id
    sep = model.config.text_config.sep_token_id
    fed = None
    if prompt is not None:
        pieces = tokenizer.encode(prompt, add_special_tokens=False).ids
        cls = tokenizer.token_to_id("[CLS]")
        # As BLIP's processor gives a text: generate turns [CLS] into the
        # start id and drops the last [SEP].
        fed = torch.tensor([[cls, *pieces, sep]] * len(captions))
    images = [Image.open(c["file"]).convert("RGB") for c in captions]
    pixels = torch.from_numpy(np.array(processor(images)["pixel_values"]))
    with torch.no_grad():
        out = model.generate(
            pixel_values=pixels,
            input_ids=fed,
            max_new_tokens=max_words + 1,
            num_beams=1,
            do_sample=False,
            suppress_tokens=[pad, start],
        )
    skip = 1 + (len(pieces) if prompt is not None else 0)
    rows = []
    for row in out.tolist():
        pieces_after = [p for p in row[skip:] if p != pad]
        if sep in pieces_after:
            pieces_after = pieces_after[: pieces_after.index(sep) + 1]
        # captune cuts a caption that did not end to --max-words pieces.
        rows.append(pieces_after[:max_words] if sep not in pieces_after else pieces_after)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--captions", help="captune caption --json output for the export")
    p.add_argument("--max-words", type=int, default=9)
    p.add_argument("--prompt")
    p.add_argument("--same-as", help="a BLIP folder the export must equal")
    a = p.parse_args()
    if not (a.captions or a.same_as):
        p.error("give --captions or --same-as")
    failed = False
    if a.same_as:
        different = same_as(a.folder, a.same_as)
        print("same as", a.same_as, "except:", different or "nothing")
        failed |= bool(different)
    if a.captions:
        with open(a.captions) as f:
            captions = [json.loads(line) for line in f if line.strip()]
        rows = generated(a.folder, captions, a.max_words, a.prompt)
        for caption, row in zip(captions, rows):
            agree = caption["ids"] == row
            print(("same" if agree else "DIFFERENT"), caption["file"], caption["ids"], row)
            failed |= not agree
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
