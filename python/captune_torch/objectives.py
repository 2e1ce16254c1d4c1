"""The objectives this package trains with, as captune states them
(docs/training.md): MLE and SMILE (Yue et al., 2023) on the references,
and SCST (Rennie et al., 2017) on the model's samples.

Each one's `step` works on one process's share of a batch and returns
sums by name, `loss` (what trains) among them; `per_batch` is what the
whole batch's sums are divided by (its tokens, or its samples), and
`report` turns the batch's totals into a log line's values. A batch split
among processes thus trains as it would whole."""

import decimal
import math
import struct

import torch

from .cider import CiderD
from .config import ConfigError
from .data import tensors_of
from .sampling import generate

SUPPORTED = ("mle", "smile", "scst")


def find(name, settings, vocab, corpus):
    """The objective `name` with its [train] settings."""
    if name == "scst":
        return Scst(settings, vocab, CiderD(corpus.references))
    return TokenObjective(name, settings, vocab.alternatives)


def module_of(model):
    """The captioner, whether or not DistributedDataParallel wraps it."""
    return getattr(model, "module", model)


def rust_f32(x):
    """`x` as an f32 prints in Rust (the shortest digits that read back as
    the same f32, never in exponent form): how captune names settings."""
    def as_f32(v):
        return struct.unpack("f", struct.pack("f", v))[0]
    target = as_f32(x)
    digits = next(f"{target:.{n}g}" for n in range(1, 18) if as_f32(float(f"{target:.{n}g}")) == target)
    text = format(decimal.Decimal(digits), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def picked_nll(logits, targets, real):
    """-log softmax(logits) at each target, 0 where the target is not real."""
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -picked.masked_fill(~real, 0.0)


def subset_nll(logits, targets, real, full_first_step):
    """SMILE's term: at each step a softmax over the unique ids of the
    caption's targets; step 0 over the whole vocabulary when
    `full_first_step`. (The padding after a caption's end joins the
    subset, where the policy gives it no probability: it adds nothing.)"""
    own = torch.zeros(logits.shape[0], logits.shape[-1], dtype=torch.bool, device=logits.device)
    own.scatter_(1, targets, True)
    allowed = own[:, None, :].expand_as(logits)
    if full_first_step:
        allowed = allowed.clone()
        allowed[:, 0, :] = True
    return picked_nll(logits.masked_fill(~allowed, float("-inf")), targets, real)


class TokenObjective:
    """MLE or SMILE with its settings ([train] first_token and mle_weight),
    over the vocabulary's first-token alternatives (`##word`)."""

    reports = ("loss", "mle", "smile")

    def __init__(self, name, settings, alternatives):
        if name not in ("mle", "smile"):
            raise ConfigError(
                f"objective {name!r} is not supported by captune_torch; it trains "
                f"{', '.join(SUPPORTED)} (train the others with captune itself)")
        self.name = name
        self.first_token = settings.get("first_token", "mle")
        self.mle_weight = float(settings.get("mle_weight", 0.0))
        if self.first_token not in ("mle", "none", "shift"):
            raise ConfigError(f"[train] first_token = {self.first_token!r}: expected mle, none or shift")
        if not 0.0 <= self.mle_weight <= 1.0:
            raise ConfigError(f"[train] mle_weight = {self.mle_weight}: a weight between 0 and 1")
        if name == "smile" and self.first_token == "shift" and not alternatives:
            raise ConfigError("first_token = shift trains step 0 towards a word's reserved alternative "
                              "id, and this vocabulary has none; use first_token = mle or none")
        self.alternatives = alternatives

    def describe(self):
        """The objective with its settings, as captune's log lines name it."""
        if self.name == "mle":
            return "mle"
        return f"smile (first token: {self.first_token}, mle weight: {rust_f32(self.mle_weight)})"

    def per_batch(self, corpus, pairs):
        """The batch's real target tokens."""
        return corpus.tokens(pairs)

    def gradient_weight(self, corpus, pairs, batch, mean_tokens):
        """Captions' tokens weigh what they would in an average batch (a
        loss is a per-token mean; captune's rule)."""
        return corpus.tokens(pairs) / (batch * mean_tokens)

    def step(self, model, corpus, mine, context):
        features, inputs, targets = tensors_of(corpus, mine, context.device, module_of(model).pad)
        return self(model, features, inputs, targets, context.monitor)

    def report(self, totals, per_batch):
        return {n: totals[n] / per_batch for n in self.reports}

    def __call__(self, model, features, inputs, targets, monitor=True):
        """Summed per-token losses: `loss` (what trains) and, when
        `monitor`, the plain `mle` and standard `smile` every log line
        reports, computed without a gradient where they do not train."""
        logits = model(features, inputs)
        real = targets != module_of(model).pad
        mle = lambda: picked_nll(logits, targets, real)
        smile = lambda: subset_nll(logits, targets, real, full_first_step=True)
        if self.name == "mle":
            train = mle()
        else:
            if self.first_token == "mle":
                term = smile()
            else:
                own = targets
                if self.first_token == "shift":
                    own = targets.clone()
                    own[:, 0] = torch.tensor([self.alternatives.get(int(t), int(t)) for t in targets[:, 0]],
                                             device=targets.device)
                term = subset_nll(logits, own, real, full_first_step=False)
            train = (1 - self.mle_weight) * term
            if self.mle_weight > 0:
                train = train + self.mle_weight * mle()
        sums = {"loss": train.sum()}
        if monitor:
            with torch.no_grad():
                sums["mle"] = mle().sum()
                sums["smile"] = smile().sum()
        return sums


class Scst:
    """Self-critical sequence training (Rennie et al., 2017): per image,
    `samples` captions sampled at temperature 1, rewarded by CIDEr-D with
    the training statistics; advantage A_j = r_j - the greedy caption's
    reward (`baseline = greedy`) or the mean of the image's other samples'
    (`mean`, Luo, 2020); loss -(1/(B n)) sum_j A_j sum_t log p(y_jt), over
    each sample's tokens up to and with its `<eos>`."""

    reports = ("loss", "reward", "baseline", "advantage", "advantage_sq", "sample_length")

    def __init__(self, settings, vocab, cider):
        self.samples = int(settings.get("samples", 5))
        self.baseline = settings.get("baseline", "greedy")
        if self.baseline not in ("greedy", "mean"):
            raise ConfigError(f"[train] baseline = {self.baseline!r}: expected greedy or mean")
        if self.samples < 1 or (self.baseline == "mean" and self.samples < 2):
            raise ConfigError(f"[train] samples = {self.samples}: at least 1, and 2 with baseline = mean")
        unsupported = {"reward": settings.get("reward", "cider-d") != "cider-d",
                       "bleu4_weight": float(settings.get("bleu4_weight", 0.0)) != 0.0,
                       "mle_weight": float(settings.get("mle_weight", 0.0)) != 0.0}
        for key, bad in unsupported.items():
            if bad:
                way = "give --mle-weight 0 or set" if key == "mle_weight" else "set"
                raise ConfigError(f"[train] {key} = {settings.get(key)!r}: captune_torch trains SCST with "
                                  "the CIDEr-D reward alone (reward = \"cider-d\", bleu4_weight = 0, "
                                  f"mle_weight = 0); {way} it so in the run's config.toml, or train with captune")
        self.vocab, self.cider = vocab, cider

    def describe(self):
        return (f"scst (samples: {self.samples}, baseline: {self.baseline}, reward: cider-d, "
                "bleu4 weight: 0, mle weight: 0)")

    def per_batch(self, corpus, pairs):
        """The batch's samples."""
        return len(pairs) * self.samples

    def gradient_weight(self, corpus, pairs, batch, mean_tokens):
        # Samples have no reference lengths to even out.
        return 1.0

    def step(self, model, corpus, mine, context):
        """Samples and greedy captions of this process's images, their
        rewards and advantages, and the surrogate's sum."""
        module = module_of(model)
        images = [i for i, _ in mine]
        features = corpus.features[images].to(context.device)
        rows = features.repeat_interleave(self.samples, 0)
        steps = module.config["max_len"] - 1
        samples = generate(module, rows, steps, sample=True, seed=context.seed,
                           first_row=context.first_image * self.samples)
        greedy = generate(module, features, steps) if self.baseline == "greedy" else None
        scored = self.advantages(images, samples, greedy)
        advantages = torch.tensor([a for _, _, a in scored], device=context.device)
        lengths = [len(self.vocab.words_of(c.tolist())) for c in samples]
        return {
            "loss": self.surrogate(model, rows, samples, advantages),
            "reward": torch.tensor(sum(r for r, _, _ in scored), dtype=torch.float64),
            "baseline": torch.tensor(sum(b for _, b, _ in scored), dtype=torch.float64),
            "advantage": torch.tensor(sum(a for _, _, a in scored), dtype=torch.float64),
            "advantage_sq": torch.tensor(sum(a * a for _, _, a in scored), dtype=torch.float64),
            "sample_length": torch.tensor(float(sum(lengths)), dtype=torch.float64),
        }

    def report(self, totals, per_batch):
        """Per sample: the loss, reward, baseline, the advantages' spread
        (standard deviation) and the length in words."""
        mean = {n: totals[n] / per_batch for n in self.reports}
        spread = math.sqrt(max(mean["advantage_sq"] - mean["advantage"] ** 2, 0.0))
        return {"loss": mean["loss"], "reward": mean["reward"], "baseline": mean["baseline"],
                "advantage_spread": spread, "sample_length": mean["sample_length"]}

    def rewards(self, images, captions):
        """CIDEr-D of each caption (ids) against its image's references."""
        return [self.cider.score(i, self.vocab.words_of(c.tolist())) for i, c in zip(images, captions)]

    def advantages(self, images, samples, greedy):
        """Per sample: (reward, baseline, advantage)."""
        n = self.samples
        rewards = self.rewards([i for i in images for _ in range(n)], samples)
        if self.baseline == "greedy":
            base = [b for b in self.rewards(images, greedy) for _ in range(n)]
        else:
            base = [(sum(rewards[j - j % n:j - j % n + n]) - rewards[j]) / (n - 1) for j in range(len(rewards))]
        return [(r, b, r - b) for r, b in zip(rewards, base)]

    def surrogate(self, model, features, samples, advantages):
        """-sum_j A_j sum_t log p(y_jt), teacher-forcing the samples."""
        module = module_of(model)
        inputs, targets = teacher_forced(samples, module.start)
        nll = picked_nll(model(features, inputs), targets, targets != module.pad)
        return (advantages.to(nll.dtype) * nll.sum(-1)).sum()


def teacher_forced(samples, start):
    """Generated ids `[n, steps]`, padded after `<eos>`, as inputs
    `<bos> y1 ..` and targets `y1 .. <eos>` (the padding after `<eos>`
    is no target)."""
    inputs = torch.cat([torch.full_like(samples[:, :1], start), samples[:, :-1]], 1)
    return inputs, samples
