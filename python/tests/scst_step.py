"""One SCST step of the package on the golden captioner, for the samples
and greedy captions captune draws at its first step
(tests/data/golden_sequence_inputs.safetensors): the loss, every
gradient, the gradient norm, and AdamW's moments and every weight after
the step with the golden test's hyper-parameters, written in the layout
of a golden expected file so that tests/suite/models/golden.rs holds captune's own
step to it.

    python3 -m tests.scst_step OUT.safetensors greedy|mean    # from python/
"""

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from captune_torch import load_checkpoint
from captune_torch.cider import CiderD
from captune_torch.data import Vocabulary
from captune_torch.model import Captioner
from captune_torch.objectives import Scst
from captune_torch.optim import adamw, clip

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


def read(name):
    with safe_open(str(DATA / name), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def loss_and_gradients(baseline):
    """The golden captioner with SCST's gradients for the samples captune
    drew, and the loss: rewards by the package's CIDEr-D over the inputs'
    corpus, advantages against `baseline`."""
    given, meta = read("golden_sequence_inputs.safetensors")
    references = [[r.split() for r in image] for image in json.loads(meta["references"])]
    images = json.loads(meta["images"])
    samples, greedy = given["samples"].long(), given["greedy"].long()
    ck = load_checkpoint(DATA / "golden_captioner.safetensors")
    model = Captioner(ck.config, ck.tensors)
    scst = Scst({"baseline": baseline, "samples": samples.shape[0] // len(images)},
                Vocabulary(ck.metadata, ck.config), CiderD(references))
    advantages = torch.tensor([a for _, _, a in scst.advantages(images, samples, greedy)])
    rows = torch.arange(samples.shape[0]) // scst.samples
    loss = scst.surrogate(model, given["features"][rows], samples, advantages) / samples.shape[0]
    loss.backward()
    return model, loss


def main(out, baseline):
    _, hyper = read("golden_captioner_expected.safetensors")
    model, loss = loss_and_gradients(baseline)
    grads = {n: model.tensor(n).grad.clone() for n in model.names}
    opt = adamw(model, float(hyper["lr"]), float(hyper["weight_decay"]))
    norm = float(clip(model, float(hyper["max_grad_norm"])))
    opt.step()
    tensors = {"loss": loss.detach().reshape(1), "grad_norm": torch.tensor([norm])}
    for n in model.names:
        state = opt.state[model.tensor(n)]
        tensors.update({f"grad.{n}": grads[n], f"after.{n}": model.tensor(n).detach(),
                        f"m.{n}": state["exp_avg"], f"v.{n}": state["exp_avg_sq"]})
    keys = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm")
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, out,
              metadata={k: hyper[k] for k in keys} | {"made_by": "python/tests/scst_step.py (captune_torch)"})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
