#!/usr/bin/env python3
"""Small checkpoints as torch.save writes them, for the PyTorch checkpoint
reader's tests (tests/suite/datasets/torch_checkpoint.rs), so CI needs no
torch. Writes to tests/data/torch/:

- state_dict.pt: an OrderedDict state dict (torch.save's zip format) with
  float32, float16 and bfloat16 tensors, a transposed view, two tensors
  that share one storage at different offsets, a 0-d tensor, an int64
  buffer and an nn.Parameter; state_dict_expected.safetensors holds each
  as a contiguous float32 tensor under the same name;
- nested.pt: {"model": a module's state_dict(), "epoch": 3, "config":
  {...}} as the BLIP and ClipCap training scripts save theirs (a module's
  state dict carries a `_metadata` attribute);
  nested_expected.safetensors holds its tensors;
- module.pt: a whole nn.Linear (torch.save(model)), which must be refused;
- malicious.pt: a pickle that would call os.system, which must be refused
  without running it.

    pip install torch safetensors
    python3 scripts/torch_checkpoint_fixtures.py
"""
import collections
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch"


class Malicious:
    def __reduce__(self):
        return (os.system, ("echo this checkpoint ran code",))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    shared = torch.randn(10)
    state = collections.OrderedDict()
    state["encoder.weight"] = base
    state["encoder.weight_t"] = base.t()  # strided: a view of the same storage
    state["half.weight"] = torch.randn(3, 5).half()
    state["bf16.weight"] = torch.randn(2, 7).bfloat16()
    state["shared.a"] = shared[2:6]
    state["shared.b"] = shared[5:].view(5, 1)
    state["scale"] = torch.tensor(0.25)
    state["position_ids"] = torch.arange(12).view(1, 12)
    state["param"] = torch.nn.Parameter(torch.randn(3))
    state["double"] = torch.randn(2, 2, dtype=torch.float64)
    torch.save(state, OUT / "state_dict.pt")
    expected = {n: t.detach().to(torch.float32).clone().contiguous() for n, t in state.items()}
    save_file(expected, OUT / "state_dict_expected.safetensors",
              metadata={"made_by": "scripts/torch_checkpoint_fixtures.py (PyTorch " + torch.__version__ + ")"})
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    module[1].bias.data.normal_()
    nested = module.state_dict()
    torch.save({"model": nested, "epoch": 3, "config": {"lr": 1e-5, "name": "blip", "sizes": [1, 2],
                                                         "pretrained": None, "fp16": True}},
               OUT / "nested.pt")
    save_file({n: t.contiguous() for n, t in nested.items()}, OUT / "nested_expected.safetensors")
    torch.save(torch.nn.Linear(2, 2), OUT / "module.pt")
    torch.save({"model": Malicious()}, OUT / "malicious.pt")
    for f in sorted(OUT.iterdir()):
        print(f"{f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
