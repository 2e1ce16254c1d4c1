#!/usr/bin/env python3
"""Makes tests/data/clipcap_step_expected.safetensors and
tests/data/clipcap_transformer_step_expected.safetensors: one ClipCap MLE
step of a captioner whose decoder is the tiny GPT-2 in tests/data/gpt2-tiny
(made by scripts/gpt2_fixtures.py), computed by transformers in float64,
for tests/suite/models/clipcap.rs to compare captune with on both backends, so that
CI needs no torch. The first file's mapper is ClipCap's MLP, the second's
its transformer mapper.

The step, as docs/checkpoints.md describes captune's captioner: image
embeddings (L2-normalised) go through the mapper to k prefix vectors:
ClipCap's MLP (x W1 + b1, tanh, x W2 + b2, weights stored input-major), or
ClipCap's transformer mapper, written here from Mokady et al. (2021) as
its code defines it: a linear layer to `clip_len` vectors, the k learned
constants after them, blocks x + proj(attn(ln1(x))), x + fc2(relu(fc1(ln2(x))))
with separate query and key-value projections without biases, 8-style
multi-head attention without a mask and no final norm, the outputs at the
constants as the prefix. GPT-2 reads
the prefix, then each caption's ids (<|endoftext|>, its BPE pieces,
<|endoftext|>), with learned positions 0.. over both; position k + t
predicts the caption's id t + 1. The loss is the mean over the captions'
real targets of -log p. The file holds the inputs (features, the
mapper's weights, the captions' ids), the logits at every real
position, the loss, and every parameter's gradient under captune's
names.

Usage:
    pip install torch transformers
    python3 scripts/clipcap_fixtures.py
"""

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
FOLDER = DATA / "gpt2-tiny"
END = "<|endoftext|>"
EMBED_DIM, PREFIX_LEN, MAPPER_HIDDEN, MAX_LEN = 8, 4, 16, 16
# The transformer mapper's: clip_len vectors, blocks, heads; its blocks'
# MLP is twice the width, as ClipCap's.
CLIP_LEN, MAPPER_LAYERS, MAPPER_HEADS = 3, 2, 4
CAPTIONS = [
    "A black dog is running through the grass .",
    "Two girls play",
    "A man in a red shirt climbs a rock wall while another man watches from below .",
]
# captune's names for GPT-2's block tensors (src/model/gpt2.rs).
BLOCK_NAMES = {
    "ln_1.weight": "ln1.weight", "ln_1.bias": "ln1.bias",
    "attn.c_attn.weight": "attn.qkv.weight", "attn.c_attn.bias": "attn.qkv.bias",
    "attn.c_proj.weight": "attn.proj.weight", "attn.c_proj.bias": "attn.proj.bias",
    "ln_2.weight": "ln2.weight", "ln_2.bias": "ln2.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight", "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight", "mlp.c_proj.bias": "mlp.fc2.bias",
}


def captune_name(name):
    name = name.removeprefix("transformer.")
    if name == "wte.weight":
        return "decoder.tokens"
    if name == "wpe.weight":
        return "decoder.positions"
    if name.startswith("ln_f."):
        return "decoder." + name
    _, layer, rest = name.split(".", 2)
    return f"decoder.blocks.{layer}.{BLOCK_NAMES[rest]}"


def mlp_mapper(d):
    """ClipCap's MLP under captune's names, and its forward."""
    weights = {
        "mapper.fc1.weight": torch.randn(EMBED_DIM, MAPPER_HIDDEN, dtype=torch.float64) * 0.5,
        "mapper.fc1.bias": torch.randn(MAPPER_HIDDEN, dtype=torch.float64) * 0.1,
        "mapper.fc2.weight": torch.randn(MAPPER_HIDDEN, PREFIX_LEN * d, dtype=torch.float64) * 0.3,
        "mapper.fc2.bias": torch.randn(PREFIX_LEN * d, dtype=torch.float64) * 0.1,
    }

    def prefix_of(x):
        hidden = torch.tanh(x @ weights["mapper.fc1.weight"] + weights["mapper.fc1.bias"])
        return (hidden @ weights["mapper.fc2.weight"] + weights["mapper.fc2.bias"]).view(-1, PREFIX_LEN, d)

    return weights, prefix_of


def transformer_mapper(d):
    """ClipCap's transformer mapper, with ClipCap's own separate weights
    (to_queries, to_keys_values), and the same weights under captune's
    names: qkv is [to_queries^T | to_keys_values^T], input-major."""
    g = lambda *shape, s=1.0: torch.randn(*shape, dtype=torch.float64) * s
    hidden = 2 * d
    clipcap = {"linear.weight": g(EMBED_DIM, CLIP_LEN * d, s=0.5), "linear.bias": g(CLIP_LEN * d, s=0.1),
               "prefix_const": g(PREFIX_LEN, d)}
    for i in range(MAPPER_LAYERS):
        clipcap |= {
            f"{i}.norm1.weight": 1 + g(d, s=0.1), f"{i}.norm1.bias": g(d, s=0.1),
            f"{i}.to_queries": g(d, d, s=0.3), f"{i}.to_keys_values": g(d, 2 * d, s=0.3),
            f"{i}.project.weight": g(d, d, s=0.2), f"{i}.project.bias": g(d, s=0.1),
            f"{i}.norm2.weight": 1 + g(d, s=0.1), f"{i}.norm2.bias": g(d, s=0.1),
            f"{i}.fc1.weight": g(d, hidden, s=0.2), f"{i}.fc1.bias": g(hidden, s=0.1),
            f"{i}.fc2.weight": g(hidden, d, s=0.2), f"{i}.fc2.bias": g(d, s=0.1),
        }
    for p in clipcap.values():
        p.requires_grad_(True)
    heads, head_dim = MAPPER_HEADS, d // MAPPER_HEADS

    def attention(i, x):
        b, n, _ = x.shape
        q = (x @ clipcap[f"{i}.to_queries"]).reshape(b, n, heads, head_dim)
        kv = (x @ clipcap[f"{i}.to_keys_values"]).reshape(b, n, 2, heads, head_dim)
        k, v = kv[:, :, 0], kv[:, :, 1]
        att = (torch.einsum("bnhd,bmhd->bnmh", q, k) * head_dim ** -0.5).softmax(dim=2)
        out = torch.einsum("bnmh,bmhd->bnhd", att, v).reshape(b, n, d)
        return out @ clipcap[f"{i}.project.weight"] + clipcap[f"{i}.project.bias"]

    def prefix_of(x):
        clip = (x @ clipcap["linear.weight"] + clipcap["linear.bias"]).view(-1, CLIP_LEN, d)
        h = torch.cat([clip, clipcap["prefix_const"].expand(x.shape[0], -1, -1)], dim=1)
        for i in range(MAPPER_LAYERS):
            norm = lambda y, n: F.layer_norm(y, (d,), clipcap[f"{i}.{n}.weight"], clipcap[f"{i}.{n}.bias"], 1e-5)
            h = h + attention(i, norm(h, "norm1"))
            mlp = F.relu(norm(h, "norm2") @ clipcap[f"{i}.fc1.weight"] + clipcap[f"{i}.fc1.bias"])
            h = h + mlp @ clipcap[f"{i}.fc2.weight"] + clipcap[f"{i}.fc2.bias"]
        return h[:, CLIP_LEN:]

    def captune_weights():
        """captune's names and layouts, each with the gradient of what it is made of."""
        out = {"mapper.linear.weight": "linear.weight", "mapper.linear.bias": "linear.bias",
               "mapper.constants": "prefix_const"}
        out = {ours: (clipcap[theirs], clipcap[theirs].grad) for ours, theirs in out.items()}
        for i in range(MAPPER_LAYERS):
            block = f"mapper.transformer.blocks.{i}."
            cat = lambda a, b: torch.cat([a, b], dim=1)
            out[block + "attn.qkv.weight"] = (
                cat(clipcap[f"{i}.to_queries"], clipcap[f"{i}.to_keys_values"]),
                cat(clipcap[f"{i}.to_queries"].grad, clipcap[f"{i}.to_keys_values"].grad))
            for ours, theirs in [("ln1", "norm1"), ("attn.proj", "project"), ("ln2", "norm2"),
                                 ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")]:
                for part in ["weight", "bias"]:
                    p = clipcap[f"{i}.{theirs}.{part}"]
                    out[f"{block}{ours}.{part}"] = (p, p.grad)
        return out

    return clipcap, prefix_of, captune_weights


def make(kind, tokenizer, model, end, file):
    d = model.config.n_embd
    steps = MAX_LEN - 1
    features = F.normalize(torch.randn(len(CAPTIONS), EMBED_DIM, dtype=torch.float64), dim=1)
    if kind == "mlp":
        mapper, prefix_of = mlp_mapper(d)
        for p in mapper.values():
            p.requires_grad_(True)
        captune_weights = lambda: {name: (p, p.grad) for name, p in mapper.items()}
    else:
        _, prefix_of, captune_weights = transformer_mapper(d)

    def logits_of(x, ids):
        wte = model.transformer.wte
        embeds = torch.cat([prefix_of(x), wte(ids)], dim=1)
        return model(inputs_embeds=embeds).logits[:, PREFIX_LEN:]

    sequences = [[end] + tokenizer.encode(c)[: MAX_LEN - 2] + [end] for c in CAPTIONS]
    # Positions after a caption's end read <|endoftext|> here and captune's
    # padding row there: the causal mask keeps them from every real position.
    ids = torch.tensor([(s + [end] * steps)[:steps] for s in sequences])
    logits = logits_of(features, ids)
    logp = F.log_softmax(logits, dim=-1)
    real = [(b, t) for b, s in enumerate(sequences) for t in range(len(s) - 1)]
    loss = -torch.stack([logp[b, t, sequences[b][t + 1]] for b, t in real]).mean()
    model.zero_grad()
    loss.backward()

    out = {
        "features": features,
        # Each caption's ids, then -1.
        "ids": torch.tensor([s + [-1] * (MAX_LEN - len(s)) for s in sequences], dtype=torch.float64),
        "logits": torch.stack([logits[b, t] for b, t in real]),
        "loss": loss.detach().reshape(1),
    }
    for name, (p, grad) in captune_weights().items():
        out[name] = p.detach()
        out["grad." + name] = grad
    seq_len = PREFIX_LEN + steps
    for name, p in model.named_parameters():
        if name == "lm_head.weight":
            continue  # tied to wte: its gradient is in wte's
        grad = p.grad[:seq_len] if name.endswith("wpe.weight") else p.grad
        out["grad." + captune_name(name)] = grad

    shape = {"embed_dim": EMBED_DIM, "prefix_len": PREFIX_LEN, "mapper_hidden": MAPPER_HIDDEN,
             "max_len": MAX_LEN}
    if kind == "transformer":
        shape |= {"mapper_hidden": 2 * d, "clip_len": CLIP_LEN, "layers": MAPPER_LAYERS,
                  "heads": MAPPER_HEADS}
    save_file(
        {k: v.detach().float().contiguous() for k, v in out.items()},
        str(DATA / file),
        metadata={"shape": json.dumps(shape), "end": str(end)},
    )
    print(f"{file}: loss {loss.item():.6f}")


def main():
    torch.manual_seed(1)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(FOLDER))
    end = tokenizer.convert_tokens_to_ids(END)
    model = GPT2LMHeadModel.from_pretrained(str(FOLDER)).double()
    make("mlp", tokenizer, model, end, "clipcap_step_expected.safetensors")
    torch.manual_seed(2)
    make("transformer", tokenizer, model, end, "clipcap_transformer_step_expected.safetensors")


if __name__ == "__main__":
    main()
