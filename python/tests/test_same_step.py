"""One step of the package and one step of captune, from the same
checkpoint on the same batch (16 images of one caption each, the whole
epoch), with fresh AdamW state: the same loss, and the same weights
within the golden test's tolerances."""

import json
import unittest

import torch
from safetensors.torch import load_file

from captune_torch.checkpoint import load_checkpoint
from captune_torch.config import read_config
from captune_torch.data import Vocabulary
from captune_torch.model import Captioner
from captune_torch.optim import MAX_GRAD_NORM, EPS, warmup_cosine
from captune_torch.train import Corpus, tensors_of

from .tolerances import assert_close, assert_step_close
from .world import World, captune, captune_binary, package

IMAGES = 16


def last_log(folder):
    return json.loads((folder / "log.jsonl").read_text().splitlines()[-1])


@unittest.skipUnless(captune_binary(), "no captune binary (build it, or set CAPTUNE_BIN)")
class SameStep(unittest.TestCase):
    def test_one_mle_step_equals_captunes(self):
        world = World(one_caption_images=IMAGES)
        try:
            start, ours, theirs = (world.dir / n for n in ("start", "torch", "captune"))
            common = ["--preset", "tiny", *world.data_args(), "--batch", IMAGES, "--epochs", 1]
            # A trained start (one step from fresh weights), then one more
            # step each way.
            captune("train", *common, "--out", start)
            captune("train", *common, "--init", start / "checkpoint.safetensors", "--out", theirs)
            package("--init", start, "--epochs", 1, "--out", ours)

            mine, want = last_log(ours), last_log(theirs)
            self.assertEqual((mine["step"], mine["epoch"]), (want["step"], want["epoch"]))
            self.assertAlmostEqual(mine["lr"], want["lr"], delta=1e-9)
            self.assertLess(abs(mine["loss"] - want["loss"]), 1e-5 * want["loss"], (mine, want))
            self.assertLess(abs(mine["grad_norm"] - want["grad_norm"]), 1e-5 * want["grad_norm"])

            # The exact gradient, in float64, for the tolerance of Adam's
            # first step where |g| is near eps.
            ck = load_checkpoint(start / "checkpoint.safetensors")
            config = read_config(start / "config.toml")
            corpus = Corpus(config, Vocabulary(ck.metadata, ck.config))
            exact = Captioner(ck.config, ck.tensors).double()
            pairs = [(i, 0) for i in range(len(corpus))]
            features, inputs, targets = tensors_of(corpus, pairs, "cpu", exact.pad)
            logp = torch.log_softmax(exact(features.double(), inputs), -1)
            real = targets != exact.pad
            nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[real]
            nll.mean().backward()
            grads = {n: exact.tensor(n).grad for n in exact.names}
            norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads.values())))
            lr = warmup_cosine(config["train"]["lr"], config["train"]["warmup"], 0, 1)
            # AdamW's moments carry the clipped gradient itself (the first
            # step's update is about lr * sign(g), blind to small errors).
            clip = min(MAX_GRAD_NORM / norm, 1.0)
            m, want_m = (load_file(str(f / "optimizer.safetensors")) for f in (ours, theirs))
            for i, name in enumerate(exact.names):
                assert_close(f"first moment of {name}", m[f"m.{i}"], want_m[f"m.{i}"], 1e-5, 1e-7 * clip)
                assert_close(f"second moment of {name}", m[f"v.{i}"], want_m[f"v.{i}"], 2e-5, 1e-12)
            after = load_file(str(ours / "checkpoint.safetensors"))
            assert_step_close("captune_torch against captune", {}, after, grads,
                              load_file(str(theirs / "checkpoint.safetensors")), norm, lr, EPS, MAX_GRAD_NORM)
        finally:
            world.close()
