#!/usr/bin/env python3
"""Baseline for `captune bench kernels`: numpy (OpenBLAS) float32 matmul
GFLOP/s timed the same way (one warm-up, median of five timings of enough
repetitions to fill ~0.1 s). With --compare FILE (captune's --json output,
taken in the same run) it prints captune's CPU figure as a ratio of numpy's.

    cargo run --release -- --device cpu bench kernels --json > captune.json
    python3 scripts/bench_numpy.py --compare captune.json
"""
import argparse, json, statistics, time
import numpy as np

def seconds_per_op(f):
    t = time.perf_counter(); f(); once = max(time.perf_counter() - t, 1e-7)
    reps = int(min(max(0.1 / once, 1), 200))
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--compare", help="captune bench kernels --json output")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    records = []
    for n in map(int, args.sizes.split(",")):
        a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        c = np.empty((n, n), np.float32)
        s = seconds_per_op(lambda: np.matmul(a, b, out=c))
        records.append({"op": "matmul", "backend": "numpy", "adapter": np.__version__,
                        "m": n, "n": n, "k": n, "gflops": 2 * n**3 / s / 1e9, "seconds": s})
    if not args.compare:
        print(json.dumps(records, indent=2))
        return
    ours = {r["m"]: r for r in json.load(open(args.compare)) if r["op"] == "matmul" and r["backend"] == "cpu"}
    print(f"{'size':>6} {'captune cpu':>12} {'numpy':>10} {'ratio':>6}   (GFLOP/s)")
    for r in records:
        if r["m"] in ours:
            g = ours[r["m"]]["gflops"]
            print(f"{r['m']:>6} {g:12.1f} {r['gflops']:10.1f} {g / r['gflops']:6.2f}")

if __name__ == "__main__":
    main()
