#!/usr/bin/env python3
"""Makes tests/data/clip-tiny: a tiny random CLIPModel as transformers saves
it (config.json, model.safetensors), with a CLIP tokenizer (CLIP's
pipeline: lower case, byte-level pieces ending words with </w>,
<|startoftext|> .. <|endoftext|>) over a BPE vocabulary the `tokenizers`
library trains on Flickr8k's training captions, and
clip_tiny_expected.safetensors,
what transformers computes with it in float64 for tests/clip.rs to compare
captune with on both backends, so that CI needs no torch:

- `pixel_values` [3, 3, 32, 32] (random, in the normalised range) and the
  image embeddings (the projected, post-layer-normed class output);
- `input_ids` [3, 9], each row some ids then the end id, padded with 0
  after it (`lengths` says how many ids are real), and the text embeddings
  (the projected final-layer-normed state at the end id);
- `logits_per_image` [3, 3]: the learned scale times the cosine of each
  image and text embedding;
- `caption_ids` [3, 16] and `caption_embeds`: three captions (one longer
  than the text tower's 16 positions, cut as the tokenizer cuts with
  truncation) as the tokenizer encodes them, padded with -1, and their
  text embeddings;
- `processed_pixels` [2, 3, 32, 32]: what CLIPImageProcessor (its PIL
  backend, OpenAI's preprocessing) makes of tests/data/clip-images/*.png,
  two synthetic pictures this script draws (one wide, one tall; smooth
  shading, hard edges and fine stripes, so that resampling shows), with
  the folder's preprocessor_config.json (shortest side 40, centre crop
  32, CLIP's mean and std), and `processed_embeds`, their image
  embeddings;
- `clip_s` and `ref_clip_s`: the mean CLIPScore and RefCLIPScore of
  CANDIDATES for the two pictures, with REFERENCES, as Hessel et al.
  (2021) define them (w = 2.5, the prompt "A photo depicts " before every
  caption and reference, RefCLIP-S the harmonic mean of CLIP-S and the
  best reference cosine, floored at 0).

The tiny model has CLIP's architecture (quick GELU, a class vector, the
pre-layer-norm, projections without biases) at small widths; its MLP
widths are not multiples of the widths, so a loader that assumed 4x
would fail. Its end id is the vocabulary's last (not 2), so transformers
pools at the first end id, as captune does.

The tokenizer's trainer breaks ties between equally frequent merges in no
fixed order, so two runs may number a few pieces differently: the folder
and the expected file are always made together.

Usage:
    pip install torch transformers tokenizers pillow
    python3 scripts/clip_fixtures.py [FLICKR8K_FOLDER]   # default: ../shared/data/flickr8k
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
import numpy as np
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
LENGTHS = [9, 4, 6]
# For the two pictures, wide then tall.
CANDIDATES = ["a wide picture with a blue circle", "two girls play in the grass"]
REFERENCES = [["a striped picture of a circle", "colours fade from left to right"],
              ["a tall striped picture", "a dog runs through the water"]]
CAPTIONS = [
    "A black dog is running through the grass .",
    "Two girls play",
    "A man in a red shirt climbs a rock wall while another man watches from below .",
]


def train_tokenizer(flickr8k):
    """CLIP's tokenizer over a BPE vocabulary trained on Flickr8k's training
    captions: words split at spaces, bytes as GPT-2 maps them, </w> ending
    each word."""
    data = json.loads((flickr8k / "dataset_flickr8k.json").read_text())
    captions = [s["raw"].lower() for image in data["images"] if image["split"] == "train"
                for s in image["sentences"]]
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, end_of_word_suffix="</w>",
                                  special_tokens=["<|startoftext|>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(captions, trainer)
    model = json.loads(bpe.to_str())["model"]
    return CLIPTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])


def main():
    flickr8k = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data" / "flickr8k"
    tokenizer = train_tokenizer(flickr8k)
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(hidden_size=24, intermediate_size=40, num_attention_heads=4,
                         num_hidden_layers=2, max_position_embeddings=16, vocab_size=vocab,
                         hidden_act="quick_gelu", eos_token_id=eos,
                         bos_token_id=tokenizer.bos_token_id, pad_token_id=eos),
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
        # The random towers' embeddings point away from each other (every
        # image-text cosine below 0), where CLIPScore's floor at 0 would hide
        # its arithmetic: the text projection's sign, as random as the other,
        # turns them towards each other.
        model.text_projection.weight.neg_()
    folder = DATA / "clip-tiny"
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))

    processor = CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(str(folder))
    paths = draw_images(DATA / "clip-images")
    processed = processor(images=[Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]

    model = model.double()
    pixels = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    ids = torch.zeros(3, max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, : n - 1] = torch.randint(2, vocab, (n - 1,))
        ids[row, n - 1] = eos
        mask[row, :n] = 1
    with torch.no_grad():
        image = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        text_out = model.text_model(input_ids=ids, attention_mask=mask)
        text = model.text_projection(text_out.pooler_output)
        logits = model.logit_scale.exp() * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
        encoded = tokenizer(CAPTIONS, padding=True, truncation=True, max_length=16, return_tensors="pt")
        caption_embeds = model.text_projection(model.text_model(**encoded).pooler_output)
        processed_embeds = model.visual_projection(
            model.vision_model(pixel_values=processed.double()).pooler_output)

        def text_features(texts):
            t = tokenizer(["A photo depicts " + x for x in texts], padding=True, truncation=True,
                          max_length=16, return_tensors="pt")
            return F.normalize(model.text_projection(model.text_model(**t).pooler_output), dim=-1)

        images = F.normalize(processed_embeds, dim=-1)
        candidates = text_features(CANDIDATES)
        clip_s = 2.5 * (images * candidates).sum(-1).clamp(min=0)
        ref_clip_s = []
        for k, refs in enumerate(REFERENCES):
            best = (text_features(refs) @ candidates[k]).max().clamp(min=0)
            ref_clip_s.append(2 * clip_s[k] * best / (clip_s[k] + best))
        print("CLIP-S", clip_s.tolist(), "RefCLIP-S", [r.item() for r in ref_clip_s])
    save_file(
        {
            "pixel_values": pixels.float().contiguous(),
            "input_ids": ids.double().float().contiguous(),
            "lengths": torch.tensor(LENGTHS, dtype=torch.float32),
            "image_embeds": image.float().contiguous(),
            "text_embeds": text.float().contiguous(),
            "logits_per_image": logits.float().contiguous(),
            "caption_ids": encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -1).float(),
            "caption_embeds": caption_embeds.float().contiguous(),
            "processed_pixels": processed.float().contiguous(),
            "processed_embeds": processed_embeds.float().contiguous(),
            "clip_s": clip_s.mean().reshape(1).float(),
            "ref_clip_s": torch.stack(ref_clip_s).mean().reshape(1).float(),
        },
        str(DATA / "clip_tiny_expected.safetensors"),
    )
    print("logits_per_image", logits)


def draw_images(folder):
    """Two RGB pictures: 70 x 45 and 37 x 90 pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (w, h) in [("wide.png", (70, 45)), ("tall.png", (37, 90))]:
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        r = 255 * x / (w - 1)
        g = 255 * (0.5 + 0.5 * np.sin(x / 3.0 + y / 5.0))
        b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 3) ** 2, 230.0, 20.0)
        b = np.where((x.astype(int) // 2) % 2 == 0, b, 255 - b)
        rgb = np.stack([r, g, b], axis=-1).round().clip(0, 255).astype(np.uint8)
        path = folder / name
        Image.fromarray(rgb, "RGB").save(path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
