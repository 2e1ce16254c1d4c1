#!/usr/bin/env python3
"""Makes tests/data/clipcap-original: ClipCap's own checkpoints, as its
authors' code saves them, of a tiny random model, and what that code
computes with them in float64, for tests/suite/models/clipcap.rs to
compare captune's reading of them with, so that CI needs no torch.

ClipCap (Mokady, Hertz and Bermano, 2021) is run from its repository's
train.py (https://github.com/rmokady/CLIP_prefix_caption, given with
--clipcap-repo): its ClipCaptionModel, MLP and TransformerMapper classes
as they are. Two things are shimmed, neither in the model: transformers
5 has no AdamW (train.py imports it; torch's stands in), and
GPT2LMHeadModel.from_pretrained("gpt2") reads tests/data/gpt2-tiny
instead (no download). For each mapper, `mlp.pt` and `transformer.pt`
are `torch.save(model.state_dict())` with the two attention buffers per
block (`attn.bias`, `attn.masked_bias`) that the transformers of 2021 kept
in a GPT-2's state dict and the released weights therefore hold, and
`*_expected.safetensors` holds:

- `features` [3, EMBED_DIM]: the image embeddings fed (unnormalised for
  the MLP, as ClipCap's predict.py feeds CLIP's; L2-normalised for the
  transformer mapper, as its notebook does);
- `ids` [3, MAX_LEN]: each image's caption in the step (the next image's
  training caption) in captune's layout, the stop "." as
  its start and end, then -1; ClipCap is fed the pieces and the stop
  after its prefix, no start;
- `logits` [real targets, vocab]: ClipCap's logits that predict each
  piece and the stop (the prefix's last position predicts the first);
- `loss`: the mean over those targets of -log p, and `grad.NAME`: the
  gradient of every parameter under captune's names and layouts;
- `greedy` [3, MAX_LEN - 1]: ClipCap's greedy captions (predict.py's
  generate2: the highest logit, up to the stop, at most MAX_LEN - 1
  pieces), then -1.

The model is trained a little on the three captions first (Adam, in
float32), so that its greedy captions end at the stop.

Usage:
    pip install torch transformers
    git clone https://github.com/rmokady/CLIP_prefix_caption
    python3 scripts/clipcap_original_fixtures.py --clipcap-repo CLIP_prefix_caption
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from clipcap_fixtures import captune_name

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
FOLDER = DATA / "gpt2-tiny"
OUT = DATA / "clipcap-original"
EMBED_DIM, PREFIX_LEN, CLIP_LEN, MAPPER_LAYERS, MAX_LEN = 128, 4, 3, 2, 12
STOP = "."
CAPTIONS = ["a black dog is running through the grass", "two girls play", "a man"]
TRAIN_STEPS = 150


def clipcap_classes(repo):
    """train.py's classes, run from its source."""
    source = (Path(repo) / "train.py").read_text()
    # The one import transformers 5 lacks, from torch instead.
    source = source.replace(" AdamW,", "").replace("import torch\n", "import torch\nfrom torch.optim import AdamW\n", 1)
    namespace = {"__name__": "clipcap_train"}
    exec(compile(source, "train.py", "exec"), namespace)

    class TinyGpt2(GPT2LMHeadModel):
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            return GPT2LMHeadModel.from_pretrained(str(FOLDER))

    namespace["GPT2LMHeadModel"] = TinyGpt2
    return namespace


def mapper_grads(model, kind, d):
    """The mapper's gradients under captune's names and layouts."""
    p = dict(model.clip_project.named_parameters())
    g = lambda name: p[name].grad
    if kind == "mlp":
        return {"mapper.fc1.weight": g("model.0.weight").T, "mapper.fc1.bias": g("model.0.bias"),
                "mapper.fc2.weight": g("model.2.weight").T, "mapper.fc2.bias": g("model.2.bias")}
    out = {"mapper.linear.weight": g("linear.weight").T, "mapper.linear.bias": g("linear.bias"),
           "mapper.constants": g("prefix_const")}
    for i in range(MAPPER_LAYERS):
        theirs = lambda name: g(f"transformer.layers.{i}.{name}")
        ours = f"mapper.transformer.blocks.{i}."
        out[ours + "attn.qkv.weight"] = torch.cat(
            [theirs("attn.to_queries.weight"), theirs("attn.to_keys_values.weight")]).T
        for mine, clipcap in [("ln1", "norm1"), ("ln2", "norm2")]:
            for part in ["weight", "bias"]:
                out[f"{ours}{mine}.{part}"] = theirs(f"{clipcap}.{part}")
        for mine, clipcap in [("attn.proj", "attn.project"), ("mlp.fc1", "mlp.fc1"),
                              ("mlp.fc2", "mlp.fc2")]:
            out[f"{ours}{mine}.weight"] = theirs(f"{clipcap}.weight").T
            out[f"{ours}{mine}.bias"] = theirs(f"{clipcap}.bias")
    return out


def padded(pieces):
    """Captions' pieces padded with 0 as ClipCap pads them, and its mask
    (the prefix's positions, then the pieces')."""
    longest = max(map(len, pieces))
    tokens = torch.tensor([p + [0] * (longest - len(p)) for p in pieces])
    mask = torch.tensor([[1.0] * (PREFIX_LEN + len(p)) + [0.0] * (longest - len(p)) for p in pieces])
    return tokens, mask


def make(ns, kind, tokenizer):
    mapping = ns["MappingType"].MLP if kind == "mlp" else ns["MappingType"].Transformer
    model = ns["ClipCaptionModel"](PREFIX_LEN, clip_length=CLIP_LEN, prefix_size=EMBED_DIM,
                                   num_layers=MAPPER_LAYERS, mapping_type=mapping)
    with torch.no_grad():
        # Layer norms and biases away from their initial 1 and 0.
        for p in model.clip_project.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    features = torch.randn(len(CAPTIONS), EMBED_DIM) * 3
    if kind == "transformer":
        features = F.normalize(features, dim=1)
    stop = tokenizer.encode(STOP)[0]
    pieces = [tokenizer.encode(c)[: MAX_LEN - 2] + [stop] for c in CAPTIONS]
    tokens, mask = padded(pieces)
    # Trained a little on its captions, so that greedy decoding ends at the
    # stop, after pieces of its caption.
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(TRAIN_STEPS):
        out = model(tokens, features, mask).logits[:, PREFIX_LEN - 1:-1]
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens.flatten(), reduction="none")
        loss = (loss * mask[:, PREFIX_LEN:].flatten()).sum() / mask[:, PREFIX_LEN:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = model.state_dict()
    for i in range(model.gpt.config.n_layer):
        n = model.gpt.config.n_positions
        state[f"gpt.transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        state[f"gpt.transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    OUT.mkdir(exist_ok=True)
    torch.save(state, OUT / f"{kind}.pt")

    model = model.double().eval()
    d = model.gpt.config.n_embd
    features = features.double()
    # The step pairs each image with another's caption: a loss far from
    # its minimum, whose gradients are not small differences.
    pieces = pieces[1:] + pieces[:1]
    tokens, mask = padded(pieces)
    out = model(tokens, features, mask.double()).logits[:, PREFIX_LEN - 1:]
    real = [(b, t) for b, p in enumerate(pieces) for t in range(len(p))]
    logits = torch.stack([out[b, t] for b, t in real])
    logp = F.log_softmax(logits, dim=-1)
    loss = -torch.stack([logp[i, pieces[b][t]] for i, (b, t) in enumerate(real)]).mean()
    model.zero_grad()
    loss.backward()

    greedy = []
    with torch.no_grad():
        for x in features:
            embeds = model.clip_project(x[None]).view(1, PREFIX_LEN, d)
            chosen = []
            while len(chosen) < MAX_LEN - 1:
                z = model.gpt(inputs_embeds=embeds).logits[0, -1]
                chosen.append(int(z.argmax()))
                if chosen[-1] == stop:
                    break
                embeds = torch.cat([embeds, model.gpt.transformer.wte(torch.tensor([[chosen[-1]]]))], 1)
            greedy.append(chosen)

    pad = lambda rows, n: torch.tensor([r + [-1] * (n - len(r)) for r in rows], dtype=torch.float64)
    record = {
        "features": features,
        "ids": pad([[stop] + p for p in pieces], MAX_LEN),
        "logits": logits,
        "loss": loss.reshape(1),
        "greedy": pad(greedy, MAX_LEN - 1),
    }
    record |= {"grad." + k: v for k, v in mapper_grads(model, kind, d).items()}
    # The positions captune keeps: the prefix's and the caption's, no start.
    seq_len = PREFIX_LEN + MAX_LEN - 2
    for name, p in model.gpt.named_parameters():
        if name == "lm_head.weight":
            continue  # tied to wte: its gradient is in wte's
        grad = p.grad[:seq_len] if name.endswith("wpe.weight") else p.grad
        record["grad." + captune_name(name)] = grad
    save_file({k: v.detach().float().contiguous() for k, v in record.items()},
              str(OUT / f"{kind}_expected.safetensors"),
              metadata={"max_len": str(MAX_LEN), "stop": str(stop)})
    print(f"{kind}: loss {loss.item():.6f}, greedy {[tokenizer.decode(g) for g in greedy]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clipcap-repo", required=True, help="a clone of rmokady/CLIP_prefix_caption")
    args = parser.parse_args()
    ns = clipcap_classes(args.clipcap_repo)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(FOLDER))
    torch.manual_seed(3)
    make(ns, "mlp", tokenizer)
    torch.manual_seed(4)
    make(ns, "transformer", tokenizer)


if __name__ == "__main__":
    main()
