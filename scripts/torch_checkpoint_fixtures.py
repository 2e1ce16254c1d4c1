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
  without running it;
- legacy.pt: the same state dict in the format of PyTorch before 1.6,
  refused with that said;
- one_matrix.pt ({"w": a 4 x 6 matrix}) and two edits of its pickle that
  torch.save cannot make: lying_storage.pt, whose storage claims 99
  elements where its entry holds 24, and past_storage.pt, whose view
  starts one element in and so reaches one past the storage's end;
- big_int.pt: an int64 tensor holding 2^24 + 1, which float32 cannot hold
  exactly (state_dict.pt holds +-2^24, which it can).

    pip install torch safetensors
    python3 scripts/torch_checkpoint_fixtures.py
"""
import collections
import os
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch"


class Malicious:
    def __reduce__(self):
        return (os.system, ("echo this checkpoint ran code",))


def edit(source, target, old, new):
    """A copy of the checkpoint `source` whose pickle has `old` (found
    once) replaced by `new`, stored as torch.save stores its entries."""
    with zipfile.ZipFile(source) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            if name.endswith("/data.pkl"):
                assert data.count(old) == 1, (name, old)
                data = data.replace(old, new)
            z.writestr(name, data)


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
    state["exact_ints"] = torch.tensor([2**24, -2**24, 7])
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
    torch.save(state, OUT / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"w": torch.arange(24.0).view(4, 6)}, OUT / "one_matrix.pt")
    # The storage's element count (BININT1 24 after its location 'cpu'),
    # and the view's offset (BININT1 0 after the persistent id).
    edit(OUT / "one_matrix.pt", OUT / "lying_storage.pt", b"cpuq\x06K\x18", b"cpuq\x06K\x63")
    edit(OUT / "one_matrix.pt", OUT / "past_storage.pt", b"QK\x00K\x04K\x06\x86", b"QK\x01K\x04K\x06\x86")
    torch.save({"ids": torch.tensor([2**24 + 1])}, OUT / "big_int.pt")
    for f in sorted(OUT.iterdir()):
        print(f"{f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
