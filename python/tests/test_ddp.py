"""Two processes under torchrun (gloo, on the CPU) train what one process
trains on the same global batches, for MLE and for SCST (whose samples
are drawn per place in the whole batch): the same log lines and the same
weights, in a run folder that captune reads, evaluates and resumes.

    python3 -m tests.test_ddp OUT    # from python/: leaves a 2-process MLE run in OUT (the app's follow test)
"""

import json
import shutil
import sys
import time
import unittest
from pathlib import Path

from safetensors.torch import load_file

from .tolerances import assert_close
from .world import World, captune, captune_binary, package

EPOCHS = 2
CASES = [  # (objective, flags, epochs, the log's values)
    ("mle", [], EPOCHS, ("loss", "mle", "smile", "grad_norm", "lr")),
    ("scst", ["--objective", "scst", "--lr", 1e-4], 1,
     ("loss", "reward", "baseline", "advantage_spread", "sample_length", "grad_norm", "lr")),
]


def start_run(world):
    """A captune run of one epoch of MLE, to continue from."""
    start = world.dir / "start"
    captune("train", "--preset", "tiny", *world.data_args(), "--epochs", 1, "--out", start)
    return start


def continued(world, start, name, flags, epochs):
    """The run continued by one process and by two: their folders and
    wall times."""
    one, two = world.dir / f"{name}-one", world.dir / f"{name}-two"
    times = []
    for out, processes in ((one, None), (two, 2)):
        began = time.time()
        package("--init", start, "--epochs", epochs, *flags, "--out", out, processes=processes)
        times.append(time.time() - began)
    return one, two, times


def records(folder):
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


@unittest.skipUnless(captune_binary(), "no captune binary (build it, or set CAPTUNE_BIN)")
class TwoProcesses(unittest.TestCase):
    def test_two_processes_equal_one_and_captune_reads_the_run(self):
        world = World()
        try:
            start = start_run(world)
            for name, flags, epochs, keys in CASES:
                with self.subTest(name):
                    self.compare(world, start, name, flags, epochs, keys)
        finally:
            world.close()

    def compare(self, world, start, name, flags, epochs, keys):
        one, two, (single, double) = continued(world, start, name, flags, epochs)
        print(f"\n  {name}, {epochs} epoch(s) of the tiny world on the CPU: one process {single:.1f} s, "
              f"two {double:.1f} s", file=sys.stderr)
        a, b = records(one), records(two)
        self.assertEqual([r["step"] for r in a], [r["step"] for r in b])
        self.assertGreaterEqual(len(a), 1)
        for x, y in zip(a, b):
            self.assertEqual(x["objective"], y["objective"])
            for key in keys:
                self.assertLess(abs(x[key] - y[key]), 1e-5 * abs(x[key]) + 1e-7, (key, x, y))
        w1, w2 = (load_file(str(f / "checkpoint.safetensors")) for f in (one, two))
        self.assertEqual(w1.keys(), w2.keys())
        for n in w1:
            assert_close(f"{name}: {n} at the end", w2[n], w1[n], 1e-4, 1e-5)
        # The start and each epoch's state validated by captune, as its own
        # are: the same records from both runs' (equal) weights.
        for f in ("metrics.jsonl", "samples.jsonl"):
            mine, theirs = ([json.loads(x) for x in (d / f).read_text().splitlines()] for d in (one, two))
            self.assertEqual(sorted({r["epoch"] for r in mine}), list(range(epochs + 1)), f)
            self.assertEqual([(r["epoch"], r["step"]) for r in mine], [(r["epoch"], r["step"]) for r in theirs])
        metrics = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
        self.assertEqual(metrics[-1]["step"], a[-1]["step"])
        self.assertIn("CIDEr-D", metrics[-1])
        # captune reads it: evaluation, and a resumed epoch on one machine.
        out = captune("eval", "--checkpoint", two / "checkpoint.safetensors", "--split", "val", "--json",
                      "--results", world.dir / f"{name}-results.json")
        self.assertIn("CIDEr-D", json.loads(out))
        image = json.loads((two / "samples.jsonl").read_text().splitlines()[0])["image_id"]
        out = captune("inspect", "--checkpoint", two / "checkpoint.safetensors", "--image", image,
                      "--caption", "a red circle", "--objective", "scst", "--json")
        self.assertIn("advantage", json.loads(out)["explanation"])
        captune("train", "--resume", "--out", two, "--epochs", 1)
        steps = [r["step"] for r in records(two)]
        self.assertEqual(steps, sorted(steps))
        self.assertGreater(steps[-1], a[-1]["step"])
        # And back: two processes resume what captune saved.
        package("--resume", "--out", two, "--epochs", 1, processes=2)
        after = [r["step"] for r in records(two)]
        self.assertEqual(after[: len(steps)], steps)
        self.assertGreater(after[-1], steps[-1])


if __name__ == "__main__":
    out = Path(sys.argv[1])
    world = World()
    try:
        _, two, _ = continued(world, start_run(world), "mle", [], EPOCHS)
        shutil.copytree(two, out)
    finally:
        world.close()
