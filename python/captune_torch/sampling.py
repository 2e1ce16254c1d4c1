"""Captions from the policy, for SCST: sampled at temperature 1, or
greedy. A sampled token comes from a uniform number hashed from (seed,
row, step), where row is the sample's place in the whole batch, so a
batch split among processes draws what it draws whole. The decoder runs
over the whole prefix at each step (no cache): simple, and the samples'
logits are those of teacher forcing."""

import torch

MASK32 = 0xFFFFFFFF


def mix32(x):
    """lowbias32 (Chris Wellons' integer hash) on int64 tensors of u32s."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def uniform(seed, rows, step):
    """A number in [0, 1) per row (an int64 tensor of row numbers)."""
    h = mix32(torch.full_like(rows, (seed ^ 0x9E3779B9) & MASK32))
    h = mix32(h ^ ((seed >> 32) & MASK32))
    h = mix32(h ^ rows)
    h = mix32(h ^ step)
    return (h >> 8).double() / 16777216.0


@torch.no_grad()
def generate(model, features, steps, sample=False, seed=0, first_row=0):
    """Token ids after the start, `[rows, steps]`, padded after `<eos>`:
    the argmax (lowest id on ties) or a sample per step."""
    rows = features.shape[0]
    device = features.device
    ids = torch.full((rows, 1), model.start, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    row_numbers = torch.arange(first_row, first_row + rows, device=device, dtype=torch.long)
    for t in range(steps):
        logits = model(features, ids)[:, -1].double()
        if sample:
            p = torch.softmax(logits, -1)
            cdf = p.cumsum(-1)
            u = uniform(seed, row_numbers, t).to(device) * cdf[:, -1]
            chosen = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1)
            chosen = chosen.clamp(max=logits.shape[-1] - 1)
            # Never an id the policy gives no probability to.
            chosen = torch.where(p.gather(1, chosen[:, None]).squeeze(1) > 0, chosen, logits.argmax(-1))
        else:
            chosen = logits.argmax(-1)
        chosen = torch.where(done, torch.full_like(chosen, model.pad), chosen)
        ids = torch.cat([ids, chosen[:, None]], 1)
        done |= chosen == model.end
        if done.all():
            break
    out = torch.full((rows, steps), model.pad, dtype=torch.long, device=device)
    out[:, : ids.shape[1] - 1] = ids[:, 1:]
    return out
