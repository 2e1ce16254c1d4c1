"""The package's MLE step against the golden values that captune's own
golden test checks (tests/data/golden_captioner*, made by
scripts/golden.py in float64): the loss, every gradient and every weight
after one AdamW step."""

from pathlib import Path

import unittest
import torch
from safetensors import safe_open

from captune_torch import load_checkpoint
from captune_torch.model import Captioner
from captune_torch.objectives import mle
from captune_torch.optim import adamw, clip

from .tolerances import assert_step_close

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


def expected(name):
    with safe_open(str(DATA / f"golden_{name}_expected.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def close(got, want, what, tol=1e-5):
    scale = max(float(want.abs().max()), 1.0)
    err = float((got.detach().float() - want).abs().max())
    assert err <= tol * scale, f"{what}: off by {err} (scale {scale})"


class Golden(unittest.TestCase):
    def test_mle_step_equals_the_golden_values(self):
        mle_step_equals_the_golden_values()


def mle_step_equals_the_golden_values():
    ck = load_checkpoint(DATA / "golden_captioner.safetensors")
    want, meta = expected("captioner")
    model = Captioner(ck.config, ck.tensors)
    total, tokens = mle(model, want["features"], want["inputs"].long(), want["targets"].long())
    loss = total / tokens
    loss.backward()
    close(loss, want["loss"][0], "loss")
    opt = adamw(model, float(meta["lr"]), float(meta["weight_decay"]))
    grads = {n: model.tensor(n).grad.clone() for n in model.names}
    norm = clip(model, float(meta["max_grad_norm"]))
    assert abs(norm - float(want["grad_norm"][0])) <= 1e-5 * norm, norm
    opt.step()
    assert_step_close(
        "captune_torch", grads, model.state(),
        {n: want[f"grad.{n}"] for n in model.names}, {n: want[f"after.{n}"] for n in model.names},
        norm, float(meta["lr"]), float(meta["eps"]), float(meta["max_grad_norm"]))
