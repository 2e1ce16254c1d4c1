"""Two processes under torchrun (gloo, on the CPU) train what one process
trains on the same global batches: the same log lines and the same
weights, in a run folder captune reads, resumes and evaluates.

    python3 -m tests.test_ddp OUT    # from python/: leaves the 2-process run in OUT (the app's follow test)
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


def ddp_runs(world):
    """A captune run of one epoch, then two more epochs from it by one
    process and by two; their folders, and the two's wall times."""
    start, one, two = (world.dir / n for n in ("start", "one", "two"))
    captune("train", "--preset", "tiny", *world.data_args(), "--epochs", 1, "--out", start)
    began = time.time()
    package("--init", start, "--epochs", EPOCHS, "--out", one)
    single = time.time() - began
    began = time.time()
    package("--init", start, "--epochs", EPOCHS, "--out", two, processes=2)
    return start, one, two, (single, time.time() - began)


def records(folder):
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


@unittest.skipUnless(captune_binary(), "no captune binary (build it, or set CAPTUNE_BIN)")
class TwoProcesses(unittest.TestCase):
    def test_two_processes_equal_one_and_captune_reads_the_run(self):
        world = World()
        try:
            start, one, two, (single, double) = ddp_runs(world)
            print(f"\n  {EPOCHS} epochs of the tiny world: one process {single:.1f} s, two {double:.1f} s",
                  file=sys.stderr)
            a, b = records(one), records(two)
            self.assertEqual([r["step"] for r in a], [r["step"] for r in b])
            self.assertGreaterEqual(len(a), 2)
            for x, y in zip(a, b):
                for key in ("loss", "mle", "grad_norm", "lr"):
                    self.assertLess(abs(x[key] - y[key]), 1e-5 * abs(x[key]) + 1e-7, (key, x, y))
            w1, w2 = (load_file(str(f / "checkpoint.safetensors")) for f in (one, two))
            self.assertEqual(w1.keys(), w2.keys())
            for name in w1:
                assert_close(f"{name} after {EPOCHS} epochs", w2[name], w1[name], 1e-4, 1e-5)
            # captune reads it: evaluation, and a resumed epoch on one machine.
            out = captune("eval", "--checkpoint", two / "checkpoint.safetensors", "--split", "val", "--json")
            self.assertIn("CIDEr-D", json.loads(out))
            captune("train", "--resume", "--out", two, "--epochs", 1)
            steps = [r["step"] for r in records(two)]
            self.assertEqual(steps, sorted(steps))
            self.assertGreater(steps[-1], a[-1]["step"])
        finally:
            world.close()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    world = World()
    try:
        _, _, two, _ = ddp_runs(world)
        shutil.copytree(two, out)
    finally:
        world.close()
