"""The objectives this package trains with, as captune states them
(docs/training.md)."""

import torch

SUPPORTED = ("mle",)


def token_nll(logits, targets, pad):
    """-log p of each target [batch, positions] under the policy, and
    which targets are real (not padding)."""
    logp = torch.log_softmax(logits, dim=-1)
    real = targets != pad
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -picked.masked_fill(~real, 0.0), real


def mle(model, features, inputs, targets):
    """MLE over a share of a batch: the sum over its real target tokens of
    -log p, and their count. The batch's loss is the sums' total over the
    batch's tokens."""
    nll, real = token_nll(model(features, inputs), targets, pad_of(model))
    return nll.sum(), int(real.sum())


def pad_of(model):
    # DistributedDataParallel wraps the captioner.
    return getattr(model, "module", model).pad


def find(name):
    """The objective called `name`, or a ValueError naming those supported."""
    if name not in SUPPORTED:
        raise ValueError(
            f"objective {name!r} is not supported by captune_torch; it trains "
            f"{', '.join(SUPPORTED)} (train the others with captune itself)")
    return {"mle": mle}[name]
