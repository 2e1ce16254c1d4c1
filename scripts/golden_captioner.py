#!/usr/bin/env python3
"""An independent implementation of captune's captioner, written from
docs/checkpoints.md and the spec alone (no captune code), for the golden
test in tests/golden.rs, as llm.c's test_gpt2.c.

It builds a tiny captioner with random weights, writes it as a captune
checkpoint, and for one fixed batch writes the MLE loss (mean over real
tokens of -log softmax), every parameter's gradient, and every weight
after one AdamW step with global-norm clipping and decoupled weight decay
active (torch.optim.AdamW and torch.nn.utils.clip_grad_norm_; decay on the
2-D `*.weight` tensors of dense layers only). Everything is computed in
float64 and stored as float32.

    pip install torch safetensors
    python3 scripts/golden_captioner.py tests/data
"""
import json
import math
import sys

import torch
from safetensors.torch import save_file

torch.manual_seed(0)
DT = torch.float64

# The tiny captioner.
EMBED, K, HIDDEN, WIDTH, LAYERS, HEADS, MAX_LEN = 6, 2, 8, 16, 2, 2, 8
WORDS = ["a", "red", "circle", "blue", "star", "and", "big", "small"]
VOCAB = 4 + len(WORDS)  # <pad> <bos> <eos> <unk>, then the words
PAD, BOS, EOS = 0, 1, 2
T = MAX_LEN - 1  # token positions: <bos> and the words
S = K + T
# The optimiser step the golden values take.
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-2, (0.9, 0.999), 1e-8, 0.1, 0.5


def shapes():
    """Every tensor by name, as docs/checkpoints.md lists them."""
    d = WIDTH
    out = {
        "mapper.fc1.weight": (EMBED, HIDDEN),
        "mapper.fc1.bias": (HIDDEN,),
        "mapper.fc2.weight": (HIDDEN, K * d),
        "mapper.fc2.bias": (K * d,),
        "decoder.tokens": (VOCAB, d),
        "decoder.positions": (S, d),
    }
    for i in range(LAYERS):
        p = f"decoder.blocks.{i}"
        out.update({
            f"{p}.ln1.weight": (d,), f"{p}.ln1.bias": (d,),
            f"{p}.attn.qkv.weight": (d, 3 * d), f"{p}.attn.qkv.bias": (3 * d,),
            f"{p}.attn.proj.weight": (d, d), f"{p}.attn.proj.bias": (d,),
            f"{p}.ln2.weight": (d,), f"{p}.ln2.bias": (d,),
            f"{p}.mlp.fc1.weight": (d, 4 * d), f"{p}.mlp.fc1.bias": (4 * d,),
            f"{p}.mlp.fc2.weight": (4 * d, d), f"{p}.mlp.fc2.bias": (d,),
        })
    out.update({"decoder.ln_f.weight": (d,), "decoder.ln_f.bias": (d,)})
    return out


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def dense(x, p, name):
    return x @ p[name + ".weight"] + p[name + ".bias"]


def block(x, p, i):
    """Pre-LN: x + attn(ln1(x)), then + mlp(ln2(.)); causal attention."""
    pre = f"decoder.blocks.{i}"
    n, d = x.shape[-2], x.shape[-1]
    dh = d // HEADS
    qkv = dense(layer_norm(x, p[pre + ".ln1.weight"], p[pre + ".ln1.bias"]), p, pre + ".attn.qkv")
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    heads = []
    for h in range(HEADS):
        cols = slice(h * dh, (h + 1) * dh)
        scores = q[..., cols] @ k[..., cols].transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(causal, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[..., cols])
    x = x + dense(torch.cat(heads, dim=-1), p, pre + ".attn.proj")
    h = layer_norm(x, p[pre + ".ln2.weight"], p[pre + ".ln2.bias"])
    return x + dense(gelu(dense(h, p, pre + ".mlp.fc1")), p, pre + ".mlp.fc2")


def loss_of(p, features, inputs, targets):
    """MLE: the mean over real (non-pad) targets of -log softmax."""
    batch = features.shape[0]
    prefix = dense(gelu(dense(features, p, "mapper.fc1")), p, "mapper.fc2").reshape(batch, K, WIDTH)
    x = torch.cat([prefix, p["decoder.tokens"][inputs]], dim=1) + p["decoder.positions"]
    for i in range(LAYERS):
        x = block(x, p, i)
    h = layer_norm(x, p["decoder.ln_f.weight"], p["decoder.ln_f.bias"])[:, K:]
    logits = h @ p["decoder.tokens"].T  # tied output layer
    logp = torch.log_softmax(logits, dim=-1)
    real = targets != PAD
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * real).sum() / real.sum()


def main(out_dir):
    params = {n: torch.randn(s, dtype=DT) * 0.3 for n, s in shapes().items()}
    for n in params:
        if n.endswith("ln1.weight") or n.endswith("ln2.weight") or n.endswith("ln_f.weight"):
            params[n] = 1 + params[n]
    # One batch of three captions of different lengths.
    captions = [[BOS, 4, 5, 6, EOS], [BOS, 4, 7, 8, 9, 6, EOS], [BOS, 10, EOS]]
    inputs = torch.full((3, T), PAD, dtype=torch.long)
    targets = torch.full((3, T), PAD, dtype=torch.long)
    for r, c in enumerate(captions):
        inputs[r, :len(c) - 1] = torch.tensor(c[:-1])  # <bos> w1 .. wn
        targets[r, :len(c) - 1] = torch.tensor(c[1:])  # w1 .. wn <eos>
    features = torch.randn(3, EMBED, dtype=DT)

    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    loss = loss_of(leaves, features, inputs, targets)
    loss.backward()
    grads = {n: t.grad.clone() for n, t in leaves.items()}
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    assert norm > MAX_NORM, f"clipping must be active (gradient norm {norm})"
    decay = [t for n, t in leaves.items() if n.endswith(".weight") and t.dim() == 2]
    rest = [t for n, t in leaves.items() if not (n.endswith(".weight") and t.dim() == 2)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    torch.nn.utils.clip_grad_norm_(list(leaves.values()), MAX_NORM)
    opt.step()

    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    config = {
        "embed_dim": EMBED, "prefix_len": K, "mapper_hidden": HIDDEN,
        "decoder": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "causal": True},
        "max_len": MAX_LEN, "vocab_size": VOCAB,
    }
    save_file(
        {n: f32(t) for n, t in params.items()},
        f"{out_dir}/golden_captioner.safetensors",
        metadata={"format": "captune captioner", "captioner_config": json.dumps(config),
                  "vocab": json.dumps(WORDS)},
    )
    expected = {"features": f32(features), "inputs": f32(inputs), "targets": f32(targets),
                "loss": f32(loss.reshape(1)), "grad_norm": f32(torch.tensor([norm]))}
    expected.update({f"grad.{n}": f32(g) for n, g in grads.items()})
    expected.update({f"after.{n}": f32(t) for n, t in leaves.items()})
    save_file(expected, f"{out_dir}/golden_captioner_expected.safetensors", metadata={
        "lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS),
        "weight_decay": str(WEIGHT_DECAY), "max_grad_norm": str(MAX_NORM),
        "made_by": "scripts/golden_captioner.py (PyTorch " + torch.__version__ + ", float64)"})
    print(f"loss {float(loss):.6f}, gradient norm {norm:.4f} (clipped to {MAX_NORM})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
