#!/usr/bin/env python3
"""PyTorch reference for `captune bench train|decode` on an LSTM config:
the same model on the same synthetic workload (128-d random image
embeddings, 79 ids unless --vocab says otherwise, every caption
max_len - 1 tokens, no padding).

- `decoder = "lstm:fc"`: a linear image projection as every layer's
  initial hidden state, or with `image_feed = "input"` as a first input;
  nn.Embedding, nn.LSTM of `[model] width` and `layers`, an untied
  nn.Linear output layer;
- `"lstm:updown"` and `"lstm:att2in"`: top-down attention and Att2in
  over 36 random 128-d image tokens, with nn.LSTMCell stepped over the
  positions in Python, as self-critical.pytorch runs them (docs/lstm.md
  gives the equations).

`train` times one full step each time (forward, MLE loss, backward,
gradient clipping at 1, AdamW); `decode` times greedy decoding of
`--images` images, 64 at once, under torch.no_grad, one nn.LSTM step per
token with its (h, c) carried, every caption to max_len - 1 tokens (with
fresh weights no caption ends reliably, as in `captune bench decode`).
Both print the process's peak memory. TF32 is off on CUDA.

    python3 scripts/bench_torch_lstm.py train --config C [--steps 20] [--json]
    python3 scripts/bench_torch_lstm.py decode --config C [--images 500] [--json]
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_torch_captioner import EMBED_DIM, add_model_arguments, describe_memory, memory, read_model

BOS, EOS = 1, 2
TOKENS = 36  # `captune bench`'s image tokens for an attention LSTM


class Lstm(nn.Module):
    def __init__(self, m, vocab):
        super().__init__()
        h, self.layers = m["width"], m["layers"]
        self.feed = m.get("image_feed", "hidden")
        self.fc_embed = nn.Linear(EMBED_DIM, h)
        self.embed = nn.Embedding(vocab, h)
        self.lstm = nn.LSTM(h, h, self.layers, batch_first=True)
        self.logit = nn.Linear(h, vocab)

    def start(self, features):
        """The states before the first token, and the first input."""
        image = self.fc_embed(features)
        if self.feed == "hidden":
            h0 = image.unsqueeze(0).expand(self.layers, -1, -1).contiguous()
            return (h0, torch.zeros_like(h0))
        _, state = self.lstm(image.unsqueeze(1))
        return state

    def forward(self, features, inputs):
        out, _ = self.lstm(self.embed(inputs), self.start(features))
        return self.logit(out)


class Attention(nn.Module):
    """Additive attention over embedded tokens: the embedded values, their
    keys, and a query's weights over them."""

    def __init__(self, h):
        super().__init__()
        self.att_embed = nn.Linear(EMBED_DIM, h)
        self.ctx2att = nn.Linear(h, h)
        self.h2att = nn.Linear(h, h)
        self.alpha_net = nn.Linear(h, 1, bias=False)

    def tokens(self, tokens):
        values = torch.relu(self.att_embed(tokens))
        return values, self.ctx2att(values)

    def forward(self, values, keys, query):
        scores = self.alpha_net(torch.tanh(keys + self.h2att(query)[:, None])).squeeze(-1)
        return (torch.softmax(scores, -1)[..., None] * values).sum(1)


class UpDown(nn.Module):
    def __init__(self, m, vocab):
        super().__init__()
        h = self.h = m["width"]
        self.attention = Attention(h)
        self.embed = nn.Embedding(vocab, h)
        self.att_lstm = nn.LSTMCell(3 * h, h)
        self.lang_lstm = nn.LSTMCell(2 * h, h)
        self.logit = nn.Linear(h, vocab)

    def start(self, tokens):
        values, keys = self.attention.tokens(tokens)
        zero = torch.zeros(tokens.shape[0], self.h, device=tokens.device)
        return (values, keys, values.mean(1)), ((zero, zero), (zero, zero))

    def step(self, image, state, ids):
        (values, keys, mean), ((h1, c1), (h2, c2)) = image, state
        h1, c1 = self.att_lstm(torch.cat([h2, mean, self.embed(ids)], -1), (h1, c1))
        h2, c2 = self.lang_lstm(torch.cat([self.attention(values, keys, h1), h1], -1), (h2, c2))
        return self.logit(h2), ((h1, c1), (h2, c2))


class Att2in(nn.Module):
    def __init__(self, m, vocab):
        super().__init__()
        h = self.h = m["width"]
        self.attention = Attention(h)
        self.embed = nn.Embedding(vocab, h)
        self.lstm = nn.LSTMCell(h, h)
        self.a2c = nn.Linear(h, h)
        self.logit = nn.Linear(h, vocab)

    def start(self, tokens):
        values, keys = self.attention.tokens(tokens)
        zero = torch.zeros(tokens.shape[0], self.h, device=tokens.device)
        return (values, keys), (zero, zero)

    def step(self, image, state, ids):
        (values, keys), (h, c) = image, state
        cell = self.lstm
        gates = self.embed(ids) @ cell.weight_ih.T + cell.bias_ih + h @ cell.weight_hh.T + cell.bias_hh
        i, f, g, o = gates.chunk(4, -1)
        g = g + self.a2c(self.attention(values, keys, h))
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return self.logit(h), (h, c)


class Stepped(nn.Module):
    """An attention model run over the positions, one step each."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, tokens, inputs):
        image, state = self.cell.start(tokens)
        logits = []
        for t in range(inputs.shape[1]):
            out, state = self.cell.step(image, state, inputs[:, t])
            logits.append(out)
        return torch.stack(logits, 1)


def build(m, vocab):
    """The config's model, and the shape of one image's input."""
    kind = m.get("decoder", "lstm:fc")
    if kind == "lstm:fc":
        return Lstm(m, vocab), (EMBED_DIM,)
    cell = {"lstm:updown": UpDown, "lstm:att2in": Att2in}[kind](m, vocab)
    return Stepped(cell), (TOKENS, EMBED_DIM)


def greedy(model, images, t):
    """Greedy ids of `images`, t positions each, with <pad> and <bos> masked."""
    ids = torch.full((images.shape[0], 1), BOS, dtype=torch.long, device=images.device)
    if isinstance(model, Lstm):
        state = model.start(images)
        for _ in range(t):
            out, state = model.lstm(model.embed(ids), state)
            logits = model.logit(out[:, -1])
            logits[:, [0, BOS]] = float("-inf")
            ids = logits.argmax(dim=-1, keepdim=True)
        return
    image, state = model.cell.start(images)
    ids = ids[:, 0]
    for _ in range(t):
        logits, state = model.cell.step(image, state, ids)
        logits[:, [0, BOS]] = float("-inf")
        ids = logits.argmax(dim=-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["train", "decode"])
    add_model_arguments(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    name, m, batch = read_model(a)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model, input_shape = build(m, a.vocab)
    model = model.to(dev)
    t = m["max_len"] - 1
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    parameters = sum(p.numel() for p in model.parameters())
    if a.op == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        features = torch.randn(batch, *input_shape, device=dev) * 0.05
        words = torch.randint(4, a.vocab, (batch, t - 1), device=dev)
        inputs = torch.cat([torch.ones(batch, 1, dtype=torch.long, device=dev), words], dim=1)
        targets = torch.cat([words, torch.full((batch, 1), EOS, device=dev)], dim=1)

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
        sync()
        start = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        loss.item()
        sync()
        seconds = (time.perf_counter() - start) / a.steps
        record = {"op": "train", "objective": "mle", "batch": batch, "tokens_per_step": batch * t,
                  "seconds_per_step": seconds, "tokens_per_s": batch * t / seconds}
        what = f"batch {batch}: {record['tokens_per_s']:.0f} tokens/s ({seconds * 1e3:.1f} ms/step"
    else:
        features = torch.randn(a.images, *input_shape, device=dev) * 0.05
        start = time.perf_counter()
        with torch.no_grad():
            for first in range(0, a.images, 64):
                greedy(model, features[first:first + 64], t)
        sync()
        seconds = time.perf_counter() - start
        record = {"op": "decode", "decoding": "greedy", "images": a.images, "tokens": a.images * t,
                  "seconds": seconds, "tokens_per_s": a.images * t / seconds,
                  "captions_per_s": a.images / seconds}
        what = f"{a.images} images: {record['tokens_per_s']:.0f} tokens/s ({seconds:.2f} s"
    record.update({"backend": "pytorch-" + dev.type, "preset": name, "parameters": parameters,
                   "threads": torch.get_num_threads(), "torch": torch.__version__, **memory(dev)})
    print(json.dumps(record) if a.json else
          f"pytorch {dev.type} {a.op} {name} {what}, {parameters} parameters, "
          f"{describe_memory(record)})")


if __name__ == "__main__":
    main()
