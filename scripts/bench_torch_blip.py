#!/usr/bin/env python3
"""PyTorch reference for `captune bench train|decode` on a BLIP folder, and
the maker of a random BLIP folder of BLIP-base's shapes to time both on
(no real weights are needed for speed):

    python3 scripts/bench_torch_blip.py make FOLDER
    python3 scripts/bench_torch_blip.py train FOLDER [--batch 8] [--max-len 21] [--steps 5] [--train-vision] [--json]
    python3 scripts/bench_torch_blip.py decode FOLDER [--images 16] [--max-len 21] [--json]

`make` writes `BlipForConditionalGeneration(BlipConfig())` (BLIP-base:
a ViT-B/16 at 384 pixels, a 12-layer BERT-base text decoder with
cross-attention, 30524 ids) with random weights, a WordPiece
tokenizer.json over synthetic pieces with BERT's special ids and BLIP's
[DEC], and BLIP's processor config.

`train` times what `captune bench train --config C` times with C's
`decoder = "hf:FOLDER"`, `batch` and `max_len`: the vision tower frozen
and its image tokens computed once (random here, [batch, 577, 768]), then
each step the text decoder's forward over full-length synthetic captions
([DEC], max_len - 2 random pieces, [SEP]), the MLE loss, backward,
gradient clipping at 1 and AdamW. With `--train-vision` (C's
`train_vision = true`) the whole model trains: each step the batch's
pixels (random, [batch, 3, 384, 384]) go through the vision tower into the
decoder, and the backward, clipping and AdamW cover both. `decode` times greedy decoding of
`--images` images' tokens, 64 at once, with the text decoder's KV cache
and the image tokens' keys and values computed once (as transformers'
`generate` does), padding and [DEC] suppressed, up to max_len - 1 pieces.
Both print the process's peak memory. TF32 is off on CUDA.
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F

PAD, UNK, CLS, SEP, MASK, DEC, ENC = 0, 100, 101, 102, 103, 30522, 30523


def make(folder):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders
    from transformers import BlipConfig, BlipForConditionalGeneration
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    torch.manual_seed(0)
    model = BlipForConditionalGeneration(BlipConfig()).eval()
    model.save_pretrained(folder, safe_serialization=True)
    BlipImageProcessorPil(size={"height": 384, "width": 384}).save_pretrained(folder)
    # BERT's layout: [PAD], unused ids, [UNK] [CLS] [SEP] [MASK], pieces
    # (words and continuations), then BLIP's [DEC] and [ENC].
    vocab = {"[PAD]": PAD, "[UNK]": UNK, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK, "[DEC]": DEC, "[ENC]": ENC}
    vocab.update({f"[unused{i}]": i for i in range(1, UNK)})
    vocab.update({(f"w{i}" if i % 2 else f"##p{i}"): i for i in range(MASK + 1, DEC)})
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"])
    tokenizer.save(f"{folder}/tokenizer.json")
    print(f"{folder}: {sum(p.numel() for p in model.parameters())} parameters")


def memory():
    return {"peak_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def load(folder, dev):
    from transformers import BlipForConditionalGeneration

    model = BlipForConditionalGeneration.from_pretrained(folder).to(dev)
    v = model.config.vision_config
    tokens = (v.image_size // v.patch_size) ** 2 + 1
    return model, tokens, v.hidden_size


def train(a, dev):
    model, tokens, width = load(a.folder, dev)
    decoder = model.text_decoder.train()
    trained = list(decoder.parameters())
    if a.train_vision:
        trained += list(model.vision_model.train().parameters())
    opt = torch.optim.AdamW(trained, lr=1e-5, weight_decay=0.01)
    t = a.max_len - 1
    vocab = model.config.text_config.vocab_size
    side = model.config.vision_config.image_size
    pixels = torch.randn(a.batch, 3, side, side, device=dev)
    frozen_tokens = torch.randn(a.batch, tokens, width, device=dev) * 0.05
    words = torch.randint(MASK + 1, DEC, (a.batch, t - 1), device=dev)
    inputs = torch.cat([torch.full((a.batch, 1), DEC, device=dev), words], dim=1)
    targets = torch.cat([words, torch.full((a.batch, 1), SEP, device=dev)], dim=1)

    def step():
        image_tokens = (model.vision_model(pixel_values=pixels).last_hidden_state
                        if a.train_vision else frozen_tokens)
        logits = decoder(input_ids=inputs, encoder_hidden_states=image_tokens, return_dict=True).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step().item()
    seconds = (time.perf_counter() - start) / a.steps
    return {"op": "train", "batch": a.batch, "tokens_per_step": a.batch * t,
            "parameters": sum(p.numel() for p in trained), "train_vision": a.train_vision,
            "seconds_per_step": seconds, "tokens_per_s": a.batch * t / seconds}


def decode(a, dev):
    model, tokens, width = load(a.folder, dev)
    decoder = model.text_decoder.eval()
    torch.manual_seed(1)
    image_tokens = torch.rand(a.images, tokens, width, device=dev) * 0.2 - 0.1
    generated = 0
    start = time.perf_counter()
    with torch.no_grad():
        for first in range(0, a.images, 64):
            memory_rows = image_tokens[first:first + 64]
            out = decoder.generate(
                input_ids=torch.full((len(memory_rows), 1), DEC, device=dev),
                encoder_hidden_states=memory_rows,
                max_new_tokens=a.max_len - 1,
                do_sample=False, num_beams=1,
                eos_token_id=SEP, pad_token_id=PAD, suppress_tokens=[PAD, DEC],
            )
            for row in out[:, 1:].tolist():
                generated += row.index(SEP) + 1 if SEP in row else len(row)
    seconds = time.perf_counter() - start
    return {"op": "decode", "images": a.images, "tokens": generated,
            "seconds": seconds, "tokens_per_s": generated / seconds}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["make", "train", "decode"])
    p.add_argument("folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-len", type=int, default=21)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--train-vision", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.mode == "make":
        return make(a.folder)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    record = (train if a.mode == "train" else decode)(a, dev)
    record.update({"backend": "pytorch-" + dev.type, "folder": a.folder,
                   "threads": torch.get_num_threads(), "torch": torch.__version__, **memory()})
    print(json.dumps(record) if a.json else
          f"pytorch {dev.type} {a.mode} {a.folder}: {record['tokens_per_s']:.0f} tokens/s, "
          f"peak memory {record['peak_memory_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
