#!/usr/bin/env python3
"""An independent implementation of captune's captioner and retriever,
written from docs/checkpoints.md (the models), docs/training.md (the
losses, and which tensors AdamW decays) and the spec alone, no captune
code, for the golden test in tests/suite/models/golden.rs, as llm.c's test_gpt2.c.

For each model it builds a tiny one with random weights, writes it as a
captune checkpoint, and for one fixed batch writes the loss (the
captioner's MLE: mean over real tokens of -log softmax; the retriever's
symmetric InfoNCE at its learned scale), every parameter's gradient, and
every weight after one AdamW step with global-norm clipping and decoupled
weight decay active (torch.optim.AdamW and torch.nn.utils.clip_grad_norm_;
decay on the 2-D `*.weight` tensors of dense layers only, as
docs/training.md says), with AdamW's two moments after the step.
Everything is computed in float64 and stored as float32.

It also computes, from the same docs, the SMILE family's loss and
gradients (first-token MLE, none, and shift mixed with MLE) on a
checkpoint whose vocabulary holds the first-token alternatives, and those
of SCST (greedy and mean baselines), SLE and SLL-ME for the samples and
greedy captions captune drew for one step (golden_sequence_inputs, written
by the ignored test `write_sequence_inputs` in tests/suite/models/golden.rs), with
rewards by pycocoevalcap's CIDEr-D over the corpus' statistics; and
DiscriTune's (greedy, with hard negatives, sampled) with the golden
retriever's text tower as the listener, for the captions captune drew
(golden_discritune_inputs, from the ignored test `write_discritune_inputs`);
and CLIP relevance's (straight-through and soft) through the same text
tower, for the Gumbel-max captions and the Gumbel noise captune drew
(golden_relevance_inputs, from the ignored test `write_relevance_inputs`).

    pip install torch safetensors pycocoevalcap
    cargo test --test suite golden:: -- --ignored    # only if the sampler or the golden captioner changed
    python3 scripts/golden.py tests/data
"""
import json
import math
import sys

import torch
from safetensors.torch import save_file

DT = torch.float64

# The tiny captioner.
EMBED, K, HIDDEN, WIDTH, LAYERS, HEADS, MAX_LEN = 6, 2, 8, 16, 2, 2, 8
WORDS = ["a", "red", "circle", "blue", "star", "and", "big", "small"]
VOCAB = 4 + len(WORDS)  # <pad> <bos> <eos> <unk>, then the words
PAD, BOS, EOS, UNK = 0, 1, 2, 3
T = MAX_LEN - 1  # token positions: <bos> and the words
S = K + T
# The optimiser step the golden values take.
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-2, (0.9, 0.999), 1e-8, 0.1, 0.5


def tower_shapes(t, d, layers):
    """A transformer's tensors, as docs/checkpoints.md names them."""
    out = {}
    for i in range(layers):
        p = f"{t}.blocks.{i}"
        out.update({
            f"{p}.ln1.weight": (d,), f"{p}.ln1.bias": (d,),
            f"{p}.attn.qkv.weight": (d, 3 * d), f"{p}.attn.qkv.bias": (3 * d,),
            f"{p}.attn.proj.weight": (d, d), f"{p}.attn.proj.bias": (d,),
            f"{p}.ln2.weight": (d,), f"{p}.ln2.bias": (d,),
            f"{p}.mlp.fc1.weight": (d, 4 * d), f"{p}.mlp.fc1.bias": (4 * d,),
            f"{p}.mlp.fc2.weight": (4 * d, d), f"{p}.mlp.fc2.bias": (d,),
        })
    out.update({f"{t}.ln_f.weight": (d,), f"{t}.ln_f.bias": (d,)})
    return out


def shapes():
    """Every tensor of the captioner by name, as docs/checkpoints.md lists them."""
    d = WIDTH
    out = {
        "mapper.fc1.weight": (EMBED, HIDDEN),
        "mapper.fc1.bias": (HIDDEN,),
        "mapper.fc2.weight": (HIDDEN, K * d),
        "mapper.fc2.bias": (K * d,),
        "decoder.tokens": (VOCAB, d),
        "decoder.positions": (S, d),
    }
    out.update(tower_shapes("decoder", d, LAYERS))
    return out


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def dense(x, p, name):
    return x @ p[name + ".weight"] + p[name + ".bias"]


def block(x, p, pre, causal=True):
    """Pre-LN: x + attn(ln1(x)), then + mlp(ln2(.))."""
    n, d = x.shape[-2], x.shape[-1]
    dh = d // HEADS
    qkv = dense(layer_norm(x, p[pre + ".ln1.weight"], p[pre + ".ln1.bias"]), p, pre + ".attn.qkv")
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    heads = []
    for h in range(HEADS):
        cols = slice(h * dh, (h + 1) * dh)
        scores = q[..., cols] @ k[..., cols].transpose(-1, -2) / math.sqrt(dh)
        if causal:
            scores = scores.masked_fill(future, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[..., cols])
    x = x + dense(torch.cat(heads, dim=-1), p, pre + ".attn.proj")
    h = layer_norm(x, p[pre + ".ln2.weight"], p[pre + ".ln2.bias"])
    return x + dense(gelu(dense(h, p, pre + ".mlp.fc1")), p, pre + ".mlp.fc2")


def logits_of(p, features, inputs):
    """The decoder's logits [batch, T, vocab] of the token positions, with
    <pad> and <bos> masked out of the policy (-inf)."""
    batch = features.shape[0]
    prefix = dense(gelu(dense(features, p, "mapper.fc1")), p, "mapper.fc2").reshape(batch, K, WIDTH)
    x = torch.cat([prefix, p["decoder.tokens"][inputs]], dim=1) + p["decoder.positions"]
    for i in range(LAYERS):
        x = block(x, p, f"decoder.blocks.{i}")
    h = layer_norm(x, p["decoder.ln_f.weight"], p["decoder.ln_f.bias"])[:, K:]
    logits = h @ p["decoder.tokens"].T  # tied output layer
    never = torch.zeros(logits.shape[-1], dtype=torch.bool)
    never[[PAD, BOS]] = True
    return logits.masked_fill(never, float("-inf"))


def mean_nll(logits, targets, allowed=None):
    """The mean over real (non-pad) targets of -log softmax over the ids
    `allowed` ([batch, T, vocab] booleans; all of them when None)."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    real = targets != PAD
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -picked.masked_fill(~real, 0.0).sum() / real.sum()


def loss_of(p, features, inputs, targets):
    """MLE: the mean over real (non-pad) targets of -log softmax, over the
    policy: <pad> and <bos> are never generated and have no probability."""
    return mean_nll(logits_of(p, features, inputs), targets)


def random_params(shapes_by_name):
    """Random weights; layer-norm gains near 1."""
    params = {n: torch.randn(s, dtype=DT) * 0.3 for n, s in shapes_by_name.items()}
    for n in params:
        if ".ln" in n and n.endswith(".weight"):
            params[n] = 1 + params[n]
    return params


def step(params, loss_of_params):
    """The loss, every gradient, the gradient norm, and every weight after one AdamW step."""
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    loss = loss_of_params(leaves)
    loss.backward()
    grads = {n: t.grad.clone() for n, t in leaves.items()}
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    assert norm > MAX_NORM, f"clipping must be active (gradient norm {norm})"
    decays = lambda n, t: n.endswith(".weight") and t.dim() == 2
    opt = torch.optim.AdamW(
        [{"params": [t for n, t in leaves.items() if decays(n, t)], "weight_decay": WEIGHT_DECAY},
         {"params": [t for n, t in leaves.items() if not decays(n, t)], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    torch.nn.utils.clip_grad_norm_(list(leaves.values()), MAX_NORM)
    opt.step()
    moments = {}
    for n, t in leaves.items():
        moments[f"m.{n}"] = opt.state[t]["exp_avg"]
        moments[f"v.{n}"] = opt.state[t]["exp_avg_sq"]
    return loss.detach(), grads, norm, leaves, moments


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def save(out_dir, name, kind, config_key, config, words, params, inputs, stepped):
    loss, grads, norm, after, moments = stepped
    save_file(
        {n: f32(t) for n, t in params.items()},
        f"{out_dir}/golden_{name}.safetensors",
        metadata={"format": kind, config_key: json.dumps(config), "vocab": json.dumps(words)},
    )
    expected = {n: f32(t) for n, t in inputs.items()}
    expected.update({"loss": f32(loss.reshape(1)), "grad_norm": f32(torch.tensor([norm]))})
    expected.update({f"grad.{n}": f32(g) for n, g in grads.items()})
    expected.update({f"after.{n}": f32(t) for n, t in after.items()})
    expected.update({n: f32(t) for n, t in moments.items()})
    save_file(expected, f"{out_dir}/golden_{name}_expected.safetensors", metadata={
        "lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS),
        "weight_decay": str(WEIGHT_DECAY), "max_grad_norm": str(MAX_NORM),
        "made_by": "scripts/golden.py (PyTorch " + torch.__version__ + ", float64)"})
    print(f"{name}: loss {float(loss):.6f}, gradient norm {norm:.4f} (clipped to {MAX_NORM})")


def captioner(out_dir):
    torch.manual_seed(0)
    params = random_params(shapes())
    # One batch of three captions of different lengths.
    captions = [[BOS, 4, 5, 6, EOS], [BOS, 4, 7, 8, 9, 6, EOS], [BOS, 10, EOS]]
    inputs = torch.full((3, T), PAD, dtype=torch.long)
    targets = torch.full((3, T), PAD, dtype=torch.long)
    for r, c in enumerate(captions):
        inputs[r, :len(c) - 1] = torch.tensor(c[:-1])  # <bos> w1 .. wn
        targets[r, :len(c) - 1] = torch.tensor(c[1:])  # w1 .. wn <eos>
    # Image embeddings are L2-normalised before the mapper (checkpoints.md).
    features = torch.nn.functional.normalize(torch.randn(3, EMBED, dtype=DT), dim=-1)
    stepped = step(params, lambda p: loss_of(p, features, inputs, targets))
    config = {
        "embed_dim": EMBED, "prefix_len": K, "mapper_hidden": HIDDEN,
        "decoder": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "causal": True},
        "max_len": MAX_LEN, "vocab_size": VOCAB,
    }
    save(out_dir, "captioner", "captune captioner", "captioner_config", config, WORDS, params,
         {"features": features, "inputs": inputs, "targets": targets}, stepped)


# The tiny retriever: 8x8 RGB images in 4x4 patches, a text tower of 6 positions.
IMAGE, PATCH, R_WIDTH, R_LAYERS, R_MAX_LEN, R_EMBED = 8, 4, 16, 1, 6, 8
R_WORDS = ["a", "red", "circle", "blue", "star"]
R_VOCAB = 4 + len(R_WORDS)
PATCHES = (IMAGE // PATCH) ** 2
PATCH_DIM = 3 * PATCH * PATCH


def retriever_shapes():
    out = {
        "image.patch_embed.weight": (PATCH_DIM, R_WIDTH), "image.patch_embed.bias": (R_WIDTH,),
        "image.positions": (PATCHES, R_WIDTH),
    }
    out.update(tower_shapes("image", R_WIDTH, R_LAYERS))
    out.update({"image.proj.weight": (R_WIDTH, R_EMBED), "image.proj.bias": (R_EMBED,),
                "text.tokens": (R_VOCAB, R_WIDTH), "text.positions": (R_MAX_LEN, R_WIDTH)})
    out.update(tower_shapes("text", R_WIDTH, R_LAYERS))
    out.update({"text.proj.weight": (R_WIDTH, R_EMBED), "text.proj.bias": (R_EMBED,),
                "logit_scale": (1,)})
    return out


def patches_of(pixels):
    """[B, size, size, 3] bytes to [B, patches, 3*p*p]: (v/255 - 0.5) * 4, row-major
    [y, x, channel] inside a patch, patches row-major over the grid."""
    b, side = pixels.shape[0], IMAGE // PATCH
    x = (pixels / 255.0 - 0.5) * 4.0
    x = x.reshape(b, side, PATCH, side, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, PATCHES, PATCH_DIM)


def text_tower(p, x, lengths):
    """The text tower on input embeddings x [n, R_MAX_LEN, width]: learned
    positions, causal blocks, the final layer norm, the position of each
    caption's <eos> (lengths - 1), the projection (not normalised)."""
    t = x + p["text.positions"]
    for i in range(R_LAYERS):
        t = block(t, p, f"text.blocks.{i}", causal=True)
    t = layer_norm(t, p["text.ln_f.weight"], p["text.ln_f.bias"])
    return dense(t[torch.arange(t.shape[0]), lengths - 1], p, "text.proj")


def retriever_loss(p, pixels, ids, lengths):
    """Symmetric InfoNCE: L2-normalised embeddings, cosines times exp(logit_scale)."""
    x = dense(patches_of(pixels), p, "image.patch_embed") + p["image.positions"]
    for i in range(R_LAYERS):
        x = block(x, p, f"image.blocks.{i}", causal=False)
    x = layer_norm(x, p["image.ln_f.weight"], p["image.ln_f.bias"]).mean(dim=1)
    image = torch.nn.functional.normalize(dense(x, p, "image.proj"), dim=-1)
    text = torch.nn.functional.normalize(text_tower(p, p["text.tokens"][ids], lengths), dim=-1)
    logits = torch.exp(p["logit_scale"]) * image @ text.T
    labels = torch.arange(logits.shape[0])
    return (torch.nn.functional.cross_entropy(logits, labels)
            + torch.nn.functional.cross_entropy(logits.T, labels)) / 2


def retriever(out_dir):
    torch.manual_seed(1)
    params = random_params(retriever_shapes())
    params["logit_scale"] = torch.tensor([math.log(1 / 0.07)], dtype=DT)
    captions = [[BOS, 4, 5, 6, EOS], [BOS, 7, 8, EOS], [BOS, 4, 7, 5, 6, EOS]]
    ids = torch.full((3, R_MAX_LEN), PAD, dtype=torch.long)
    for r, c in enumerate(captions):
        ids[r, :len(c)] = torch.tensor(c)
    lengths = torch.tensor([len(c) for c in captions])
    pixels = torch.randint(0, 256, (3, IMAGE, IMAGE, 3)).to(DT)
    stepped = step(params, lambda p: retriever_loss(p, pixels, ids, lengths))
    tower = lambda causal: {"width": R_WIDTH, "layers": R_LAYERS, "heads": HEADS, "causal": causal}
    config = {"image_size": IMAGE, "patch": PATCH, "image": tower(False), "text": tower(True),
              "max_len": R_MAX_LEN, "vocab_size": R_VOCAB, "embed_dim": R_EMBED}
    save(out_dir, "retriever", "captune retriever", "retriever_config", config, R_WORDS, params,
         {"pixels": pixels, "ids": ids}, stepped)


# The SMILE family on the captioner's batch, with the vocabulary's
# reserved first-token alternatives: "##a" and "##big", the alternatives
# of the words that begin a caption (docs/training.md).
ALTERNATIVES = {4: VOCAB, 10: VOCAB + 1}
SMILE_CASES = [  # (name, first_token, lambda)
    ("smile", "mle", 0.0),
    ("smile_none", "none", 0.0),
    ("smile_shift_mixed", "shift", 0.3),
]


def smile_loss(p, features, inputs, targets, first_token, mle_weight):
    """lambda * MLE + (1 - lambda) * SMILE: at each step a softmax over the
    unique ids of the caption's target (with <eos>, without padding; after
    first-token shifting, step 0's label is its word's alternative), except
    that with first_token "mle" step 0 runs over the whole vocabulary."""
    logits = logits_of(p, features, inputs)
    own = targets.clone()
    if first_token == "shift":
        own[:, 0] = torch.tensor([ALTERNATIVES[int(t)] for t in targets[:, 0]])
    allowed = torch.zeros(logits.shape, dtype=torch.bool)
    for r in range(own.shape[0]):
        ids = [int(t) for t in own[r] if int(t) != PAD]
        allowed[r, :, ids] = True
    if first_token == "mle":
        allowed[:, 0, :] = True
    subset = mean_nll(logits, own, allowed)
    return mle_weight * mean_nll(logits, targets) + (1 - mle_weight) * subset


def smile(out_dir):
    torch.manual_seed(2)
    vocab = VOCAB + len(ALTERNATIVES)
    shapes_by_name = shapes()
    shapes_by_name["decoder.tokens"] = (vocab, WIDTH)
    params = random_params(shapes_by_name)
    captions = [[BOS, 4, 5, 6, EOS], [BOS, 4, 7, 8, 9, 6, 6, EOS], [BOS, 10, 5, EOS]]
    inputs = torch.full((3, T), PAD, dtype=torch.long)
    targets = torch.full((3, T), PAD, dtype=torch.long)
    for r, c in enumerate(captions):
        inputs[r, :len(c) - 1] = torch.tensor(c[:-1])
        targets[r, :len(c) - 1] = torch.tensor(c[1:])
    features = torch.nn.functional.normalize(torch.randn(3, EMBED, dtype=DT), dim=-1)
    expected = {"features": f32(features), "inputs": f32(inputs), "targets": f32(targets)}
    for name, first_token, mle_weight in SMILE_CASES:
        leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
        loss = smile_loss(leaves, features, inputs, targets, first_token, mle_weight)
        loss.backward()
        expected[f"{name}.loss"] = f32(loss.reshape(1))
        expected.update({f"{name}.grad.{n}": f32(t.grad) for n, t in leaves.items()})
        print(f"{name}: loss {float(loss.detach()):.6f}")
    config = {
        "embed_dim": EMBED, "prefix_len": K, "mapper_hidden": HIDDEN,
        "decoder": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "causal": True},
        "max_len": MAX_LEN, "vocab_size": vocab,
    }
    words = WORDS + ["##a", "##big"]
    save_file({n: f32(t) for n, t in params.items()}, f"{out_dir}/golden_smile.safetensors",
              metadata={"format": "captune captioner", "captioner_config": json.dumps(config),
                        "vocab": json.dumps(words)})
    cases = [{"name": n, "objective": "smile", "settings": {"first_token": f, "mle_weight": w}}
             for n, f, w in SMILE_CASES]
    save_file(expected, f"{out_dir}/golden_smile_expected.safetensors", metadata={
        "cases": json.dumps(cases),
        "made_by": "scripts/golden.py (PyTorch " + torch.__version__ + ", float64)"})


def teacher_forced(captions):
    """Generated captions (ids padded with <pad>) as captune teacher-forces
    them: each one's ids, up to and with its <eos> when it has one; the
    inputs [n, T], <bos> then the ids but the last; the targets [n, T]."""
    own = [ids[:ids.index(EOS) + 1] if EOS in ids else [i for i in ids if i != PAD]
           for ids in captions]
    inputs = torch.full((len(own), T), PAD, dtype=torch.long)
    targets = torch.full((len(own), T), PAD, dtype=torch.long)
    for j, ids in enumerate(own):
        seq = [BOS] + ids
        inputs[j, :len(seq) - 1] = torch.tensor(seq[:-1])
        targets[j, :len(ids)] = torch.tensor(ids)
    return own, inputs, targets


# The sequence-level objectives on the captioner's checkpoint, from the
# samples and greedy captions captune drew for one step
# (golden_sequence_inputs.safetensors, written by
# `cargo test --test suite golden:: -- --ignored`).
SEQUENCE_CASES = [  # (name, objective, settings)
    ("scst_greedy", "scst", {"baseline": "greedy"}),
    ("scst_mean", "scst", {"baseline": "mean"}),
    ("sle", "sle", {}),
    ("sll_me", "sll-me", {"entropy_weight": 0.05}),
]


def words_of(ids):
    """A generated caption's words: the ids up to <eos>, as words, <unk>
    as itself."""
    out = []
    for i in ids:
        if i == EOS or i == PAD:
            break
        out.append("<unk>" if i == UNK else WORDS[i - 4])
    return " ".join(out)


def cider_d(candidates, images, references):
    """pycocoevalcap's CIDEr-D of candidates[r] against the references of
    corpus image images[r], with document frequencies and log(#images)
    over the whole corpus: every corpus image takes part in the scorer."""
    from pycocoevalcap.cider.cider_scorer import CiderScorer
    scorer = CiderScorer(n=4, sigma=6.0)
    chosen = dict(zip(images, candidates))
    for c, refs in enumerate(references):
        scorer += (chosen.get(c, refs[0]), refs)
    _, scores = scorer.compute_score()
    return [float(scores[c]) for c in images]


def sle_distance(a, b):
    """1 - (BLEU-3 + BLEU-4) / 2 of caption a against b alone (pycocoevalcap's
    per-sentence BLEU); 0 between equal captions."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer
    if a == b:
        return 0.0
    scorer = BleuScorer(n=4)
    scorer += (a, [b])
    _, scores = scorer.compute_score(option="closest", verbose=0)
    return 1.0 - (scores[2][0] + scores[3][0]) / 2


def sequence(out_dir):
    from safetensors.torch import load_file
    from safetensors import safe_open
    path = f"{out_dir}/golden_sequence_inputs.safetensors"
    inputs = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    references = json.loads(meta["references"])
    images = json.loads(meta["images"])
    params = load_file(f"{out_dir}/golden_captioner.safetensors")
    params = {n: t.to(DT) for n, t in params.items()}
    features = inputs["features"].to(DT)
    samples = inputs["samples"].long().tolist()
    greedy = inputs["greedy"].long().tolist()
    s = len(samples) // len(images)
    sample_text = [words_of(ids) for ids in samples]
    greedy_text = [words_of(ids) for ids in greedy]
    # rewards[i][k]: sample k of batch row i; one scorer per round.
    rewards = [[0.0] * s for _ in images]
    for k in range(s):
        cands = [sample_text[i * s + k] for i in range(len(images))]
        for i, r in enumerate(cider_d(cands, images, references)):
            rewards[i][k] = r
    greedy_rewards = cider_d(greedy_text, images, references)
    _, tf_inputs, tf_targets = teacher_forced(samples)
    rows = torch.tensor([j // s for j in range(len(samples))])
    expected = {}
    cases = []
    for name, objective, settings in SEQUENCE_CASES:
        advantages = []
        for i in range(len(images)):
            own = rewards[i]
            for k, r in enumerate(own):
                if objective == "sle":
                    texts = [sample_text[i * s + m] for m in range(s)]
                    d = [[sle_distance(texts[x], texts[y]) for y in range(s)] for x in range(s)]
                    b2 = sum(map(sum, d)) / (s * s)
                    spread = sum(d[k][m] - b2 for m in range(s))
                    advantages.append(0.75 * (r - greedy_rewards[i]) + 0.25 * 2 / s * spread)
                elif settings.get("baseline") == "mean":
                    advantages.append(r - (sum(own) - r) / (s - 1))
                else:
                    advantages.append(r - greedy_rewards[i])
        adv = torch.tensor(advantages, dtype=DT)
        weight = settings.get("entropy_weight", 0.0)
        leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
        logits = logits_of(leaves, features[rows], tf_inputs)
        logp = torch.log_softmax(logits, dim=-1)
        real = tf_targets != PAD
        picked = logp.gather(-1, tf_targets.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0)
        surrogate = -(adv * picked.sum(-1)).sum() / len(samples)
        p_ = logp.exp()
        entropy = -(p_ * logp.masked_fill(p_ == 0, 0.0)).sum(-1)
        mean_entropy = entropy.masked_fill(~real, 0.0).sum() / real.sum()
        loss = surrogate - weight * mean_entropy
        loss.backward()
        expected[f"{name}.loss"] = f32(loss.reshape(1))
        expected.update({f"{name}.grad.{n}": f32(t.grad) for n, t in leaves.items()})
        cases.append({"name": name, "objective": objective, "settings": settings})
        print(f"{name}: loss {float(loss.detach()):.6f}, rewards {rewards}, greedy {greedy_rewards}")
    save_file(expected, f"{out_dir}/golden_sequence_expected.safetensors", metadata={
        "cases": json.dumps(cases),
        "made_by": "scripts/golden.py (PyTorch " + torch.__version__ + ", float64)"})


# DiscriTune with the golden retriever as the listener, on a captioner
# that reads its 8-wide embeddings (golden_listener_captioner), from the
# captions captune drew for one step (golden_discritune_inputs, written by
# `cargo test --test suite golden:: -- --ignored`).
DISCRITUNE_CASES = [  # (name, settings, which captions)
    ("discritune", {}, "greedy"),
    ("discritune_hard", {"hard_negatives": 2}, "greedy"),
    ("discritune_sampled", {"caption_decoding": "sample"}, "sampled"),
]


def listener_captioner(out_dir):
    torch.manual_seed(3)
    shapes_by_name = shapes()
    shapes_by_name["mapper.fc1.weight"] = (R_EMBED, HIDDEN)
    params = random_params(shapes_by_name)
    config = {
        "embed_dim": R_EMBED, "prefix_len": K, "mapper_hidden": HIDDEN,
        "decoder": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "causal": True},
        "max_len": MAX_LEN, "vocab_size": VOCAB,
    }
    save_file({n: f32(t) for n, t in params.items()},
              f"{out_dir}/golden_listener_captioner.safetensors",
              metadata={"format": "captune captioner", "captioner_config": json.dumps(config),
                        "vocab": json.dumps(WORDS)})


def retriever_id(i):
    """The retriever's id of captioner id i: the specials as themselves, a
    word as the same word, or <unk> for a word the retriever does not know."""
    if i < 4:
        return i
    w = WORDS[i - 4]
    return R_WORDS.index(w) + 4 if w in R_WORDS else UNK


def listener_setup(out_dir, inputs_file):
    """The inputs file captune wrote (None before it did), the listener
    captioner's and the golden retriever's weights in float64."""
    import os
    from safetensors.torch import load_file
    path = f"{out_dir}/{inputs_file}"
    if not os.path.exists(path):
        print(f"{inputs_file}: not written yet (cargo test --test suite golden:: -- --ignored)")
        return None
    weights = lambda f: {n: t.to(DT) for n, t in load_file(f"{out_dir}/{f}").items()}
    return (load_file(path), weights("golden_listener_captioner.safetensors"),
            weights("golden_retriever.safetensors"))


def retriever_ids(ids):
    """A generated caption as the retriever reads it: <bos>, each word up to
    <eos> mapped to the retriever's vocabulary (<unk> if it has no such
    word), at most R_MAX_LEN - 2 of them, <eos>; an empty caption reads as
    <unk>. Returns the ids padded to R_MAX_LEN and their count."""
    words = []
    for i in ids:
        if i == EOS or i == PAD:
            break
        words.append(retriever_id(i))
    words = (words or [UNK])[:R_MAX_LEN - 2]
    seq = [BOS] + words + [EOS]
    return seq + [PAD] * (R_MAX_LEN - len(seq)), len(seq)


def discritune(out_dir):
    setup = listener_setup(out_dir, "golden_discritune_inputs.safetensors")
    if setup is None:
        return
    inputs, cap, ret = setup
    corpus = inputs["corpus_embeddings"].to(DT)
    rows = [int(i) for i in inputs["batch_images"]]
    distinct = list(dict.fromkeys(rows))
    scale = float(torch.exp(ret["logit_scale"]))
    expected = {}
    cases = []
    for name, settings, which in DISCRITUNE_CASES:
        captions = inputs[which].long().tolist()
        ids_list, tf_inputs, tf_targets = teacher_forced(captions)
        r_ids, r_len = zip(*(retriever_ids(ids) for ids in captions))
        with torch.no_grad():
            x = ret["text.tokens"][torch.tensor(r_ids)]
            text = torch.nn.functional.normalize(text_tower(ret, x, torch.tensor(r_len)), dim=-1)
        hard = settings.get("hard_negatives", 0)
        rewards = []
        for j, image in enumerate(distinct):
            cos = lambda k: float(text[j] @ corpus[k])
            others = [cos(k) for k in distinct if k != image]
            if hard:
                sims = [(float(corpus[image] @ corpus[k]), k) for k in range(len(corpus)) if k != image]
                nearest = [k for _, k in sorted(sims, reverse=True)[:hard]]
                others += [cos(k) for k in nearest if k not in distinct]
            logits = torch.tensor([scale * cos(image)] + [scale * c for c in others], dtype=DT)
            rewards.append(float(logits[0] - torch.logsumexp(logits, 0)))
        baseline = sum(rewards) / len(rewards)
        adv = torch.tensor([(r - baseline) / len(ids) for r, ids in zip(rewards, ids_list)], dtype=DT)
        leaves = {n: t.clone().requires_grad_(True) for n, t in cap.items()}
        logp = torch.log_softmax(logits_of(leaves, corpus[distinct], tf_inputs), dim=-1)
        real = tf_targets != PAD
        picked = logp.gather(-1, tf_targets.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0)
        loss = -(adv * picked.sum(-1)).sum() / len(distinct)
        loss.backward()
        expected[f"{name}.loss"] = f32(loss.reshape(1))
        expected[f"{name}.reward"] = f32(torch.tensor([sum(rewards) / len(rewards)]))
        expected.update({f"{name}.grad.{n}": f32(t.grad) for n, t in leaves.items()})
        cases.append({"name": name, "objective": "discritune", "settings": settings})
        print(f"{name}: loss {float(loss.detach()):.6f}, rewards {rewards}")
    save_file(expected, f"{out_dir}/golden_discritune_expected.safetensors", metadata={
        "cases": json.dumps(cases),
        "made_by": "scripts/golden.py (PyTorch " + torch.__version__ + ", float64)"})


# CLIP relevance with the same listener and captioner, from the captions
# captune chose by the Gumbel-max trick and the Gumbel noise it drew
# (golden_relevance_inputs, written by `cargo test --test suite golden:: -- --ignored`).
RELEVANCE_CASES = [  # (name, settings)
    ("relevance_hard", {"gumbel": "hard", "tau": 1.0}),
    ("relevance_soft", {"gumbel": "soft", "tau": 0.5}),
]


def relevance(out_dir):
    setup = listener_setup(out_dir, "golden_relevance_inputs.safetensors")
    if setup is None:
        return
    inputs, cap, ret = setup
    features = inputs["features"].to(DT)
    noise = inputs["noise"].to(DT)  # [captions, T, VOCAB]
    captions = inputs["captions"].long().tolist()
    # The retriever's embedding of each captioner id's word (specials as specials).
    r_id = [retriever_id(i) for i in range(VOCAB)]
    table = ret["text.tokens"][torch.tensor(r_id)]  # [VOCAB, width]
    ids_list, tf_inputs, _ = teacher_forced(captions)
    expected = {}
    cases = []
    for name, settings in RELEVANCE_CASES:
        tau = settings["tau"]
        leaves = {k: t.clone().requires_grad_(True) for k, t in cap.items()}
        logits = logits_of(leaves, features, tf_inputs)
        # The Gumbel-softmax with the noise the choice was made with.
        y = torch.softmax((logits + noise) / tau, dim=-1)  # [n, T, VOCAB]
        rows, lengths = [], []
        for c, ids in enumerate(ids_list):
            # <bos>, (<unk> for an empty caption), the tokens while they fit,
            # <eos> (in place of the last token when cut, with no gradient).
            x, last = [ret["text.tokens"][BOS]], BOS
            if ids[0] == EOS:
                x, last = x + [ret["text.tokens"][UNK]], UNK
            for t, token in enumerate(ids):
                if len(x) == R_MAX_LEN:
                    break
                if settings["gumbel"] == "soft":
                    x.append(y[c, t] @ table)
                else:  # straight-through: the token forward, y's gradient back
                    x.append(table[token] + (y[c, t] - y[c, t].detach()) @ table)
                last = r_id[token]
            if last != EOS:
                if len(x) == R_MAX_LEN:
                    x[-1] = ret["text.tokens"][EOS]
                else:
                    x.append(ret["text.tokens"][EOS])
            lengths.append(len(x))
            x += [ret["text.tokens"][PAD]] * (R_MAX_LEN - len(x))
            rows.append(torch.stack(x))
        text = text_tower(ret, torch.stack(rows), torch.tensor(lengths))
        cos = torch.nn.functional.cosine_similarity(text, features, dim=-1)
        loss = -cos.mean()
        loss.backward()
        expected[f"{name}.loss"] = f32(loss.reshape(1))
        expected.update({f"{name}.grad.{k}": f32(t.grad) for k, t in leaves.items()})
        cases.append({"name": name, "objective": "clip-relevance", "settings": settings})
        print(f"{name}: loss {float(loss.detach()):.6f}")
    save_file(expected, f"{out_dir}/golden_relevance_expected.safetensors", metadata={
        "cases": json.dumps(cases),
        "made_by": "scripts/golden.py (PyTorch " + torch.__version__ + ", float64)"})


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    captioner(out)
    retriever(out)
    smile(out)
    sequence(out)
    listener_captioner(out)
    discritune(out)
    relevance(out)
