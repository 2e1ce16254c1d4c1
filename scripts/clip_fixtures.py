#!/usr/bin/env python3
"""Makes tests/data/clip-tiny: a tiny random CLIPModel as transformers saves
it (config.json, model.safetensors), and clip_tiny_expected.safetensors,
what transformers computes with it in float64 for tests/clip.rs to compare
captune with on both backends, so that CI needs no torch:

- `pixel_values` [3, 3, 32, 32] (random, in the normalised range) and the
  image embeddings (the projected, post-layer-normed class output);
- `input_ids` [3, 9], each row some ids then the end id, padded with 0
  after it (`lengths` says how many ids are real), and the text embeddings
  (the projected final-layer-normed state at the end id);
- `logits_per_image` [3, 3]: the learned scale times the cosine of each
  image and text embedding.

The tiny model has CLIP's architecture (quick GELU, a class vector, the
pre-layer-norm, projections without biases) at small widths; its MLP
widths are not multiples of the widths, so a loader that assumed 4x
would fail. Its end id is the vocabulary's last (not 2), so transformers
pools at the first end id, as captune does.

Usage:
    pip install torch transformers
    python3 scripts/clip_fixtures.py
"""

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import CLIPConfig, CLIPModel

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
VOCAB, EOS = 64, 63
LENGTHS = [9, 4, 6]


def main():
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(hidden_size=24, intermediate_size=40, num_attention_heads=4,
                         num_hidden_layers=2, max_position_embeddings=16, vocab_size=VOCAB,
                         hidden_act="quick_gelu", eos_token_id=EOS, bos_token_id=EOS - 1,
                         pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=52, num_attention_heads=4,
                           num_hidden_layers=2, image_size=32, patch_size=8,
                           hidden_act="quick_gelu"),
        projection_dim=12,
    )
    model = CLIPModel(config).eval()
    # Random layer norms and biases: a loader that drops or swaps one fails.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.2)
    folder = DATA / "clip-tiny"
    model.save_pretrained(str(folder), safe_serialization=True)

    model = model.double()
    pixels = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    ids = torch.zeros(3, max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, : n - 1] = torch.randint(1, EOS - 1, (n - 1,))
        ids[row, n - 1] = EOS
        mask[row, :n] = 1
    with torch.no_grad():
        image = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        text_out = model.text_model(input_ids=ids, attention_mask=mask)
        text = model.text_projection(text_out.pooler_output)
        logits = model.logit_scale.exp() * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    save_file(
        {
            "pixel_values": pixels.float().contiguous(),
            "input_ids": ids.double().float().contiguous(),
            "lengths": torch.tensor(LENGTHS, dtype=torch.float32),
            "image_embeds": image.float().contiguous(),
            "text_embeds": text.float().contiguous(),
            "logits_per_image": logits.float().contiguous(),
        },
        str(DATA / "clip_tiny_expected.safetensors"),
    )
    print("logits_per_image", logits)


if __name__ == "__main__":
    main()
