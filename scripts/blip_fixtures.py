#!/usr/bin/env python3
"""Makes tests/data/blip-tiny: a tiny random BlipForConditionalGeneration as
transformers saves it (config.json, model.safetensors), and
blip_tiny_expected.safetensors, what transformers computes with it in
float64 (stored as float32, ids too) for tests/suite/models/blip.rs to
compare captune with on both backends, so that CI needs no torch:

- `pixel_values` [2, 3, 32, 32] (random, in the normalised range) and
  `image_tokens` [2, 17, 12]: the vision tower's last hidden states (after
  its post_layernorm), what the text decoder cross-attends to;
- `input_ids` [2, 6]: two captions fed as BLIP's decoder reads them, its
  start id (`bos_token_id`, BLIP's [DEC]) then pieces, padded with 0 after
  their end (`lengths` says how many ids are fed; a caption's last id is
  the end id, [SEP], not fed);
- `logits` [2, 6, vocab]: the text decoder's logits;
- `processed_pixels` [2, 3, 32, 32]: what BlipImageProcessor (its PIL
  backend) makes of tests/data/clip-images/{wide,tall}.png with the
  folder's preprocessor_config.json (both sides resized to 32, bicubic,
  no crop; CLIP's mean and std), and `processed_tokens`, their image
  tokens. Made with Pillow 12 (`pip install "pillow<13"`): Pillow 13 runs
  the vertical pass first for some shapes (the tall picture's among
  them), which moves some bytes by one, and captune computes Pillow 12's
  order, the horizontal pass first;
- `greedy_ids` and `beam_ids` [2, 10]: the pieces `generate` gives for
  the two pictures (after the start id; rows padded with -1), greedy and
  with 3 beams (length_penalty 0, early_stopping "never"), at most 10 new
  pieces, with the padding and start ids suppressed as captune's policy
  masks them; and `prompt_greedy_ids`, greedy after the prompt "a
  picture of" (fed as BLIP's processor gives it, [CLS] a picture of
  [SEP], which generate turns into [DEC] a picture of), the pieces after
  the prompt;
- `loss`: the mean over the captions' real targets of -log softmax at the
  target of the logits under captune's policy (-inf at the padding and
  start ids), and `grad.NAME`: its gradient with respect to every text
  decoder tensor, under transformers' names.

The folder's tokenizer.json is a BERT WordPiece tokenizer (lower case,
BERT's pre-tokenizer, `##` continuations, [CLS] .. [SEP] around a text)
over WORDS, with BLIP's [DEC] at the start id.

The model has BLIP's architecture at small widths: a ViT with a class
token and post_layernorm, a BERT text decoder (post-LN, an embedding
layer norm, cross-attention to the image tokens in every layer, the exact
GELU, layer-norm epsilon 1e-12) whose prediction head's decoder is tied
to the word embeddings. The text hidden size differs from the vision
width, the MLP widths are not multiples of the widths, and the start id
is not 0, 1 or 2, so a loader that confused any of them would fail.

`blip_fixtures.py smile` adds blip_tiny_smile_expected.safetensors, one
SMILE step on the folder as it is (see `smile`), and `blip_fixtures.py
vision` blip_tiny_vision_expected.safetensors, one MLE step of the whole
model, vision tower included (see `vision`).
"""

import json
import os

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import BlipConfig, BlipForConditionalGeneration
from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

ROOT = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
FOLDER = os.path.join(ROOT, "blip-tiny")
VOCAB, BOS, SEP, PAD = 50, 47, 2, 0
WORDS = [
    "[PAD]", "[UNK]", "[SEP]", "[CLS]", "[MASK]", "a", "an", "the", "picture", "of",
    "dog", "cat", "man", "woman", "red", "blue", "green", "ball", "on", "in",
    "with", "grass", "runs", "sits", "is", "and", "small", "large", "black", "white",
    "two", "three", "##s", "##ing", "##ed", "play", "walk", "water", "street", "car",
    "bike", "tree", "holding", "near", "jump", "park", "boy", "[DEC]", "girl", ".",
]


def save_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    assert len(WORDS) == VOCAB and WORDS.index("[DEC]") == BOS
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 3), ("[SEP]", SEP)]
    )
    tok.add_special_tokens(["[PAD]", "[UNK]", "[SEP]", "[CLS]", "[MASK]", "[DEC]"])
    tok.save(os.path.join(FOLDER, "tokenizer.json"))


def id_rows(sequences, width):
    rows = torch.full((len(sequences), width), -1.0)
    for i, s in enumerate(sequences):
        rows[i, : len(s)] = torch.tensor(s, dtype=torch.float32)
    return rows


def main():
    torch.manual_seed(0)
    config = BlipConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=16,
            encoder_hidden_size=12,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=32,
            bos_token_id=BOS,
            eos_token_id=SEP,
            sep_token_id=SEP,
            pad_token_id=PAD,
        ),
        vision_config=dict(
            hidden_size=12,
            intermediate_size=28,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            projection_dim=12,
        ),
        projection_dim=12,
    )
    model = BlipForConditionalGeneration(config).eval()
    # Larger weights than the initialisation, so that every path shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight") or "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
        # The end a little less likely, so that captions have some length.
        model.text_decoder.cls.predictions.bias[SEP] -= 2.0
    os.makedirs(FOLDER, exist_ok=True)
    model.save_pretrained(FOLDER, safe_serialization=True)
    processor = BlipImageProcessorPil(size={"height": 32, "width": 32})
    processor.save_pretrained(FOLDER)
    save_tokenizer()

    model = model.double()
    pixels = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        image_tokens = model.vision_model(pixel_values=pixels).last_hidden_state
    images = [Image.open(os.path.join(ROOT, "clip-images", n)).convert("RGB") for n in ("wide.png", "tall.png")]
    processed = torch.from_numpy(np.array(processor(images)["pixel_values"])).double()
    with torch.no_grad():
        processed_tokens = model.vision_model(pixel_values=processed).last_hidden_state
    generated = {}
    prompt = [5, 8, 9]  # a picture of
    prompted = torch.tensor([[3, *prompt, SEP]] * 2)
    for name, beams, text in (
        ("greedy_ids", 1, None),
        ("beam_ids", 3, None),
        ("prompt_greedy_ids", 1, prompted),
    ):
        fed = [BOS] + (prompt if text is not None else [])
        with torch.no_grad():
            out = model.generate(
                pixel_values=processed,
                input_ids=text,
                max_new_tokens=10,
                num_beams=beams,
                do_sample=False,
                length_penalty=0.0,
                early_stopping="never" if beams > 1 else False,
                suppress_tokens=[PAD, BOS],
            )
        rows = []
        for row in out.tolist():
            assert row[: len(fed)] == fed, row
            pieces = row[len(fed) :]
            if SEP in pieces:
                pieces = pieces[: pieces.index(SEP) + 1]
            rows.append(pieces)
        generated[name] = id_rows(rows, 10)
        print(name, rows)
    captions = [[BOS, 5, 17, 33, 8, 21, SEP], [BOS, 9, 40, SEP]]
    positions = 6
    input_ids = torch.full((2, positions), PAD, dtype=torch.long)
    targets = torch.full((2, positions), -1, dtype=torch.long)
    lengths = []
    for i, c in enumerate(captions):
        fed = c[:-1]
        input_ids[i, : len(fed)] = torch.tensor(fed)
        targets[i, : len(fed)] = torch.tensor(c[1:])
        lengths.append(len(fed))
    decoder = model.text_decoder
    decoder.zero_grad()
    out = decoder(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        encoder_hidden_states=image_tokens,
        return_dict=True,
    )
    policy = out.logits.clone()
    policy[:, :, PAD] = float("-inf")
    policy[:, :, BOS] = float("-inf")
    log_p = torch.log_softmax(policy, dim=-1)
    real = targets >= 0
    picked = log_p.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    loss = -torch.where(real, picked, 0.0).sum() / real.sum()
    loss.backward()

    expected = {
        "pixel_values": pixels,
        "image_tokens": image_tokens,
        "processed_pixels": processed,
        "processed_tokens": processed_tokens,
        **generated,
        "input_ids": input_ids.to(torch.int64),
        "lengths": torch.tensor(lengths, dtype=torch.int64),
        "logits": out.logits.detach(),
        "loss": loss.detach().reshape(1),
    }
    for name, p in decoder.named_parameters():
        if p.grad is not None:
            expected[f"grad.text_decoder.{name}"] = p.grad.detach().clone()
    # Computed in float64, stored as float32 (ids too), as captune reads them.
    save_file(
        {k: v.float().contiguous() for k, v in expected.items()},
        os.path.join(ROOT, "blip_tiny_expected.safetensors"),
    )
    with open(os.path.join(FOLDER, "config.json")) as f:
        saved = json.load(f)
    print("text_config keys:", sorted(saved["text_config"].keys()))
    print("loss", loss.item(), "tensors", len(expected))


def stored_step():
    """The folder's model in float64, the main fixture's records, and its
    captions as fed ids and targets (each caption's next pieces, then
    [SEP]; -1 past its end)."""
    from safetensors.torch import load_file

    model = BlipForConditionalGeneration.from_pretrained(FOLDER).double().eval()
    stored = load_file(os.path.join(ROOT, "blip_tiny_expected.safetensors"))
    lengths = [int(n) for n in stored["lengths"]]
    fed = stored["input_ids"].long()
    targets = torch.full(fed.shape, -1, dtype=torch.long)
    for i, n in enumerate(lengths):
        targets[i, : n - 1] = fed[i, 1:n]
        targets[i, n - 1] = SEP
    return model, stored, fed, targets


def policy_logits(model, fed, image_tokens):
    """The text decoder's logits of the fed ids under captune's policy
    (the padding and [DEC] at -inf)."""
    logits = model.text_decoder(
        input_ids=fed,
        attention_mask=torch.ones_like(fed),
        encoder_hidden_states=image_tokens,
        return_dict=True,
    ).logits
    policy = logits.clone()
    policy[:, :, [PAD, BOS]] = float("-inf")
    return policy


def smile():
    """`blip_fixtures.py smile`: blip_tiny_smile_expected.safetensors, one
    step of SMILE's recipe mix (0.01 MLE + 0.99 SMILE, first token by MLE)
    on the folder as it is, from the image tokens and captions the main
    fixture stores (so that both sides start from the same float32
    values): `loss` and `grad.NAME` for every text decoder tensor.

    SMILE (Yue et al., 2023) as captune computes it: at each step a
    softmax over the unique ids of the caption's targets (its pieces and
    [SEP]) instead of the whole vocabulary, except step 0, whose softmax
    is the whole policy's (padding and [DEC] at -inf); the mean over the
    captions' real targets.
    """
    model, stored, fed, targets = stored_step()
    decoder = model.text_decoder
    decoder.zero_grad()
    policy = policy_logits(model, fed, stored["image_tokens"].double())
    real = targets >= 0

    def mean_nll(allowed):
        masked = policy.masked_fill(~allowed, float("-inf"))
        picked = torch.log_softmax(masked, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return -torch.where(real, picked, 0.0).sum() / real.sum()

    allowed = torch.zeros(policy.shape, dtype=torch.bool)
    for r in range(fed.shape[0]):
        allowed[r, :, [int(t) for t in targets[r] if int(t) >= 0]] = True
    allowed[:, 0, :] = True
    everything = torch.ones(policy.shape, dtype=torch.bool)
    loss = 0.01 * mean_nll(everything) + 0.99 * mean_nll(allowed)
    loss.backward()
    expected = {"loss": loss.detach().reshape(1)}
    for name, p in decoder.named_parameters():
        if p.grad is not None:
            expected[f"grad.text_decoder.{name}"] = p.grad.detach().clone()
    save_file(
        {k: v.float().contiguous() for k, v in expected.items()},
        os.path.join(ROOT, "blip_tiny_smile_expected.safetensors"),
    )
    print("smile loss", loss.item(), "tensors", len(expected))


def vision():
    """`blip_fixtures.py vision`: blip_tiny_vision_expected.safetensors,
    one MLE step of the whole model as `captune train --train-vision`
    takes it: from the stored `pixel_values` through the vision tower
    (post_layernorm included) into the text decoder, on the stored
    captions, the main fixture's loss under captune's policy; `loss` and
    `grad.NAME` for every tensor of the vision tower and the text decoder.
    """
    model, stored, fed, targets = stored_step()
    pixels = stored["pixel_values"].double()
    model.zero_grad()
    image_tokens = model.vision_model(pixel_values=pixels).last_hidden_state
    policy = policy_logits(model, fed, image_tokens)
    real = targets >= 0
    picked = torch.log_softmax(policy, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    loss = -torch.where(real, picked, 0.0).sum() / real.sum()
    loss.backward()
    expected = {"loss": loss.detach().reshape(1)}
    for module in ("vision_model", "text_decoder"):
        for name, p in getattr(model, module).named_parameters():
            if p.grad is not None:
                expected[f"grad.{module}.{name}"] = p.grad.detach().clone()
    save_file(
        {k: v.float().contiguous() for k, v in expected.items()},
        os.path.join(ROOT, "blip_tiny_vision_expected.safetensors"),
    )
    print("vision loss", loss.item(), "tensors", len(expected))


if __name__ == "__main__":
    import sys

    {"smile": smile, "vision": vision}.get(" ".join(sys.argv[1:]), main)()
