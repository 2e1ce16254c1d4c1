"""The objectives this package trains with, as captune states them
(docs/training.md): MLE and SMILE (Yue et al., 2023) on the references.

Each works on a share of a batch and returns summed per-token losses by
name: `loss` (what trains) and the `mle` and standard `smile` that every
token-level log line reports. The batch's losses are the sums' totals
over the batch's real target tokens, so a batch split among processes
trains as it would whole."""

import torch

SUPPORTED = ("mle", "smile")


def pad_of(model):
    # DistributedDataParallel wraps the captioner.
    return getattr(model, "module", model).pad


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

    def __init__(self, name, settings, alternatives):
        if name not in SUPPORTED:
            raise ValueError(
                f"objective {name!r} is not supported by captune_torch; it trains "
                f"{', '.join(SUPPORTED)} (train the others with captune itself)")
        self.name = name
        self.first_token = settings.get("first_token", "mle")
        self.mle_weight = float(settings.get("mle_weight", 0.0))
        if self.first_token not in ("mle", "none", "shift"):
            raise ValueError(f"[train] first_token = {self.first_token!r}: expected mle, none or shift")
        if name == "smile" and self.first_token == "shift" and not alternatives:
            raise ValueError("first_token = shift trains step 0 towards a word's reserved alternative "
                             "id, and this vocabulary has none; use first_token = mle or none")
        self.alternatives = alternatives

    def describe(self):
        """The objective with its settings, as captune's log lines name it."""
        if self.name == "mle":
            return "mle"
        weight = self.mle_weight
        number = str(int(weight)) if weight == int(weight) else repr(weight)
        return f"smile (first token: {self.first_token}, mle weight: {number})"

    def __call__(self, model, features, inputs, targets):
        pad = pad_of(model)
        logits = model(features, inputs)
        real = targets != pad
        mle = picked_nll(logits, targets, real)
        smile = subset_nll(logits, targets, real, full_first_step=True)
        if self.name == "mle":
            train = mle
        else:
            if self.first_token == "mle":
                term = smile
            else:
                own = targets
                if self.first_token == "shift":
                    own = targets.clone()
                    own[:, 0] = torch.tensor([self.alternatives.get(int(t), int(t)) for t in targets[:, 0]],
                                             device=targets.device)
                term = subset_nll(logits, own, real, full_first_step=False)
            train = self.mle_weight * mle + (1 - self.mle_weight) * term
        return {"loss": train.sum(), "mle": mle.detach().sum(), "smile": smile.detach().sum()}
