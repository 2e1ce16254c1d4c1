#!/usr/bin/env python3
"""PyTorch reference for `captune bench decode`: the same captioner as
scripts/bench_torch_captioner.py (fresh weights, 128-d random image
embeddings, 79 ids), greedy decoding of the same number of images, 64 at
once, under torch.no_grad, with a KV cache (the prefix and <bos> once,
then one position per step attending to every layer's cached keys and
values), as captune decodes, or, with --no-cache, by full recompute of
every position at every step. --samples N samples N captions per image
(temperature 1, from the full softmax: `--decode sample:N` in captune),
64 x N rows at once.

    python3 scripts/bench_torch_decode.py --preset shapes [--images 500] [--samples N] [--no-cache] [--device cpu|cuda] [--json]
    python3 scripts/bench_torch_decode.py --config scripts/bench/gpt2-small.toml --vocab 50257

With fresh weights no caption says <eos> reliably, so every caption runs
to the maximum length, as in `captune bench decode` without --checkpoint.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from bench_torch_captioner import EMBED_DIM, Captioner, add_model_arguments, describe_memory, memory, read_model

BOS, EOS = 1, 2


def block_step(block, x, cache):
    """One block over the new positions x [b, n, d], appending their keys
    and values to `cache` (a list of two tensors, or empty)."""
    b, n, d = x.shape
    q, k, v = block.qkv(block.ln1(x)).split(d, dim=2)
    split = lambda t: t.view(b, -1, block.heads, d // block.heads).transpose(1, 2)
    q, k, v = split(q), split(k), split(v)
    if cache:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    cache[:] = [k, v]
    # The new positions see every cached one and, among themselves, the earlier ones.
    past = k.shape[2] - n
    mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    x = x + block.proj(a.transpose(1, 2).reshape(b, n, d))
    return x + block.fc2(F.gelu(block.fc1(block.ln2(x)), approximate="tanh"))


def greedy(logits):
    return logits.argmax(dim=-1)


def sample(logits):
    return torch.multinomial(F.softmax(logits, dim=-1), 1)[:, 0]


def decode_cached(model, features, steps, choose):
    b = features.shape[0]
    prefix = model.mapper(features).view(b, model.k, model.d)
    ids = torch.full((b, 1), BOS, dtype=torch.long, device=features.device)
    x = torch.cat([prefix, model.tokens(ids)], dim=1) + model.positions[: model.k + 1]
    caches = [[] for _ in model.blocks]
    out, done = [], torch.zeros(b, dtype=torch.bool, device=features.device)
    for t in range(steps):
        for block, cache in zip(model.blocks, caches):
            x = block_step(block, x, cache)
        logits = model.ln_f(x[:, -1]) @ model.tokens.weight.T
        nxt = choose(logits)
        out.append(nxt)
        done |= nxt == EOS
        if bool(done.all()) or t + 1 == steps:
            break
        x = model.tokens(nxt)[:, None] + model.positions[model.k + t + 1][None, None]
    return torch.stack(out, dim=1)


def decode_recompute(model, features, steps, choose):
    b = features.shape[0]
    seqs = torch.full((b, 1), BOS, dtype=torch.long, device=features.device)
    t_max = model.positions.shape[0] - model.k
    for _ in range(steps):
        padded = F.pad(seqs, (0, t_max - seqs.shape[1]))
        logits = model(features, padded)[:, seqs.shape[1] - 1]
        nxt = choose(logits)
        seqs = torch.cat([seqs, nxt[:, None]], dim=1)
        if bool((seqs[:, 1:] == EOS).any(dim=1).all()):
            break
    return seqs[:, 1:]


def main():
    p = argparse.ArgumentParser()
    add_model_arguments(p)
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--samples", type=int, default=0, help="sample N captions per image (0: greedy)")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.batch:
        p.error("images are decoded 64 at once, as `captune bench decode` does; --batch is for training")
    name, m, _ = read_model(a)
    images_at_once = 64
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = Captioner(m, a.vocab).to(dev).eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.positions, std=0.01)
    features = torch.rand(a.images, EMBED_DIM, device=dev) * 0.2 - 0.1
    steps = m["max_len"] - 1  # the words, then <eos>
    decode = decode_recompute if a.no_cache else decode_cached
    per_image = max(a.samples, 1)
    choose = sample if a.samples else greedy
    # Each image's embedding once per caption it gets.
    features = features.repeat_interleave(per_image, dim=0)
    rows = images_at_once * per_image
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with torch.no_grad():
        decode(model, features[:rows], steps, choose)  # warm-up
        sync()
        start = time.perf_counter()
        tokens = 0
        for first in range(0, a.images * per_image, rows):
            ids = decode(model, features[first:first + rows], steps, choose)
            # Each caption's ids up to and with its first <eos>.
            ended = (ids == EOS).int().cumsum(dim=1)
            tokens += int(((ended == 0) | ((ended == 1) & (ids == EOS))).sum())
        sync()
        seconds = time.perf_counter() - start
    record = {
        "op": "decode", "backend": "pytorch-" + dev.type, "preset": name,
        "decoding": (f"sample:{a.samples}" if a.samples else "greedy") + ", "
                    + ("full recompute" if a.no_cache else "KV cache"),
        "images": a.images, "batch": images_at_once, "captions": a.images * per_image, "tokens": tokens,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "seconds": seconds,
        "captions_per_s": a.images * per_image / seconds, "tokens_per_s": tokens / seconds,
        **memory(dev),
    }
    print(json.dumps(record) if a.json else
          f"pytorch {dev.type} decode {name} {record['decoding']} on {a.images} images: "
          f"{record['captions_per_s']:.1f} captions/s, {record['tokens_per_s']:.0f} tokens/s, "
          f"{describe_memory(record)}")


if __name__ == "__main__":
    main()
