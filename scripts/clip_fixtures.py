#!/usr/bin/env python3
"""Makes tests/data/clip-tiny: a tiny random CLIPModel as transformers saves
it (config.json, model.safetensors), with a CLIP tokenizer (CLIP's
pipeline: lower case, byte-level pieces ending words with </w>,
<|startoftext|> .. <|endoftext|>) over a BPE vocabulary the `tokenizers`
library trains on Flickr8k's training captions, and
clip_tiny_expected.safetensors,
what transformers computes with it in float64 for tests/suite/models/clip.rs to compare
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

and clip_relevance_expected.safetensors, one CLIP-relevance step of a
captioner over the words RELEVANCE_WORDS with the tiny CLIP as the frozen
listener: random teacher-forced logits `logits` [captions * positions,
vocab], the chosen `captions` (padded with -1), unit image embeddings
`images`; the Gumbel-softmax with the noise captune draws for SEED (its
counter hash, reproduced here), each chosen word's CLIP pieces at as many
of the text tower's positions (the j-th relaxed over every word's j-th
piece, pieces after the fourth as chosen), transformers' text tower fed
those inputs through a hook on its token embedding, -mean cos, and the
gradient at the logits, straight-through (`hard.*`, tau 1) and soft
(`soft.*`, tau 0.5). The captions hold words CLIP splits into several
pieces, one of more than four, an empty caption and one cut at the
tower's 16 positions.

The tiny model has CLIP's architecture (a class vector, the
pre-layer-norm, projections without biases) at small widths, its image
tower with OpenAI's quick GELU and its text tower with the exact GELU
(erf) of other CLIPs; its MLP
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
                         hidden_act="gelu", eos_token_id=eos,
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
    relevance(model, tokenizer)


RELEVANCE_WORDS = ["a", "dog", "runs", "through", "the", "grass", "two", "girls", "play", "in",
                   "skateboarder", "qzxjvkwpfh"]
RELEVANCE_CAPTIONS = [
    "a dog runs through the grass",
    "",
    "two girls play in the grass skateboarder qzxjvkwpfh a dog runs in the grass",
    "skateboarder qzxjvkwpfh girls",
]
SEED = 0x5eed_cafe_0123
CAPTIONER_SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
RELAXED_PIECES = 4


def mix32(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    x ^= x >> 16
    return x


def gumbel(seed, row, step, j):
    """captune's Gumbel noise for (seed, row, step, token), in float32 as it computes it."""
    h = mix32((seed & 0xFFFFFFFF) ^ 0x85EBCA6B)
    for v in (seed >> 32, row, step, j):
        h = mix32(h ^ v)
    u = (np.float32(h >> 8) + np.float32(0.5)) * np.float32(1.0 / 16777216.0)
    return float(-np.log(np.maximum(-np.log(u), np.finfo(np.float32).tiny)))


def relevance(model, tokenizer):
    words = CAPTIONER_SPECIALS + RELEVANCE_WORDS
    end, vocab = 2, len(words)
    clip_end = tokenizer.eos_token_id
    # The captioner's end is CLIP's; its padding and start (masked: no
    # caption holds them) read as nothing; every other id as its word's pieces.
    masked = {0, 1}
    pieces = [[clip_end] if v == end else [] if v in masked
              else tokenizer(w, add_special_tokens=False)["input_ids"] for v, w in enumerate(words)]
    print("pieces per word", {w: len(p) for w, p in zip(words, pieces)})
    captions = [[words.index(w) for w in c.split()] + [end] for c in RELEVANCE_CAPTIONS]
    n, positions = len(captions), max(len(c) for c in captions)
    max_len = model.config.text_config.max_position_embeddings
    table = model.text_model.embeddings.token_embedding.weight.detach()
    slots = min(max(len(p) for p in pieces), RELAXED_PIECES)
    slot_tables = [torch.stack([table[p[j]] if len(p) > j else torch.zeros_like(table[0])
                                for p in pieces]) for j in range(slots)]
    torch.manual_seed(1)
    logits = torch.randn(n * positions, vocab, dtype=torch.float64).float().double()
    images = F.normalize(torch.randn(n, model.config.projection_dim, dtype=torch.float64), dim=-1)
    images = images.float().double()
    noise = torch.tensor([[gumbel(SEED, r // positions, r % positions, j) for j in range(vocab)]
                          for r in range(n * positions)], dtype=torch.float64)
    out = {"logits": logits.float(), "images": images.float(),
           "captions": torch.tensor([c + [-1] * (positions - len(c)) for c in captions],
                                    dtype=torch.float32)}
    for name, tau, soft in [("hard", 1.0, False), ("soft", 0.5, True)]:
        z = logits.clone().requires_grad_(True)
        y = torch.softmax((z + noise) / tau, dim=-1)
        inputs, ids = [], []
        for c, caption in enumerate(captions):
            x, seq = [table[tokenizer.bos_token_id]], [tokenizer.bos_token_id]
            for t, token in enumerate(caption):
                yt = y[c * positions + t]
                for j, piece in enumerate(pieces[token]):
                    if len(seq) == max_len:
                        break
                    if j >= slots:
                        x.append(table[piece])
                    elif soft:
                        x.append(yt @ slot_tables[j])
                    else:  # straight-through: the piece forward, y's gradient back
                        x.append(table[piece] + (yt - yt.detach()) @ slot_tables[j])
                    seq.append(piece)
            if seq[-1] != clip_end:
                if len(seq) == max_len:  # cut: the end in place of the last, no gradient
                    x[-1], seq[-1] = table[clip_end], clip_end
                else:
                    x.append(table[clip_end])
                    seq.append(clip_end)
            inputs.append(torch.stack(x + [table[clip_end]] * (max_len - len(x))))
            ids.append(seq + [clip_end] * (max_len - len(seq)))
        lengths = [s.index(clip_end) + 1 for s in ids]
        mask = torch.tensor([[1] * k + [0] * (max_len - k) for k in lengths])
        relaxed = torch.stack(inputs)
        hook = model.text_model.embeddings.token_embedding.register_forward_hook(
            lambda module, args, output: relaxed)
        text = model.text_projection(
            model.text_model(input_ids=torch.tensor(ids), attention_mask=mask).pooler_output)
        hook.remove()
        loss = -F.cosine_similarity(text, images, dim=-1).mean()
        loss.backward()
        print(f"relevance {name}: loss {loss.item():.6f}, ids {ids}")
        out[f"{name}.loss"] = loss.detach().reshape(1).float()
        out[f"{name}.d_logits"] = z.grad.float()
    save_file(out, str(DATA / "clip_relevance_expected.safetensors"),
              metadata={"words": json.dumps(RELEVANCE_WORDS), "seed": str(SEED),
                        "made_by": "scripts/clip_fixtures.py (PyTorch " + torch.__version__
                                   + ", float64)"})


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
