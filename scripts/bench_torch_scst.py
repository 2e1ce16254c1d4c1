#!/usr/bin/env python3
"""PyTorch reference for `captune bench scst`: one SCST step as
self-critical.pytorch users run it, on the captioner of
scripts/bench_torch_captioner.py (fresh weights, 128-d random image
embeddings, 79 ids): 5 samples per image at temperature 1 and the greedy
caption (under torch.no_grad, with the KV cache of
scripts/bench_torch_decode.py), CIDEr-D rewards in Python as
pycocoevalcap / self-critical.pytorch compute them (document frequencies
from the training references counted once; each step cooks every sample
and its image's references), advantages r - r(greedy), then the
teacher-forced forward on the samples, -(A * sum_t log p).mean(),
backward, gradient clipping and AdamW. The corpus: 1000 images with 5
random references of 8 to 14 words over the same vocabulary.

--no-cache samples as self-critical.pytorch's TransformerModel does: each
step runs the decoder over the whole prefix so far (`core` concatenates
the new token to the state and decodes all of it) and keeps the last
position's logits.

    python3 scripts/bench_torch_scst.py --preset shapes [--no-cache] [--device cpu|cuda] [--steps 10] [--json]
    python3 scripts/bench_torch_scst.py --config scripts/bench/gpt2-small.toml --vocab 50257
"""
import argparse
import json
import math
import random
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from bench_torch_captioner import EMBED_DIM, Captioner, add_model_arguments, describe_memory, memory, read_model
from bench_torch_decode import BOS, EOS, decode_cached, greedy, sample

CORPUS, SAMPLES, SIGMA = 1000, 5, 6.0


def ngrams(words, n=4):
    counts = defaultdict(int)
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            counts[tuple(words[i:i + k])] += 1
    return counts


class CiderD:
    """CIDEr-D with fixed document frequencies (the training references)."""

    def __init__(self, references):
        self.df = defaultdict(float)
        for refs in references:
            for gram in {g for r in refs for g in ngrams(r)}:
                self.df[gram] += 1
        self.log_docs = math.log(len(references))

    def vec(self, counts):
        vec, norm, length = [{} for _ in range(4)], [0.0] * 4, 0
        for gram, tf in counts.items():
            n = len(gram) - 1
            w = tf * (self.log_docs - math.log(max(1.0, self.df[gram])))
            vec[n][gram] = w
            norm[n] += w * w
            if n == 1:
                length += tf
        return vec, [math.sqrt(x) for x in norm], length

    def score(self, candidate, refs):
        vec, norm, length = self.vec(ngrams(candidate))
        total = [0.0] * 4
        for r in refs:
            rvec, rnorm, rlength = self.vec(ngrams(r))
            delta = length - rlength
            for n in range(4):
                val = sum(min(w, rvec[n].get(g, 0.0)) * rvec[n].get(g, 0.0) for g, w in vec[n].items())
                if norm[n] != 0 and rnorm[n] != 0:
                    val /= norm[n] * rnorm[n]
                total[n] += val * math.exp(-(delta ** 2) / (2 * SIGMA ** 2))
        return sum(total) / 4 / len(refs) * 10.0


def decode_growing(model, features, steps, choose):
    """Sampling without a cache: at step t the decoder runs over the
    prefix, <bos> and the t tokens chosen so far."""
    b = features.shape[0]
    prefix = model.mapper(features).view(b, model.k, model.d)
    seqs = torch.full((b, 1), BOS, dtype=torch.long, device=features.device)
    done = torch.zeros(b, dtype=torch.bool, device=features.device)
    for t in range(steps):
        x = torch.cat([prefix, model.tokens(seqs)], dim=1) + model.positions[: model.k + seqs.shape[1]]
        for block in model.blocks:
            x = block(x)
        nxt = choose(model.ln_f(x[:, -1]) @ model.tokens.weight.T)
        seqs = torch.cat([seqs, nxt[:, None]], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return seqs[:, 1:]


def words_of(ids):
    out = []
    for i in ids:
        if i == EOS:
            break
        out.append(f"w{i}")
    return out


def main():
    p = argparse.ArgumentParser()
    add_model_arguments(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-cache", action="store_true", help="sample as self-critical.pytorch: no KV cache")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    decode = decode_growing if a.no_cache else decode_cached
    name, m, batch = read_model(a)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    rng = random.Random(0)
    corpus = [[[f"w{rng.randrange(4, a.vocab)}" for _ in range(rng.randint(8, 14))] for _ in range(5)]
              for _ in range(CORPUS)]
    cider = CiderD(corpus)
    dev = torch.device(a.device)
    model = Captioner(m, a.vocab).to(dev)
    with torch.no_grad():
        torch.nn.init.normal_(model.positions, std=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    features = torch.rand(batch, EMBED_DIM, device=dev) * 0.2 - 0.1
    steps = m["max_len"] - 1
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(first):
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            samples = decode(model, features.repeat_interleave(SAMPLES, dim=0), steps, sample)
            best = decode(model, features, steps, greedy)
        samples_host, best_host = samples.tolist(), best.tolist()
        t1 = time.perf_counter()
        images = [(first + i) % CORPUS for i in range(batch)]
        rewards = [cider.score(words_of(s), corpus[images[j // SAMPLES]]) for j, s in enumerate(samples_host)]
        baselines = [cider.score(words_of(s), corpus[images[i]]) for i, s in enumerate(best_host)]
        adv = torch.tensor([r - baselines[j // SAMPLES] for j, r in enumerate(rewards)], device=dev)
        t2 = time.perf_counter()
        model.train()
        inputs = F.pad(samples[:, :-1], (1, 0), value=1)  # <bos>, then the samples' ids
        inputs = F.pad(inputs, (0, steps - inputs.shape[1]))
        targets = F.pad(samples, (0, steps - samples.shape[1]))
        ended = (targets == EOS).int().cumsum(dim=1)
        mask = ((ended == 0) | ((ended == 1) & (targets == EOS))).float()
        logp = F.log_softmax(model(features.repeat_interleave(SAMPLES, dim=0), inputs), dim=-1)
        token_logp = logp.gather(2, targets[:, :, None])[:, :, 0] * mask
        loss = -(adv * token_logp.sum(dim=1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    for s in range(a.warmup):
        step(s * batch)
    parts = [0.0, 0.0, 0.0]
    for s in range(a.warmup, a.warmup + a.steps):
        for k, x in enumerate(step(s * batch)):
            parts[k] += x
    total = sum(parts)
    seconds = total / a.steps
    record = {
        "op": "scst", "backend": "pytorch-" + dev.type, "preset": name, "batch": batch,
        "sampling": "no cache" if a.no_cache else "kv cache",
        "samples_per_image": SAMPLES, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "steps": a.steps, "seconds_per_step": seconds, "steps_per_s": 1 / seconds,
        "sampling_share": parts[0] / total, "rewards_share": parts[1] / total, "update_share": parts[2] / total,
        **memory(dev),
    }
    print(json.dumps(record) if a.json else
          f"pytorch {dev.type} scst ({record['sampling']}) {name} batch {batch} x {SAMPLES} samples: {1 / seconds:.2f} steps/s "
          f"({seconds * 1e3:.0f} ms/step: sampling {parts[0] / total:.0%}, rewards {parts[1] / total:.0%}, "
          f"update {parts[2] / total:.0%}), peak memory {record['peak_memory_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
