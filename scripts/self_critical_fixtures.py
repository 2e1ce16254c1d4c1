#!/usr/bin/env python3
"""Makes tests/data/self-critical: self-critical.pytorch's own checkpoints,
as its code saves them, of tiny random models (its FCModel, NewFCModel,
Att2in2Model and UpDownModel), and what that code computes with them in float64, for
tests/suite/models/self_critical.rs to compare captune's conversion of
them with, so that CI needs no torch.

The models are run from the repository (https://github.com/ruotianluo/
self-critical.pytorch, given with --repo): its `captioning.models`
classes as they are, nothing shimmed. For each model, `NAME.pth` is
`torch.save(model.state_dict())` and `NAME_expected.safetensors` holds:

- `features` [3, FC]: the FC model's image features (`fc_feats`); or
  `features` [3, TOKENS, FC]: an attention model's region features
  (`att_feats`), their mean its `fc_feats`;
- `targets` [3, SEQ + 1]: each image's caption in the step, in
  self-critical's ids (words 1 to V), then 0 (its end), then -1;
- `loss`: its LanguageModelCriterion on the model's `_forward` with the
  captions behind its start id 0 (the mean over the words and the end of
  -log p), and `grad.NAME`: the gradient of every parameter, under
  self-critical's names;
- `greedy` [3, SEQ]: its greedy captions, words until its end, then -1:
  its `_sample` (greedy); for FCModel, from its own
  `img_embed`, `core` and `get_logprobs_state`, step by step as its
  `_sample` runs them (whose greedy branch fails for the FC model at this
  commit: it stores one log-probability per row where it keeps a
  distribution).

`cocotalk.json` is the vocabulary as its prepro_labels.py writes it
(`ix_to_word`), with its `UNK`. Each model is trained a little on the
three captions first (Adam, in float32), so that its greedy captions end.

Usage:
    pip install torch safetensors
    git clone https://github.com/ruotianluo/self-critical.pytorch
    python3 scripts/self_critical_fixtures.py --repo self-critical.pytorch
"""

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "self-critical"
WORDS = ["a", "dog", "runs", "on", "grass", "two", "girls", "play", "UNK", "man", "sits"]
CAPTIONS = ["a dog runs on grass", "two girls play", "a man UNK"]
FC, HIDDEN, SEQ, TOKENS = 24, 16, 8, 5
TRAIN_STEPS = 50


def options():
    return SimpleNamespace(
        vocab_size=len(WORDS),
        vocab={str(i + 1): w for i, w in enumerate(WORDS)},
        input_encoding_size=HIDDEN,
        rnn_type="lstm",
        rnn_size=HIDDEN,
        num_layers=1,
        drop_prob_lm=0.0,
        seq_length=SEQ,
        max_length=SEQ,
        fc_feat_size=FC,
        att_feat_size=FC,
        att_hid_size=HIDDEN,
    )


def labels():
    """[3, SEQ + 2]: the start 0, the words, the end 0 and padding 0, as
    its data loader makes them; and each caption's ids with the end."""
    index = {w: i + 1 for i, w in enumerate(WORDS)}
    rows, ids = [], []
    for caption in CAPTIONS:
        words = [index[w] for w in caption.split()]
        ids.append(words + [0])
        rows.append([0] + words + [0] * (SEQ + 1 - len(words)))
    return torch.tensor(rows), ids


def inputs(features):
    """`fc_feats` and `att_feats` of the image features."""
    if features.dim() == 2:
        return features, None
    return features.mean(1), features


def loss_of(model, features, seq, ids):
    """LanguageModelCriterion: -log p of each word and the end, averaged."""
    logprobs = model(*inputs(features), seq)
    picked = [logprobs[r, t, i] for r, row in enumerate(ids) for t, i in enumerate(row)]
    return -torch.stack(picked).mean()


def fc_greedy(model, features):
    """FCModel's greedy captions, as its _sample steps: the image, then
    the start id 0, then the most likely id until 0 or SEQ words."""
    state = model.init_hidden(features.shape[0])
    _, state = model.core(model.img_embed(features), state)
    it = torch.zeros(features.shape[0], dtype=torch.long)
    rows = []
    for _ in range(SEQ):
        logprobs, state = model.get_logprobs_state(it, state)
        it = logprobs.argmax(1)
        rows.append(it)
    return torch.stack(rows, 1)


def make(name, model_class, tokens=None):
    torch.manual_seed(0)
    model = model_class(options())
    features = torch.randn(3, FC) * 2.0 if tokens is None else torch.randn(3, tokens, FC)
    seq, ids = labels()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(TRAIN_STEPS):
        optimiser.zero_grad()
        loss_of(model, features, seq, ids).backward()
        optimiser.step()
    model.eval()
    torch.save(model.state_dict(), OUT / f"{name}.pth")

    model = model.double()
    features = features.double()
    model.zero_grad()
    loss = loss_of(model, features, seq, ids)
    loss.backward()
    with torch.no_grad():
        if model_class.__name__ == "FCModel":
            greedy = fc_greedy(model, features)
        else:
            greedy, _ = model(*inputs(features), mode="sample", opt={"sample_method": "greedy"})
    targets = torch.full((3, SEQ + 1), -1.0, dtype=torch.float64)
    for r, row in enumerate(ids):
        targets[r, : len(row)] = torch.tensor(row, dtype=torch.float64)
    captions = torch.full((3, SEQ), -1.0, dtype=torch.float64)
    for r, row in enumerate(greedy.tolist()):
        words = row[: row.index(0)] if 0 in row else row
        captions[r, : len(words)] = torch.tensor(words, dtype=torch.float64)
    expected = {
        "features": features,
        "targets": targets,
        "loss": loss.detach().reshape(1),
        "greedy": captions,
    }
    for n, p in model.named_parameters():
        expected[f"grad.{n}"] = p.grad
    expected = {k: v.float().contiguous() for k, v in expected.items()}
    save_file(expected, OUT / f"{name}_expected.safetensors", {"made_by": Path(__file__).name})
    print(f"{name}: loss {loss.item():.6f}, greedy {greedy.tolist()}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="self-critical.pytorch's checkout")
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    from captioning import models as repo_models

    OUT.mkdir(parents=True, exist_ok=True)
    vocab = {"ix_to_word": {str(i + 1): w for i, w in enumerate(WORDS)}, "images": []}
    (OUT / "cocotalk.json").write_text(json.dumps(vocab, indent=1) + "\n")
    make("fc", repo_models.FCModel)
    make("newfc", repo_models.NewFCModel)
    make("att2in2", repo_models.Att2in2Model, TOKENS)
    make("updown", repo_models.UpDownModel, TOKENS)


if __name__ == "__main__":
    main()
