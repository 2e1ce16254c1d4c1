"""One step of the package and one step of captune, from the same
checkpoint on the same batch (16 images of one caption each, the whole
epoch), with fresh AdamW state, for MLE and for SMILE mixed with MLE, on
every captioner kind (captune's own decoder, with ClipCap's MLP or
transformer mapper, a GPT-2 ClipCap, the tiny random GPT-2 of
tests/data, and the LSTM fed the image either way): the same losses, gradient norm, AdamW
moments and weights, within the golden test's tolerances."""

import json
import unittest

import torch
from safetensors.torch import load_file

from captune_torch.checkpoint import load_checkpoint
from captune_torch.config import read_config
from captune_torch.data import Corpus, Vocabulary, load_features, tensors_of
from captune_torch.model import Captioner, is_adapter
from captune_torch.objectives import TokenObjective
from captune_torch.optim import MAX_GRAD_NORM, EPS, warmup_cosine

from .tolerances import assert_close, assert_step_close
from .world import REPO, World, captune, captune_binary, package

IMAGES = 16
DECODERS = {  # captioner kind: the flags that start it
    "captune decoder": [],
    "captune decoder, ClipCap's transformer mapper": ["--mapper", "transformer"],
    "GPT-2 ClipCap": ["--decoder", f"hf:{REPO / 'tests/data/gpt2-tiny'}"],
    "LSTM": ["--decoder", "lstm:fc"],
    "LSTM, image as input": ["--decoder", "lstm:fc", "--image-feed", "input"],
}
LR = 3e-3
CASES = [  # (objective, its flags, its settings)
    ("mle", [], {}),
    ("smile", ["--objective", "smile", "--mle-weight", 0.3], {"first_token": "mle", "mle_weight": 0.3}),
    ("mle", ["--freeze-decoder"], {}),
]


def last_log(folder):
    return json.loads((folder / "log.jsonl").read_text().splitlines()[-1])


@unittest.skipUnless(captune_binary(), "no captune binary (build it, or set CAPTUNE_BIN)")
class SameStep(unittest.TestCase):
    def test_one_step_equals_captunes(self):
        world = World(one_caption_images=IMAGES)
        try:
            common = ["--preset", "tiny", *world.data_args(), "--batch", IMAGES, "--epochs", 1]
            for k, (kind, decoder) in enumerate(DECODERS.items()):
                # A trained start: one step from fresh weights.
                start = world.dir / f"start-{k}"
                captune("train", *common, *decoder, "--out", start)
                for objective, flags, settings in CASES:
                    with self.subTest(f"{kind}, {objective} {flags}"):
                        self.one_step(world, start, common, objective, flags, settings)
        finally:
            world.close()

    def one_step(self, world, start, common, objective, flags, settings):
        case = f"{start.name}-{objective}-{len(flags)}"
        ours, theirs = (world.dir / f"{who}-{case}" for who in ("torch", "captune"))
        captune("train", *common, *flags, "--lr", LR, "--init", start / "checkpoint.safetensors", "--out", theirs)
        package("--init", start, "--epochs", 1, *flags, "--lr", LR, "--out", ours)

        mine, want = last_log(ours), last_log(theirs)
        for key in ("step", "epoch", "objective"):
            self.assertEqual(mine[key], want[key])
        self.assertAlmostEqual(mine["lr"], want["lr"], delta=1e-9)
        for key in ("loss", "mle", "smile", "grad_norm"):
            self.assertLess(abs(mine[key] - want[key]), 1e-5 * want[key], (key, mine, want))

        # The exact gradient, in float64, for the tolerance of Adam's first
        # step where |g| is near eps.
        ck = load_checkpoint(start / "checkpoint.safetensors")
        vocab = Vocabulary(ck.metadata, ck.config)
        config = read_config(start / "config.toml", "the start run has one")
        corpus = Corpus(config["features"], load_features(config["features"]["features"]), vocab)
        exact = Captioner(ck.config, ck.tensors).double()
        pairs = [(i, 0) for i in range(len(corpus))]
        features, inputs, targets = tensors_of(corpus, pairs, "cpu", exact.pad)
        sums = TokenObjective(objective, settings, vocab.alternatives)(exact, features.double(), inputs, targets)
        (sums["loss"] / int((targets != exact.pad).sum())).backward()
        frozen = "--freeze-decoder" in flags
        grads = {n: exact.tensor(n).grad for n in exact.names if not (frozen and not is_adapter(ck.config, n))}
        norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads.values())))
        lr = warmup_cosine(LR, config["train"]["warmup"], 0, 1)
        # AdamW's moments carry the clipped gradient itself (the first
        # step's update is about lr * sign(g), blind to small errors).
        clip = min(MAX_GRAD_NORM / norm, 1.0)
        m, want_m = (load_file(str(f / "optimizer.safetensors")) for f in (ours, theirs))
        if frozen:
            before = load_file(str(start / "checkpoint.safetensors"))
            for name in exact.names:
                moved = not torch.equal(load_file(str(ours / "checkpoint.safetensors"))[name], before[name])
                self.assertEqual(moved, is_adapter(ck.config, name), name)
        for i, name in enumerate(exact.names):
            self.assertEqual(m[f"m.{i}"].shape, want_m[f"m.{i}"].shape, name)
            assert_close(f"{objective}: first moment of {name}", m[f"m.{i}"], want_m[f"m.{i}"], 1e-5, 1e-7 * clip)
            assert_close(f"{objective}: second moment of {name}", m[f"v.{i}"], want_m[f"v.{i}"], 2e-5, 1e-12)
        after = {n: t for n, t in load_file(str(ours / "checkpoint.safetensors")).items() if n in grads}
        assert_step_close(f"{objective}: captune_torch against captune", {}, after, grads,
                          load_file(str(theirs / "checkpoint.safetensors")), norm, lr, EPS, MAX_GRAD_NORM)
