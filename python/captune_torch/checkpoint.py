"""captune's captioner checkpoints: one safetensors file whose metadata
holds the config (`captioner_config`), the vocabulary (`vocab`, or a
GPT-2's `tokenizer`) and the position in the run (`step`, `epoch`), and
AdamW's moments beside it (`optimizer.safetensors`). Both are written to
`NAME.next` and renamed into place, the optimizer's first, as captune
does, so a kill leaves either the old pair or the new one."""

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "captune captioner"


class CheckpointError(ValueError):
    """A file that is not a captune captioner checkpoint, or not one this
    package can train; the message names the file and what to do."""


@dataclass
class Checkpoint:
    """A captioner checkpoint: its config (the `captioner_config` JSON),
    every tensor by name (float32), and the rest of its metadata, written
    back unchanged."""

    config: dict
    tensors: dict
    metadata: dict = field(default_factory=dict)


def load_checkpoint(path) -> Checkpoint:
    path = os.fspath(path)
    try:
        with safe_open(path, framework="pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name).to(torch.float32) for name in f.keys()}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file; give a captune run folder or its checkpoint.safetensors")
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a safetensors file ({e}); give a captune captioner checkpoint")
    kind = metadata.get("format")
    if kind != FORMAT:
        raise CheckpointError(
            f"{path}: its format is {kind!r}, not {FORMAT!r}; captune_torch trains captioners "
            "(a retriever or a CLIP is not one)")
    try:
        config = json.loads(metadata["captioner_config"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: metadata field captioner_config is missing or not JSON ({e})")
    family = config.get("family", "prefix") if isinstance(config, dict) else "prefix"
    if family == "lstm" and (config.get("lstm") or {}).get("model") != "fc":
        family = f"lstm:{(config.get('lstm') or {}).get('model')}"
    if family not in ("prefix", "lstm"):
        raise CheckpointError(
            f"{path}: a {family} captioner; captune_torch trains the prefix decoder (captune's own, "
            "or a GPT-2 as ClipCap) and the FC LSTM: train this one with `captune train`")
    variant = (config.get("lstm") or {}).get("variant")
    unlike = [what for what, held in (
        ("self-critical.pytorch's variant of the LSTM", variant not in (None, "papers")),
        ("ClipCap's own layout (no start token fed)", config.get("prefix_predicts_first")),
        ("unnormalised image embeddings", config.get("raw_embeddings")),
    ) if held]
    if unlike:
        raise CheckpointError(
            f"{path}: a captioner with {unlike[0]}, which captune_torch does not compute: train "
            "this one with `captune train`")
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {name} holds NaN or an infinity")
    return Checkpoint(config=config, tensors=tensors, metadata=metadata)


def write_atomic(tensors: dict, path, metadata: dict) -> str:
    """Writes `path.next` whole and returns its name; the caller renames it."""
    path = os.fspath(path)
    staged = path + ".next"
    save_file({n: t.detach().to(torch.float32).contiguous().cpu() for n, t in tensors.items()},
              staged, metadata={k: str(v) for k, v in metadata.items()})
    return staged
