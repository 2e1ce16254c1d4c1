#!/usr/bin/env python3
"""Runs a captune benchmark and its PyTorch twin alternately, several
pairs, and reports each pair's ratio and their median and range: the way
docs/results.md quotes a speed (the machines are shared and noisy, so a
lone time says little).

Each command must print a JSON record (or a list whose first element is
one) on stdout, as `captune bench ... --json` and the
scripts/bench_torch_*.py scripts with --json do. The ratio is captune's
value of --key over PyTorch's (higher is better for a rate such as
tokens_per_s); peak memory is compared the same way.

    python3 scripts/bench_pairs.py --pairs 3 --key tokens_per_s \\
        --captune "target/release/captune --device cpu bench train --config scripts/bench/lstm-sle.toml --objectives mle --captions synthetic --steps 10 --warmup 2 --json" \\
        --pytorch "python3 scripts/bench_torch_lstm.py train --config scripts/bench/lstm-sle.toml --steps 10 --warmup 2 --json"

Prints one line per pair, then a Markdown table row (--label names it);
--json prints the pairs and the summary as JSON instead.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys


def record(command):
    """The JSON record `command` prints last."""
    out = subprocess.run(shlex.split(command), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{command}\nfailed ({out.returncode}):\n{out.stderr[-2000:]}")
    text = out.stdout.strip()
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        sys.exit(f"{command}\nprinted no JSON:\n{text[-2000:]}")
    value = json.loads(text[start:])
    return value[0] if isinstance(value, list) else value


def rate(value):
    """A rate as results.md writes it: whole numbers with separators, or
    three significant figures below 100 (steps/s, images/s)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captune", required=True, help="captune's command, printing JSON")
    p.add_argument("--pytorch", required=True, help="PyTorch's command, printing JSON")
    p.add_argument("--key", default="tokens_per_s", help="the record's rate to compare")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--label", default="workload")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.pairs < 1:
        sys.exit("--pairs must be at least 1")
    pairs = []
    for k in range(a.pairs):
        # Alternate which side goes first, so neither always runs on a
        # machine the other has just warmed or loaded.
        order = ["captune", "pytorch"] if k % 2 == 0 else ["pytorch", "captune"]
        got = {side: record(getattr(a, side)) for side in order}
        c, t = got["captune"], got["pytorch"]
        for side, r in got.items():
            if a.key not in r:
                sys.exit(f"{side}'s record has no {a.key!r}: {r}")
        pair = {"captune": c[a.key], "pytorch": t[a.key], "ratio": c[a.key] / t[a.key],
                "captune_memory_mib": c.get("peak_memory_mib"),
                "pytorch_memory_mib": t.get("peak_memory_mib")}
        pairs.append(pair)
        if not a.json:
            print(f"pair {k + 1}: captune {pair['captune']:.1f}, pytorch {pair['pytorch']:.1f}, "
                  f"ratio {pair['ratio']:.2f}", flush=True)
    ratio = summary([q["ratio"] for q in pairs])
    memory = [q["captune_memory_mib"] / q["pytorch_memory_mib"] for q in pairs
              if q["captune_memory_mib"] and q["pytorch_memory_mib"]]
    result = {"label": a.label, "key": a.key, "pairs": pairs, "ratio": ratio,
              "memory_ratio": summary(memory) if memory else None}
    if a.json:
        print(json.dumps(result, indent=1))
        return
    med = lambda side: statistics.median(q[side] for q in pairs)
    mem = (f"{result['memory_ratio']['median']:.2f}" if memory else "-")
    print(f"\n| {a.label} | {a.pairs} | {rate(med('captune'))} | {rate(med('pytorch'))} | "
          f"**{ratio['median']:.2f}** ({ratio['min']:.2f}-{ratio['max']:.2f}) | {mem} |")


if __name__ == "__main__":
    main()
