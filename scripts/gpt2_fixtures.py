#!/usr/bin/env python3
"""Makes the GPT-2 fixtures the Rust tests compare captune with, so that
CI needs no torch:

- tests/data/gpt2-tiny/: a tiny random GPT-2 as transformers saves it
  (config.json, model.safetensors) with a byte-level BPE tokenizer trained
  by the `tokenizers` library on Flickr8k's training captions
  (tokenizer.json, vocab.json, merges.txt);
- tests/data/gpt2_tiny_expected.safetensors: two captions' token ids (each
  after <|endoftext|>, padded with it), and transformers' final hidden
  states (after ln_f) and logits for them.

Usage:
    pip install torch transformers tokenizers
    python3 scripts/gpt2_fixtures.py "$CAPTUNE_FLICKR8K"/dataset_flickr8k.json

Runs on the CPU in float64 for the reference numbers, saved as float32.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"
FOLDER = OUT / "gpt2-tiny"
END = "<|endoftext|>"
CAPTIONS = [
    "A dog runs through the grass .",
    "Two children are playing on a swing in the park",
]


def train_tokenizer(split_file: Path) -> PreTrainedTokenizerFast:
    data = json.loads(split_file.read_text())
    captions = [
        s["raw"]
        for image in data["images"]
        if image["split"] == "train"
        for s in image["sentences"]
    ]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(captions, vocab_size=400, min_frequency=2, special_tokens=[END])
    FOLDER.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(FOLDER))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=END, eos_token=END, unk_token=END
    )
    tokenizer.save_pretrained(str(FOLDER))
    return tokenizer


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tokenizer = train_tokenizer(Path(sys.argv[1]))
    end = tokenizer.convert_tokens_to_ids(END)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=end,
        eos_token_id=end,
    )
    model = GPT2LMHeadModel(config).eval()
    # Biases and layer norms away from their initial 0 and 1, so that a
    # mapping that drops or swaps one shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(FOLDER), safe_serialization=True)

    ids = [[end] + tokenizer.encode(c) for c in CAPTIONS]
    length = max(len(i) for i in ids)
    padded = torch.tensor([i + [end] * (length - len(i)) for i in ids])
    model64 = model.double()
    with torch.no_grad():
        out = model64(padded, output_hidden_states=True)
    save_file(
        {
            "ids": padded.to(torch.int32).float(),
            "hidden": out.hidden_states[-1].float().contiguous(),
            "logits": out.logits.float().contiguous(),
        },
        str(OUT / "gpt2_tiny_expected.safetensors"),
        metadata={"captions": json.dumps(CAPTIONS), "lengths": json.dumps([len(i) for i in ids])},
    )
    print(f"wrote {FOLDER} and {OUT / 'gpt2_tiny_expected.safetensors'}: vocabulary {len(tokenizer)}")


if __name__ == "__main__":
    main()
