#!/usr/bin/env python3
"""Gathers scripts/gpu_bench.sh's steps into two files of its output
folder: records.json (every step: its command, exit status, seconds and
what it printed, parsed as JSON where it is) and summary.txt (captune
against PyTorch for each workload, once per alternation, as a ratio of
their throughputs), which it also prints.

    python3 scripts/gpu_bench_summary.py STEPS_DIR OUT

STEPS_DIR holds steps.tsv (name, exit status, seconds, command; one line
per step) and NAME.out, what each step printed. A pair of steps named
WORKLOAD-captune-N and WORKLOAD-torch-N is one comparison.
"""
import json
import sys
from pathlib import Path

# The throughput each kind of record reports, higher is better.
THROUGHPUT = ("tokens_per_s", "steps_per_s", "images_per_s")


def parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def throughput(output):
    """The figure of a step's record: captune prints an array of records
    (its GPU one is taken), the PyTorch scripts one object."""
    records = output if isinstance(output, list) else [output]
    records = [r for r in records if isinstance(r, dict)]
    gpu = [r for r in records if r.get("backend") == "gpu"]
    for r in gpu[:1] or records[:1]:
        for key in THROUGHPUT:
            if key in r:
                return r[key], key
    return None, None


def kernel_profiles(records):
    """Each profiled step's costliest kernels, as shares of its kernel time."""
    lines = []
    for name, r in records.items():
        output = r["output"] if isinstance(r["output"], list) else []
        for record in output:
            profile = record.get("kernels") if isinstance(record, dict) else None
            if not profile:
                continue
            total = profile["seconds"]
            if not total:
                lines.append(f"profile {name}: no kernel time (timestamps all zero?)")
                continue
            top = ", ".join(f"{k['kernel'].split('/')[-1]} {100 * k['seconds'] / total:.0f}%"
                            for k in profile["kernels"][:6])
            lines.append(f"profile {name}: {1e3 * total:.2f} ms of kernels: {top}")
    return lines


def matmul_variants(output):
    """Per product: the planned kernel's GFLOP/s, the fastest kernel's, and
    any kernel whose product disagrees with the CPU's."""
    if not isinstance(output, list):
        return []
    lines = [f"{'product':<14} {'m x n x k':>18} {'planned':>24} {'fastest':>24}"]
    products = {}
    for r in output:
        products.setdefault((r["product"], r["m"], r["n"], r["k"]), []).append(r)
    for (product, m, n, k), variants in products.items():
        # serde_json writes an infinite value (a NaN left in the output, a
        # time of zero) as null.
        for v in variants:
            v["gflops"] = v["gflops"] if isinstance(v["gflops"], (int, float)) else float("nan")
        planned = next((v for v in variants if v["planned"]), None)
        fastest = max(variants, key=lambda v: v["gflops"] if v["gflops"] == v["gflops"] else -1)
        show = lambda v: f"{v['kernel'].removeprefix('matmul_')} {v['gflops']:.0f}" if v else "-"
        lines.append(f"{product:<14} {f'{m}x{n}x{k}':>18} {show(planned):>24} {show(fastest):>24}")
        for v in variants:
            error = v["relative_error"]
            if not (isinstance(error, (int, float)) and error < 1e-4):
                lines.append(f"  WRONG: {v['kernel']} on {product}: relative error {v['relative_error']}")
    return lines


def main():
    steps_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    records = {}
    for line in (steps_dir / "steps.tsv").read_text().splitlines():
        name, rc, seconds, command = line.split("\t", 3)
        text = (steps_dir / f"{name}.out").read_text(errors="replace") if (steps_dir / f"{name}.out").exists() else ""
        output = parsed(text)
        records[name] = {"command": command, "exit": int(rc), "seconds": float(seconds),
                         "output": output if output is not None else text[-4000:]}
    (out / "records.json").write_text(json.dumps(records, indent=1))

    lines = ["captune against PyTorch, each pair run alternately on the same device",
             f"{'workload':<28} {'run':>3} {'captune':>12} {'pytorch':>12} {'ratio':>7}  figure"]
    for name, r in records.items():
        if "-captune-" not in name:
            continue
        workload, run = name.rsplit("-captune-", 1)
        # WORKLOAD@VARIANT: captune with one of its settings, against the
        # same PyTorch run.
        torch = records.get(f"{workload.split('@')[0]}-torch-{run}")
        if torch is None:
            continue
        ours, key = throughput(r["output"]) if r["exit"] == 0 else (None, None)
        theirs, _ = throughput(torch["output"]) if torch["exit"] == 0 else (None, None)
        if ours is None or theirs is None:
            lines.append(f"{workload:<28} {run:>3} {'failed' if ours is None else f'{ours:12.1f}':>12} "
                         f"{'failed' if theirs is None else f'{theirs:12.1f}':>12}")
            continue
        lines.append(f"{workload:<28} {run:>3} {ours:12.1f} {theirs:12.1f} {ours / theirs:7.3f}  {key}")
    kernels = records.get("kernels-torch", {}).get("output")
    if isinstance(kernels, list):
        for k in kernels:
            if "ratio" in k:
                lines.append(f"{'matmul ' + str(k['m']) + '^3':<28} {'1':>3} {k['captune_gflops']:12.1f} "
                             f"{k['gflops']:12.1f} {k['ratio']:7.3f}  gflops")
    lines += kernel_profiles(records)
    lines += matmul_variants(records.get("matmuls-captune", {}).get("output"))
    failed = [n for n, r in records.items() if r["exit"] != 0]
    lines.append(f"{len(records)} steps, {len(failed)} failed or skipped" +
                 (f": {', '.join(failed)}" if failed else ""))
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
