#!/usr/bin/env python3
"""GPU baseline for `captune --device gpu bench kernels`: PyTorch's float32
matmul on CUDA with TF32 off (so the arithmetic is FP32, as captune's WGSL
kernels are), timed with CUDA events the way captune times (one warm-up,
median of five timings of enough repetitions to fill ~0.1 s); `--device
cpu` times it on the CPU instead (scripts/gpu_bench.sh's rehearsal). It
prints a JSON array of records; with --compare FILE (captune's --json
output, taken on the same machine) each record also holds captune's GPU
figure for that size and the ratio of the two.

    captune --device gpu bench kernels --json > captune.json
    python3 scripts/bench_torch_matmul.py --compare captune.json
"""
import argparse
import json
import statistics
import time

import torch


def seconds_per_op(f, device):
    if device == "cpu":
        def timed(reps):
            start = time.perf_counter()
            for _ in range(reps):
                f()
            return (time.perf_counter() - start) / reps
        return median_of_five(timed)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(reps):
        start.record()
        for _ in range(reps):
            f()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    return median_of_five(timed)


def median_of_five(timed):
    once = max(timed(1), 1e-7)
    reps = int(min(max(0.1 / once, 1), 1000))
    return statistics.median(timed(reps) for _ in range(5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--compare", help="captune bench kernels --json output")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    adapter = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    ours = {}
    if args.compare:
        ours = {r["m"]: r["gflops"] for r in json.load(open(args.compare))
                if r["op"] == "matmul" and r["backend"] == "gpu"}
    records = []
    for n in map(int, args.sizes.split(",")):
        a = torch.rand(n, n, device=args.device) * 2 - 1
        b = torch.rand(n, n, device=args.device) * 2 - 1
        c = torch.empty(n, n, device=args.device)
        s = seconds_per_op(lambda: torch.matmul(a, b, out=c), args.device)
        record = {"op": "matmul", "backend": f"pytorch-{args.device}", "adapter": adapter,
                  "m": n, "n": n, "k": n, "gflops": 2 * n**3 / s / 1e9, "seconds": s}
        if n in ours:
            record["captune_gflops"] = ours[n]
            record["ratio"] = ours[n] / record["gflops"]
        records.append(record)
    print(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
