#!/usr/bin/env python3
"""Checks a `captune export` folder with transformers itself: the GPT-2 and
its tokenizer load as they are, and ClipCap-style greedy decoding of the
same image embeddings gives the captions captune's `eval` gave.

    captune export RUN --hf OUT
    captune eval --checkpoint RUN --results results.json ...
    python3 scripts/check_export.py OUT --features F.safetensors --results results.json
    python3 scripts/check_export.py OUT --same-as GPT2_FOLDER

F is the features file the run's image embeddings came from (tensor
`embeddings`, metadata `image_ids`). With --same-as, every weight of the
export equals the GPT-2 folder's bit for bit and its config.json is that
folder's (plus the captune_* fields): what a decoder trained with
--freeze-decoder must give. It exits with status 1 on any difference. Greedy decoding as captune's: the
mapper's prefix, then the start id; at each step the highest logit among
the ids the generation config does not suppress, until the end id or
captune_caption_positions ids.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import GPT2LMHeadModel, GenerationConfig, PreTrainedTokenizerFast


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--features")
    p.add_argument("--results")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--same-as", help="a GPT-2 folder the export's decoder must equal")
    a = p.parse_args()
    if bool(a.features) != bool(a.results) or not (a.results or a.same_as):
        p.error("give --features and --results, or --same-as, or all three")

    model, info = GPT2LMHeadModel.from_pretrained(a.folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers did not load the folder as is: {problems}"
    if a.same_as:
        same_as(model, a.folder, a.same_as)
    if not a.results:
        return
    model = model.double().eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(a.folder)
    generation = GenerationConfig.from_pretrained(a.folder)

    mapper = safe_open(f"{a.folder}/mapper.safetensors", "pt")
    meta = mapper.metadata()
    k, d = int(meta["prefix_len"]), model.config.n_embd
    w = {name: mapper.get_tensor(name).double() for name in mapper.keys()}
    act = {"tanh": torch.tanh, "relu": F.relu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
           "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[meta["activation"]]

    def mlp_prefix(x):
        hidden = act(x @ w["mapper.fc1.weight"] + w["mapper.fc1.bias"])
        return (hidden @ w["mapper.fc2.weight"] + w["mapper.fc2.bias"]).view(1, k, d)

    def transformer_prefix(x):
        # ClipCap's transformer mapper, as docs/checkpoints.md gives it.
        c, layers, heads = (int(meta[key]) for key in ("clip_len", "layers", "heads"))
        h = torch.cat([(x @ w["mapper.linear.weight"] + w["mapper.linear.bias"]).view(1, c, d),
                       w["mapper.constants"][None]], 1)
        for i in range(layers):
            t = lambda name: w[f"mapper.transformer.blocks.{i}.{name}"]
            a = F.layer_norm(h, (d,), t("ln1.weight"), t("ln1.bias"), 1e-5) @ t("attn.qkv.weight")
            q, kk, v = (z.view(1, -1, heads, d // heads).transpose(1, 2) for z in a.split(d, -1))
            att = F.scaled_dot_product_attention(q, kk, v).transpose(1, 2).reshape(1, -1, d)
            h = h + att @ t("attn.proj.weight") + t("attn.proj.bias")
            z = act(F.layer_norm(h, (d,), t("ln2.weight"), t("ln2.bias"), 1e-5) @ t("mlp.fc1.weight")
                    + t("mlp.fc1.bias"))
            h = h + z @ t("mlp.fc2.weight") + t("mlp.fc2.bias")
        return h[:, c:]

    prefix = transformer_prefix if meta.get("mapper") == "transformer" else mlp_prefix

    features = safe_open(a.features, "pt")
    ids = json.loads(features.metadata()["image_ids"])
    embeddings = F.normalize(features.get_tensor("embeddings").double(), dim=1)
    row = {str(i): r for r, i in enumerate(ids)}
    steps = model.config.captune_caption_positions
    suppressed = list(generation.suppress_tokens or [])

    results = json.load(open(a.results))[: a.limit]
    same = 0
    with torch.no_grad():
        for r in results:
            x = embeddings[row[str(r["image_id"])]][None]
            chosen = [generation.bos_token_id]
            while len(chosen) - 1 < steps:
                embeds = torch.cat([prefix(x), model.transformer.wte(torch.tensor([chosen]))], dim=1)
                z = model(inputs_embeds=embeds).logits[0, -1]
                z[suppressed] = float("-inf")
                chosen.append(int(z.argmax()))
                if chosen[-1] == generation.eos_token_id:
                    break
            body = [t for t in chosen[1:] if t != generation.eos_token_id]
            caption = tokenizer.decode(body)
            same += caption == r["caption"]
            if caption != r["caption"]:
                print(f"image {r['image_id']}: transformers {caption!r}, captune {r['caption']!r}")
    print(f"{same} of {len(results)} captions identical")
    if same != len(results):
        sys.exit(1)


def same_as(model, export, folder):
    original = GPT2LMHeadModel.from_pretrained(folder)
    ours, theirs = model.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys(), f"weights differ in name: {ours.keys() ^ theirs.keys()}"
    changed = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not changed, f"weights differ from {folder}'s: {changed}"
    # The config as written, less the fields captune adds (captune_*).
    config = json.load(open(f"{export}/config.json"))
    want = json.load(open(f"{folder}/config.json"))
    config = {k: v for k, v in config.items() if not k.startswith("captune_")}
    differ = sorted(k for k in config.keys() | want.keys() if config.get(k) != want.get(k))
    assert not differ, f"config fields differ from {folder}'s: {differ}"
    print(f"the decoder is {folder}'s, bit for bit: {len(ours)} tensors, config")


if __name__ == "__main__":
    main()
