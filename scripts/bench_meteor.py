#!/usr/bin/env python3
"""Times METEOR on a results file: `captune score` (every metric, METEOR
included, without Java) against pycocoevalcap's METEOR alone (its PTB
tokenizer and meteor-1.5.jar, as COCOEvalCap runs them), each as a whole
process with its start-up, alternately, several pairs. Checks that both
give the same METEOR and prints each pair's time ratio (pycocoevalcap's
over captune's: how many times faster captune is), then the median and
range.

    python3 scripts/bench_meteor.py --data "$CAPTUNE_FLICKR8K"/dataset_flickr8k.json \\
        --results RESULTS.json --pairs 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pycocoevalcap_meteor(data, results, split):
    """METEOR as COCOEvalCap computes it: both sides through the PTB
    tokenizer, then the jar."""
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    images = {str(i["imgid"]): i for i in json.load(open(data))["images"] if i["split"] == split}
    res = {}
    for r in json.load(open(results)):
        res.setdefault(str(r["image_id"]), [{"caption": r["caption"]}])
    gts = {k: [{"caption": s["raw"]} for s in images[k]["sentences"]] for k in res}
    tokenizer = PTBTokenizer()
    gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
    score, _ = Meteor().compute_score(gts, res)
    print(json.dumps({"METEOR": score}))


def timed(command):
    """Seconds `command` took, and the METEOR of the JSON it printed last."""
    env = {k: v for k, v in os.environ.items() if k != "CAPTUNE_METEOR"}
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{out.stderr[-2000:]}")
    return seconds, json.loads(out.stdout[out.stdout.find("{"):])["METEOR"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a Karpathy-format data set (dataset_*.json)")
    p.add_argument("--results", required=True, help="COCO-format results: [{image_id, caption}]")
    p.add_argument("--split", default="test")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--captune", default=os.path.join(ROOT, "target", "release", "captune"))
    p.add_argument("--pycocoevalcap-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.pycocoevalcap_only:
        return pycocoevalcap_meteor(a.data, a.results, a.split)
    ours = [a.captune, "--device", "cpu", "score", "--data", f"karpathy:{a.data}", "--split", a.split,
            "--results", a.results, "--json"]
    theirs = [sys.executable, os.path.abspath(__file__), "--pycocoevalcap-only", "--data", a.data,
              "--results", a.results, "--split", a.split]
    ratios = []
    for k in range(a.pairs):
        # Alternate which goes first, so neither always meets a warm cache.
        runs = {}
        for name, command in (("captune", ours), ("pycocoevalcap", theirs))[:: 1 if k % 2 == 0 else -1]:
            runs[name] = timed(command)
        (t_ours, m_ours), (t_theirs, m_theirs) = runs["captune"], runs["pycocoevalcap"]
        if abs(m_ours - m_theirs) > 1e-9:
            sys.exit(f"METEOR differs: captune {m_ours}, pycocoevalcap {m_theirs}")
        ratios.append(t_theirs / t_ours)
        print(f"pair {k + 1}: captune {t_ours:.2f} s, pycocoevalcap {t_theirs:.2f} s, "
              f"{ratios[-1]:.1f}x (METEOR {m_ours:.6f})")
    print(f"captune score is {statistics.median(ratios):.1f}x faster than pycocoevalcap's METEOR "
          f"(median of {a.pairs} pairs; range {min(ratios):.1f}-{max(ratios):.1f})")


if __name__ == "__main__":
    main()
