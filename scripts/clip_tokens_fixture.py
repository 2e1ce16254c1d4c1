#!/usr/bin/env python3
"""Makes tests/data/clip_tiny_tokens_expected.safetensors: what transformers
computes in float64 as the image tokens of tests/data/clip-tiny's image
tower, for tests/suite/models/clip.rs to compare captune's with on both
backends: every token of the vision model's last layer
(`last_hidden_state`, the class token first) through its
`post_layernorm`, which CLIPModel applies to the class token alone.

- `image_tokens` [3, tokens, width]: of clip_tiny_expected.safetensors's
  `pixel_values`;
- `processed_tokens` [2, tokens, width]: of its `processed_pixels`, what
  CLIPImageProcessor makes of tests/data/clip-images/*.png.

Run after scripts/clip_fixtures.py, whose folder and pixels it reads:
    python3 scripts/clip_tokens_fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPModel

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def tokens(model, pixels):
    vision = model.vision_model
    with torch.no_grad():
        hidden = vision(pixel_values=pixels).last_hidden_state
        return vision.post_layernorm(hidden)


def main():
    model = CLIPModel.from_pretrained(DATA / "clip-tiny").double().eval()
    inputs = load_file(DATA / "clip_tiny_expected.safetensors")
    out = {
        "image_tokens": tokens(model, inputs["pixel_values"].double()),
        "processed_tokens": tokens(model, inputs["processed_pixels"].double()),
    }
    save_file({k: v.float().contiguous() for k, v in out.items()},
              DATA / "clip_tiny_tokens_expected.safetensors")


if __name__ == "__main__":
    main()
