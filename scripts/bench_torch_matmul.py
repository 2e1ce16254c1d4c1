#!/usr/bin/env python3
"""GPU baseline for `captune --device gpu bench kernels`: PyTorch's float32
matmul on CUDA with TF32 off (so the arithmetic is FP32, as captune's WGSL
kernels are), timed with CUDA events the way captune times (one warm-up,
median of five timings of enough repetitions to fill ~0.1 s). With
--compare FILE (captune's --json output, taken on the same machine) it
prints captune's GPU figure as a ratio of PyTorch's.

    captune --device gpu bench kernels --json > captune.json
    python3 scripts/bench_torch_matmul.py --compare captune.json
"""
import argparse
import json
import statistics

import torch


def seconds_per_op(f):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(reps):
        start.record()
        for _ in range(reps):
            f()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    once = max(timed(1), 1e-7)
    reps = int(min(max(0.1 / once, 1), 1000))
    return statistics.median(timed(reps) for _ in range(5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--compare", help="captune bench kernels --json output")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    records = []
    for n in map(int, args.sizes.split(",")):
        a = torch.rand(n, n, device="cuda") * 2 - 1
        b = torch.rand(n, n, device="cuda") * 2 - 1
        c = torch.empty(n, n, device="cuda")
        s = seconds_per_op(lambda: torch.matmul(a, b, out=c))
        records.append({"op": "matmul", "backend": "pytorch-cuda",
                        "adapter": torch.cuda.get_device_name(), "m": n, "n": n, "k": n,
                        "gflops": 2 * n**3 / s / 1e9, "seconds": s})
    if not args.compare:
        print(json.dumps(records, indent=2))
        return
    ours = {r["m"]: r for r in json.load(open(args.compare))
            if r["op"] == "matmul" and r["backend"] == "gpu"}
    print(f"{'size':>6} {'captune gpu':>12} {'pytorch':>10} {'ratio':>6}   (GFLOP/s, FP32)")
    for r in records:
        if r["m"] in ours:
            g = ours[r["m"]]["gflops"]
            print(f"{r['m']:>6} {g:12.1f} {r['gflops']:10.1f} {g / r['gflops']:6.2f}")


if __name__ == "__main__":
    main()
