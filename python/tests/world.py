"""A tiny shapes world on disk for the package's tests, made by the
captune binary: 48 training images (or fewer, each with one caption, for
a single-batch epoch), their embeddings by the shapes retriever, and a
captune run to start from.

The binary is $CAPTUNE_BIN, else target/release/captune or
target/debug/captune of this repository; without one the tests that need
it are skipped (say so with a message)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"


def captune_binary():
    for candidate in (os.environ.get("CAPTUNE_BIN"), REPO / "target/release/captune", REPO / "target/debug/captune"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def captune(*args):
    """Runs captune on the CPU; fails with its output."""
    out = subprocess.run([captune_binary(), "--device", "cpu", *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"captune {' '.join(map(str, args))} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def package(*args, processes=None, fails=False):
    """Runs `python -m captune_torch.train` (under torchrun with
    `processes`) on the CPU, validating with this build's captune; fails
    with its output unless it fails as expected (`fails`: then its
    standard error)."""
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if processes:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--standalone", "-m", "captune_torch.train"]
    else:
        cmd = [sys.executable, "-m", "captune_torch.train"]
    args = ["--device", "cpu", "--captune", captune_binary(), "--captune-device", "cpu", *map(str, args)]
    out = subprocess.run(cmd + args, capture_output=True, text=True, env=env, timeout=600)
    if (out.returncode != 0) != fails:
        raise AssertionError(f"{' '.join(cmd)} {' '.join(args)} exited with {out.returncode}:\n"
                             f"{out.stdout}\n{out.stderr}")
    return out.stderr if fails else out.stdout


class World:
    """The world in a temporary folder (removed by `close`)."""

    def __init__(self, one_caption_images=None):
        self.dir = Path(tempfile.mkdtemp(prefix="captune-torch-"))
        world = self.dir / "world"
        captune("data", "shapes", "--out", world, "--shapes-size", 32, "--shapes-train", 48,
                "--shapes-val", 16, "--shapes-test", 16)
        self.data = world / "dataset_shapes.json"
        if one_caption_images:
            # The first training images only, each with its first caption:
            # an epoch is then one batch of known pairs.
            doc = json.loads(self.data.read_text())
            train = [e for e in doc["images"] if e["split"] == "train"][:one_caption_images]
            for e in train:
                e["sentences"] = e["sentences"][:1]
            doc["images"] = train + [e for e in doc["images"] if e["split"] != "train"]
            self.data = world / "dataset_one_caption.json"
            self.data.write_text(json.dumps(doc))
        self.features = self.dir / "features.safetensors"
        captune("embed", "--data", f"karpathy:{self.data}", "--checkpoint",
                REPO / "assets/shapes-retriever.safetensors", "--out", self.features)

    def data_args(self):
        return ["--data", f"karpathy:{self.data}", "--features", self.features]

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)
