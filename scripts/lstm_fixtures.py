#!/usr/bin/env python3
"""Independent LSTM captioners in PyTorch (float64), written from the
papers and docs/lstm.md, no captune code, for tests/suite/models/lstm.rs:
the FC model, top-down attention and Att2in.

The FC model: a linear layer projects the image embedding to the hidden
size; the projection is every layer's initial hidden state (the
sequence-level exploration paper, Chen and Jin, 2020: "image_feed":
"hidden") or the input of a step before the start token (self-critical
training's FC model, Rennie et al., 2017: "input"); then nn.Embedding,
nn.LSTM (two layers here) and an untied nn.Linear output layer, with
<pad> and <bos> masked out of the policy.

For each image feed it writes a captune checkpoint of random weights
(tests/data/lstm_fc_FEED.safetensors) and, for one fixed batch, the MLE
loss (the mean over real tokens of -log softmax), every parameter's
gradient, and the greedy captions and the two best of a beam search of
width 3 of the batch's images (tests/data/lstm_fc_FEED_expected.safetensors),
float64 stored as float32.

It also computes one SCST step (greedy baseline) of each model, for the
samples and greedy captions captune drew at a run's first step
(tests/data/lstm_MODEL_scst_inputs.safetensors, written by the ignored
test `write_scst_inputs` in tests/suite/models/lstm.rs), with rewards by
pycocoevalcap's CIDEr-D over the golden sequence corpus, as
scripts/golden.py computes them: the loss and every parameter's gradient
(tests/data/lstm_MODEL_scst_expected.safetensors).

    pip install torch safetensors pycocoevalcap
    python3 scripts/lstm_fixtures.py tests/data
    cargo test --test suite lstm:: -- --ignored    # only if a fixture's weights or the sampler changed
    python3 scripts/lstm_fixtures.py tests/data
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

DT = torch.float64
EMBED, HIDDEN, LAYERS, MAX_LEN = 6, 8, 2, 8
WORDS = ["a", "red", "circle", "blue", "star", "and", "big", "small"]
VOCAB = 4 + len(WORDS)  # <pad> <bos> <eos> <unk>, then the words
PAD, BOS, EOS = 0, 1, 2
T = MAX_LEN - 1  # token positions: <bos> and the words
BEAM_WIDTH, N_BEST = 3, 2
TOKENS, TOKEN_DIM = 4, 5  # the top-down model's image tokens


class Core(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(HIDDEN, HIDDEN, LAYERS, batch_first=True, dtype=DT)


class FC(torch.nn.Module):
    def __init__(self, feed):
        super().__init__()
        self.feed = feed
        self.fc_embed = torch.nn.Linear(EMBED, HIDDEN, dtype=DT)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, dtype=DT)
        self.core = Core()
        self.logit = torch.nn.Linear(HIDDEN, VOCAB, dtype=DT)

    def forward(self, features, inputs):
        """Logits [batch, positions, vocab] of the token positions."""
        image = self.fc_embed(features)
        words = self.embed(inputs)
        if self.feed == "hidden":
            h0 = image.unsqueeze(0).expand(LAYERS, -1, -1).contiguous()
            out, _ = self.core.lstm(words, (h0, torch.zeros_like(h0)))
        else:
            out, _ = self.core.lstm(torch.cat([image.unsqueeze(1), words], dim=1))
            out = out[:, 1:]
        logits = self.logit(out)
        never = torch.zeros(VOCAB, dtype=torch.bool)
        never[[PAD, BOS]] = True
        return logits.masked_fill(never, float("-inf"))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.h2att = torch.nn.Linear(HIDDEN, HIDDEN, dtype=DT)
        self.alpha_net = torch.nn.Linear(HIDDEN, 1, bias=False, dtype=DT)


class UpDownCore(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.att_lstm = torch.nn.LSTMCell(3 * HIDDEN, HIDDEN, dtype=DT)
        self.attention = Attention()
        self.lang_lstm = torch.nn.LSTMCell(2 * HIDDEN, HIDDEN, dtype=DT)


class UpDown(torch.nn.Module):
    """Top-down attention (Anderson et al., 2018) over image tokens: the
    tokens embedded (ReLU) and projected to keys once, their mean v̄; per
    position the attention cell reads [h2; v̄; word], its state queries
    additive attention, the language cell reads [context; h1]."""

    def __init__(self):
        super().__init__()
        self.att_embed = torch.nn.Linear(TOKEN_DIM, HIDDEN, dtype=DT)
        self.ctx2att = torch.nn.Linear(HIDDEN, HIDDEN, dtype=DT)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, dtype=DT)
        self.core = UpDownCore()
        self.logit = torch.nn.Linear(HIDDEN, VOCAB, dtype=DT)

    def forward(self, tokens, inputs):
        values = torch.relu(self.att_embed(tokens))
        keys, mean = self.ctx2att(values), values.mean(1)
        zero = torch.zeros(tokens.shape[0], HIDDEN, dtype=DT)
        (h1, c1), (h2, c2) = (zero, zero), (zero, zero)
        outputs = []
        for t in range(inputs.shape[1]):
            word = self.embed(inputs[:, t])
            h1, c1 = self.core.att_lstm(torch.cat([h2, mean, word], -1), (h1, c1))
            query = self.core.attention.h2att(h1)
            scores = self.core.attention.alpha_net(torch.tanh(keys + query[:, None])).squeeze(-1)
            context = (torch.softmax(scores, -1)[..., None] * values).sum(1)
            h2, c2 = self.core.lang_lstm(torch.cat([context, h1], -1), (h2, c2))
            outputs.append(h2)
        logits = self.logit(torch.stack(outputs, 1))
        never = torch.zeros(VOCAB, dtype=torch.bool)
        never[[PAD, BOS]] = True
        return logits.masked_fill(never, float("-inf"))


class Att2inCore(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTMCell(HIDDEN, HIDDEN, dtype=DT)
        self.a2c = torch.nn.Linear(HIDDEN, HIDDEN, dtype=DT)
        self.attention = Attention()


class Att2in(torch.nn.Module):
    """Att2in (Rennie et al., 2017): the previous hidden state queries
    additive attention over the embedded tokens, and the context enters
    only the cell's input (the g gate) through a2c."""

    def __init__(self):
        super().__init__()
        self.att_embed = torch.nn.Linear(TOKEN_DIM, HIDDEN, dtype=DT)
        self.ctx2att = torch.nn.Linear(HIDDEN, HIDDEN, dtype=DT)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, dtype=DT)
        self.core = Att2inCore()
        self.logit = torch.nn.Linear(HIDDEN, VOCAB, dtype=DT)

    def forward(self, tokens, inputs):
        values = torch.relu(self.att_embed(tokens))
        keys = self.ctx2att(values)
        h = c = torch.zeros(tokens.shape[0], HIDDEN, dtype=DT)
        cell, outputs = self.core.lstm, []
        for t in range(inputs.shape[1]):
            query = self.core.attention.h2att(h)
            scores = self.core.attention.alpha_net(torch.tanh(keys + query[:, None])).squeeze(-1)
            context = (torch.softmax(scores, -1)[..., None] * values).sum(1)
            gates = (self.embed(inputs[:, t]) @ cell.weight_ih.T + cell.bias_ih
                     + h @ cell.weight_hh.T + cell.bias_hh)
            i, f, g, o = gates.chunk(4, -1)
            g = g + self.core.a2c(context)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        logits = self.logit(torch.stack(outputs, 1))
        never = torch.zeros(VOCAB, dtype=torch.bool)
        never[[PAD, BOS]] = True
        return logits.masked_fill(never, float("-inf"))


def greedy(model, features):
    """Each image's caption: the most likely id (the lowest among ties)
    after the captions so far, until <eos> or T ids."""
    captions = []
    for f in features:
        ids = [BOS]
        while len(ids) <= T:
            logits = model(f.unsqueeze(0), torch.tensor([ids]))[0, -1]
            ids.append(int(torch.argmax(logits)))
            if ids[-1] == EOS:
                break
        captions.append(ids[1:])
    return captions


def beam(model, features, width, n_best):
    """Each image's n_best captions by beam search and their total
    log-probabilities (docs/evaluation.md): the live beams' continuations
    ranked, those among the best `width` that end (or reach T ids)
    finish, the best `width` others go on, until the n_best-th finished
    caption beats every live beam."""
    out = []
    for f in features:
        live, finished = [([], 0.0)], []
        for step in range(T):
            if not live:
                break
            candidates = []
            for k, (ids, score) in enumerate(live):
                logits = model(f.unsqueeze(0), torch.tensor([[BOS] + ids]))[0, -1]
                logp = torch.log_softmax(logits, dim=-1)
                candidates += [(score + float(logp[j]), k, j) for j in range(VOCAB) if j not in (PAD, BOS)]
            candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
            going = []
            for rank, (score, k, j) in enumerate(candidates[:2 * width]):
                ids = live[k][0] + [j]
                if j == EOS or step == T - 1:
                    if rank < width:
                        finished.append((ids, score))
                elif len(going) < width:
                    going.append((ids, score))
            finished = sorted(finished, key=lambda c: -c[1])[:width]
            if len(finished) >= n_best and all(s <= finished[n_best - 1][1] for _, s in going):
                going = []
            live = going
        out += finished[:n_best]
    return out


def fixture(out_dir, name, make, seed, scale):
    """The model `make` gives, its weights drawn from N(0, scale^2): a seed
    and scale whose greedy captions differ from image to image and end at
    several lengths."""
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    captions = [[BOS, 4, 5, 6, EOS], [BOS, 4, 7, 8, 9, 6, EOS], [BOS, 10, EOS]]
    inputs = torch.full((3, T), PAD, dtype=torch.long)
    targets = torch.full((3, T), PAD, dtype=torch.long)
    for r, c in enumerate(captions):
        inputs[r, :len(c) - 1] = torch.tensor(c[:-1])
        targets[r, :len(c) - 1] = torch.tensor(c[1:])
    if isinstance(model, (UpDown, Att2in)):
        features = torch.randn(3, TOKENS, TOKEN_DIM, dtype=DT)
    else:
        features = torch.nn.functional.normalize(torch.randn(3, EMBED, dtype=DT), dim=-1)
    logp = torch.log_softmax(model(features, inputs), dim=-1)
    real = targets != PAD
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    loss = -picked.masked_fill(~real, 0.0).sum() / real.sum()
    loss.backward()
    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    params = dict(model.named_parameters())
    config = {
        "family": "lstm", "embed_dim": EMBED, "prefix_len": 0, "mapper_hidden": 0,
        "decoder": {"width": HIDDEN, "layers": LAYERS, "heads": 1, "causal": True},
        "max_len": MAX_LEN, "vocab_size": VOCAB,
    }
    if isinstance(model, (UpDown, Att2in)):
        kind = "updown" if isinstance(model, UpDown) else "att2in"
        config.update({"embed_dim": TOKEN_DIM, "image_tokens": TOKENS, "lstm": {"model": kind}})
        config["decoder"]["layers"] = 1
    else:
        config["lstm"] = {"model": "fc", "image_feed": model.feed}
    save_file(
        {n: f32(p) for n, p in params.items()},
        f"{out_dir}/lstm_{name}.safetensors",
        metadata={"format": "captune captioner", "captioner_config": json.dumps(config),
                  "vocab": json.dumps(WORDS)},
    )
    with torch.no_grad():
        captions = greedy(model, features)
        beams = beam(model, features, BEAM_WIDTH, N_BEST)
    padded = lambda rows: f32(torch.tensor([c + [-1] * (T - len(c)) for c in rows], dtype=DT))
    expected = {
        "features": f32(features), "inputs": f32(inputs), "targets": f32(targets),
        "loss": f32(loss.reshape(1)), "greedy": padded(captions),
        "beam": padded([ids for ids, _ in beams]),
        "beam_logp": f32(torch.tensor([score for _, score in beams], dtype=DT)),
    }
    expected.update({f"grad.{n}": f32(p.grad) for n, p in params.items()})
    save_file(expected, f"{out_dir}/lstm_{name}_expected.safetensors", metadata={
        "made_by": "scripts/lstm_fixtures.py (PyTorch " + torch.__version__ + ", float64)"})
    print(f"{name}: loss {float(loss.detach()):.6f}, greedy {captions}, beam {beams}")


def scst(out_dir, name, make):
    """One SCST step with the greedy baseline on the checkpoint `fixture`
    wrote: for sample k of row i, advantage r_ik - r_i(greedy); the loss
    -sum(advantage * log p(sample)) / #samples."""
    from safetensors.torch import load_file
    from safetensors import safe_open
    from golden import cider_d, teacher_forced, words_of
    path = f"{out_dir}/lstm_{name}_scst_inputs.safetensors"
    if not os.path.exists(path):
        print(f"{name}: no SCST inputs yet (cargo test --test suite lstm:: -- --ignored)")
        return
    inputs = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    references, images = json.loads(meta["references"]), json.loads(meta["images"])
    model = make()
    weights = load_file(f"{out_dir}/lstm_{name}.safetensors")
    model.load_state_dict({n: t.to(DT) for n, t in weights.items()})
    features = load_file(f"{out_dir}/lstm_{name}_expected.safetensors")["features"].to(DT)
    samples = inputs["samples"].long().tolist()
    greedy_text = [words_of(ids) for ids in inputs["greedy"].long().tolist()]
    s = len(samples) // len(images)
    sample_text = [words_of(ids) for ids in samples]
    rewards = [[0.0] * s for _ in images]
    for k in range(s):  # one scorer per round of samples, as captune scores them
        cands = [sample_text[i * s + k] for i in range(len(images))]
        for i, r in enumerate(cider_d(cands, images, references)):
            rewards[i][k] = r
    baseline = cider_d(greedy_text, images, references)
    adv = torch.tensor([r - baseline[i] for i in range(len(images)) for r in rewards[i]], dtype=DT)
    _, tf_inputs, tf_targets = teacher_forced(samples)
    rows = torch.tensor([j // s for j in range(len(samples))])
    logp = torch.log_softmax(model(features[rows], tf_inputs), dim=-1)
    real = tf_targets != PAD
    picked = logp.gather(-1, tf_targets.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0)
    loss = -(adv * picked.sum(-1)).sum() / len(samples)
    loss.backward()
    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    expected = {"scst.loss": f32(loss.reshape(1))}
    expected.update({f"scst.grad.{n}": f32(p.grad) for n, p in model.named_parameters()})
    cases = [{"name": "scst", "objective": "scst", "settings": {"baseline": "greedy"}}]
    save_file(expected, f"{out_dir}/lstm_{name}_scst_expected.safetensors", metadata={
        "cases": json.dumps(cases),
        "made_by": "scripts/lstm_fixtures.py (PyTorch " + torch.__version__ + ", float64)"})
    print(f"{name} SCST: loss {float(loss.detach()):.6f}, rewards {rewards}, greedy {baseline}")


MODELS = [  # (name, the model, the seed and scale of its weights)
    ("fc_hidden", lambda: FC("hidden"), 2, 0.8),
    ("fc_input", lambda: FC("input"), 26, 1.2),
    ("updown", UpDown, 12, 1.6),
    ("att2in", Att2in, 35, 1.2),
]

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    for name, make, seed, scale in MODELS:
        fixture(out, name, make, seed, scale)
        scst(out, name, make)
