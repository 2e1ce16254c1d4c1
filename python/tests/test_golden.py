"""The package's objectives against the golden values that captune's own
golden test checks (tests/data/golden_*, made by scripts/golden.py in
float64 from the documentation alone): MLE's loss, every gradient and
every weight after one AdamW step; SMILE's loss and every gradient with
first-token MLE, none, and shift mixed with MLE."""

import json
import unittest
from pathlib import Path

from safetensors import safe_open

from captune_torch import load_checkpoint
from captune_torch.data import Vocabulary
from captune_torch.model import Captioner
from captune_torch.objectives import TokenObjective
from captune_torch.optim import adamw, clip

from .tolerances import assert_close, assert_step_close

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


def golden(name):
    with safe_open(str(DATA / f"golden_{name}_expected.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def loss_and_gradients(checkpoint, objective, settings, want):
    ck = load_checkpoint(DATA / checkpoint)
    model = Captioner(ck.config, ck.tensors)
    alternatives = Vocabulary(ck.metadata, ck.config).alternatives
    targets = want["targets"].long()
    sums = TokenObjective(objective, settings, alternatives)(model, want["features"], want["inputs"].long(), targets)
    loss = sums["loss"] / int((targets != model.pad).sum())
    loss.backward()
    return model, loss


class Golden(unittest.TestCase):
    def test_mle_step_equals_the_golden_values(self):
        want, meta = golden("captioner")
        model, loss = loss_and_gradients("golden_captioner.safetensors", "mle", {}, want)
        assert_close("loss", loss.reshape(1), want["loss"], 1e-5, 0)
        number = lambda key: float(meta[key])
        opt = adamw(model, number("lr"), number("weight_decay"))
        grads = {n: model.tensor(n).grad.clone() for n in model.names}
        norm = float(clip(model, number("max_grad_norm")))
        self.assertLess(abs(norm - float(want["grad_norm"][0])), 1e-5 * norm)
        opt.step()
        assert_step_close(
            "captune_torch", grads, model.state(),
            {n: want[f"grad.{n}"] for n in model.names}, {n: want[f"after.{n}"] for n in model.names},
            norm, number("lr"), number("eps"), number("max_grad_norm"))
        for i, name in enumerate(model.names):
            state = opt.state[model.tensor(name)]
            clipped = min(number("max_grad_norm") / norm, 1.0)
            assert_close(f"first moment of {name}", state["exp_avg"], want[f"m.{name}"], 1e-5, 1e-7 * clipped)
            assert_close(f"second moment of {name}", state["exp_avg_sq"], want[f"v.{name}"], 2e-5, 1e-12)

    def test_smile_equals_the_golden_values(self):
        want, meta = golden("smile")
        cases = json.loads(meta["cases"])
        self.assertEqual(len(cases), 3)
        for case in cases:
            name = case["name"]
            model, loss = loss_and_gradients("golden_smile.safetensors", case["objective"], case["settings"], want)
            assert_close(f"{name}: loss", loss.reshape(1), want[f"{name}.loss"], 1e-5, 0)
            for n in model.names:
                assert_close(f"{name}: gradient of {n}", model.tensor(n).grad, want[f"{name}.grad.{n}"], 1e-5, 1e-6)


class GoldenScst(unittest.TestCase):
    def test_scst_equals_the_golden_values(self):
        """For the samples and greedy captions captune drew for one step
        (golden_sequence_inputs), the rewards, advantages, loss and every
        gradient of SCST with the greedy and the mean baseline."""
        from .scst_step import loss_and_gradients

        want, meta = golden("sequence")
        cases = [c for c in json.loads(meta["cases"]) if c["objective"] == "scst"]
        self.assertEqual([c["settings"]["baseline"] for c in cases], ["greedy", "mean"])
        for case in cases:
            name = case["name"]
            model, loss = loss_and_gradients(case["settings"]["baseline"])
            assert_close(f"{name}: loss", loss.reshape(1), want[f"{name}.loss"], 1e-5, 1e-7)
            for n in model.names:
                assert_close(f"{name}: gradient of {n}", model.tensor(n).grad, want[f"{name}.grad.{n}"], 1e-5, 1e-6)
