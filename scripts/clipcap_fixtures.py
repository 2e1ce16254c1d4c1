#!/usr/bin/env python3
"""Makes tests/data/clipcap_step_expected.safetensors: one ClipCap MLE step
of a captioner whose decoder is the tiny GPT-2 in tests/data/gpt2-tiny
(made by scripts/gpt2_fixtures.py), computed by transformers in float64,
for tests/clipcap.rs to compare captune with on both backends, so that
CI needs no torch.

The step, as docs/checkpoints.md describes captune's captioner: image
embeddings (L2-normalised) go through ClipCap's MLP mapper (x W1 + b1,
tanh, x W2 + b2, weights stored input-major) to k prefix vectors; GPT-2 reads
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


def main():
    torch.manual_seed(1)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(FOLDER))
    end = tokenizer.convert_tokens_to_ids(END)
    model = GPT2LMHeadModel.from_pretrained(str(FOLDER)).double()
    d = model.config.n_embd
    steps = MAX_LEN - 1
    features = F.normalize(torch.randn(len(CAPTIONS), EMBED_DIM, dtype=torch.float64), dim=1)
    mapper = {
        "mapper.fc1.weight": torch.randn(EMBED_DIM, MAPPER_HIDDEN, dtype=torch.float64) * 0.5,
        "mapper.fc1.bias": torch.randn(MAPPER_HIDDEN, dtype=torch.float64) * 0.1,
        "mapper.fc2.weight": torch.randn(MAPPER_HIDDEN, PREFIX_LEN * d, dtype=torch.float64) * 0.3,
        "mapper.fc2.bias": torch.randn(PREFIX_LEN * d, dtype=torch.float64) * 0.1,
    }
    for p in mapper.values():
        p.requires_grad_(True)

    def prefix_of(x):
        hidden = torch.tanh(x @ mapper["mapper.fc1.weight"] + mapper["mapper.fc1.bias"])
        return (hidden @ mapper["mapper.fc2.weight"] + mapper["mapper.fc2.bias"]).view(-1, PREFIX_LEN, d)

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
    for name, p in mapper.items():
        out[name] = p.detach()
        out["grad." + name] = p.grad
    seq_len = PREFIX_LEN + steps
    for name, p in model.named_parameters():
        if name == "lm_head.weight":
            continue  # tied to wte: its gradient is in wte's
        grad = p.grad[:seq_len] if name.endswith("wpe.weight") else p.grad
        out["grad." + captune_name(name)] = grad

    save_file(
        {k: v.detach().float().contiguous() for k, v in out.items()},
        str(DATA / "clipcap_step_expected.safetensors"),
        metadata={
            "shape": json.dumps({"embed_dim": EMBED_DIM, "prefix_len": PREFIX_LEN,
                                 "mapper_hidden": MAPPER_HIDDEN, "max_len": MAX_LEN}),
            "end": str(end),
        },
    )
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
