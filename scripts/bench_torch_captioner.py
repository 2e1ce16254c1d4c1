#!/usr/bin/env python3
"""PyTorch reference for `captune bench train`: the same captioner (ClipCap
MLP mapper to k prefix vectors, pre-LN causal decoder with learned positions,
tanh GELU, tied output embedding), the same synthetic workload (128-d image
embeddings, 79 ids unless --vocab says otherwise, every caption max_len - 1
tokens, no padding) and one full step each time (forward, MLE loss,
backward, AdamW), with the process's peak memory.

    python3 scripts/bench_torch_captioner.py --preset shapes [--device cpu|cuda] [--steps 20] [--json]
    python3 scripts/bench_torch_captioner.py --config scripts/bench/gpt2-small.toml --vocab 50257

Reads the preset from assets/presets/NAME.toml, or the --config file.
TF32 is off on CUDA so the arithmetic is FP32 like captune's.
"""
import argparse
import json
import pathlib
import resource
import time
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F

EMBED_DIM, VOCAB = 128, 79


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def add_model_arguments(p):
    """The network's options, as `captune bench`'s."""
    network = p.add_mutually_exclusive_group()
    network.add_argument("--preset", default="shapes")
    network.add_argument("--config", help="a run config file instead of a preset")
    p.add_argument("--vocab", type=int, default=VOCAB, help="ids of the synthetic vocabulary")
    p.add_argument("--batch", type=int, help="images per step, instead of the config's")


def read_model(a):
    """The run config's name, [model] section and batch."""
    if a.batch is not None and a.batch <= 0:
        raise SystemExit("--batch must be positive")
    root = pathlib.Path(__file__).resolve().parent.parent
    path = pathlib.Path(a.config) if a.config else root / "assets/presets" / f"{a.preset}.toml"
    config = tomllib.loads(path.read_text())
    return a.config or a.preset, config["model"], a.batch or config["train"]["batch"]


def memory(dev):
    """As `captune bench` reports it: the process's peak resident memory
    (`peak_memory_mib`; Linux reports ru_maxrss in KiB), and on CUDA the
    peak of PyTorch's allocations on the device (`device_memory_mib`)."""
    m = {"peak_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if dev.type == "cuda":
        m["device_memory_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
    return m


def describe_memory(record):
    text = f"peak memory {record['peak_memory_mib']:.0f} MiB"
    if "device_memory_mib" in record:
        text += f", device memory {record['device_memory_mib']:.0f} MiB"
    return text


class Captioner(nn.Module):
    def __init__(self, m, vocab=VOCAB):
        super().__init__()
        d, self.k = m["width"], m["prefix_len"]
        self.d = d
        self.mapper = nn.Sequential(
            nn.Linear(EMBED_DIM, m["mapper_hidden"]), nn.GELU(approximate="tanh"),
            nn.Linear(m["mapper_hidden"], self.k * d))
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.zeros(self.k + m["max_len"] - 1, d))
        self.blocks = nn.ModuleList(Block(d, m["heads"]) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, features, inputs):
        prefix = self.mapper(features).view(-1, self.k, self.d)
        x = torch.cat([prefix, self.tokens(inputs)], dim=1) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)[:, self.k:] @ self.tokens.weight.T


def main():
    p = argparse.ArgumentParser()
    add_model_arguments(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    name, m, batch = read_model(a)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = Captioner(m, a.vocab).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    t = m["max_len"] - 1
    features = torch.randn(batch, EMBED_DIM, device=dev) * 0.05
    words = torch.randint(4, a.vocab, (batch, t - 1), device=dev)
    inputs = torch.cat([torch.ones(batch, 1, dtype=torch.long, device=dev), words], dim=1)
    targets = torch.cat([words, torch.full((batch, 1), 2, device=dev)], dim=1)

    def step():
        logits = model(features, inputs)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    sync()
    seconds = (time.perf_counter() - start) / a.steps
    record = {
        "op": "train", "backend": "pytorch-" + dev.type, "preset": name, "objective": "mle",
        "batch": batch, "tokens_per_step": batch * t,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "seconds_per_step": seconds, "tokens_per_s": batch * t / seconds,
        **memory(dev),
    }
    print(json.dumps(record) if a.json else
          f"pytorch {dev.type} train {name} batch {batch}: {record['tokens_per_s']:.0f} tokens/s "
          f"({seconds * 1e3:.1f} ms/step, {record['parameters']} parameters, "
          f"{describe_memory(record)})")


if __name__ == "__main__":
    main()
