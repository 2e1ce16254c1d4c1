"""captune's optimiser: AdamW with decoupled weight decay on dense
layers' weight matrices only, global-norm clipping as clip_grad_norm_
does it, and a linear warm-up then cosine decay of the rate."""

import math

import torch

from .model import decays

BETAS, EPS = (0.9, 0.999), 1e-8
MAX_GRAD_NORM = 1.0


def warmup_cosine(peak, warmup, step, total):
    """The rate at `step` (from 0): linear warm-up over `warmup` steps to
    `peak`, then cosine decay to 0 at step `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def adamw(model, lr, weight_decay):
    """AdamW over the model's trained parameters: the decaying group
    first, as captune groups them."""
    named = [(n, model.tensor(n)) for n in model.names if model.tensor(n).requires_grad]
    return torch.optim.AdamW(
        [{"params": [p for n, p in named if decays(n, p.shape)], "weight_decay": weight_decay},
         {"params": [p for n, p in named if not decays(n, p.shape)], "weight_decay": 0.0}],
        lr=lr, betas=BETAS, eps=EPS)


def clip(model, max_norm=MAX_GRAD_NORM):
    """Scales every gradient by min(1, max_norm / (norm + 1e-6)); returns
    the norm before clipping, as a tensor on the gradients' device (read
    it only where it is needed: reading waits for the device)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    return torch.nn.utils.clip_grad_norm_(trained, max_norm)
