"""captune's run-folder format (docs/data.md, "Run folders"), written as
captune writes it: JSON-lines records appended with a single write each,
and the state (checkpoint.safetensors and optimizer.safetensors, both
carrying `step` and `epoch`) saved whole as `*.next`, then renamed, the
optimizer first. Resuming takes the optimizer's position, finishes a
checkpoint rename a kill interrupted, and drops every record written
after that step."""

import json
import os

import torch
from safetensors import safe_open

from .checkpoint import FORMAT, write_atomic

CONFIG, LOG, SAMPLES, METRICS = "config.toml", "log.jsonl", "samples.jsonl", "metrics.jsonl"
CHECKPOINT, OPTIMIZER = "checkpoint.safetensors", "optimizer.safetensors"
RUN_FILES = (CONFIG, LOG, SAMPLES, METRICS, CHECKPOINT, OPTIMIZER)


class RunFolderError(ValueError):
    pass


def holds_a_run(folder):
    return any(os.path.exists(os.path.join(folder, f)) for f in RUN_FILES)


def append_record(folder, name, record):
    """One JSON line, in one write."""
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def write_text_atomic(path, text):
    staged = path + ".next"
    with open(staged, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(staged, path)


def metadata_of(path):
    try:
        with safe_open(path, framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types
        raise RunFolderError(f"{path}: not a readable state file ({e}); start a new run from the "
                             "folder's checkpoint (--init)")


def position_of(path):
    meta = metadata_of(path)
    try:
        return int(meta["step"]), int(meta["epoch"])
    except (KeyError, ValueError):
        raise RunFolderError(f"{path}: no step and epoch in its metadata; not a run folder's state")


def save_state(folder, model, optimizer, checkpoint_metadata, step, epoch, objective_state):
    """The checkpoint and AdamW's moments (`m.{i}`, `v.{i}`, flat, in the
    model's parameter order) at (step, epoch), atomically as captune saves
    them."""
    position = {"step": str(step), "epoch": str(epoch)}
    meta = dict(checkpoint_metadata, format=FORMAT, **position)
    tensors = model.state()
    moments = {}
    for i, name in enumerate(model.names):
        state = optimizer.state.get(model.tensor(name), {})
        # Flat, as captune stores them.
        moments[f"m.{i}"] = state.get("exp_avg", torch.zeros_like(tensors[name])).reshape(-1)
        moments[f"v.{i}"] = state.get("exp_avg_sq", torch.zeros_like(tensors[name])).reshape(-1)
    staged_ck = write_atomic(tensors, os.path.join(folder, CHECKPOINT), meta)
    staged_opt = write_atomic(moments, os.path.join(folder, OPTIMIZER), dict(
        position, adamw_step=str(step_count(optimizer)), objective_state=json.dumps(objective_state)))
    os.replace(staged_opt, os.path.join(folder, OPTIMIZER))
    os.replace(staged_ck, os.path.join(folder, CHECKPOINT))


def step_count(optimizer):
    steps = [int(s["step"]) for s in optimizer.state.values() if "step" in s]
    return max(steps, default=0)


def load_optimizer(folder, model, optimizer):
    """Restores AdamW's moments and step count from the folder."""
    path = os.path.join(folder, OPTIMIZER)
    meta = metadata_of(path)
    t = int(meta.get("adamw_step", meta.get("step", 0)))
    with safe_open(path, framework="pt") as f:
        stored = set(f.keys())
        for i, name in enumerate(model.names):
            p = model.tensor(name)
            for key in (f"m.{i}", f"v.{i}"):
                if key not in stored or f.get_slice(key).get_shape() != [p.numel()]:
                    raise RunFolderError(f"{path}: no moment {key} of {p.numel()} values for {name}: the "
                                         "optimizer state is another model's; start a new run with --init")
            if not p.requires_grad:
                continue
            optimizer.state[p] = {
                "step": torch.tensor(float(t)),
                "exp_avg": f.get_tensor(f"m.{i}").to(p.device, torch.float32).reshape(p.shape),
                "exp_avg_sq": f.get_tensor(f"v.{i}").to(p.device, torch.float32).reshape(p.shape),
            }


def recover(folder):
    """The saved position (step, epoch), after finishing an interrupted
    save and dropping the records written after it."""
    ck, opt = os.path.join(folder, CHECKPOINT), os.path.join(folder, OPTIMIZER)
    if not os.path.isfile(opt):
        raise RunFolderError(f"{folder}: no saved state to resume from (it needs {CHECKPOINT} and {OPTIMIZER})")
    position = position_of(opt)
    at = lambda p: os.path.isfile(p) and position_of(p) == position
    if not at(ck):
        if not at(ck + ".next"):
            raise RunFolderError(f"{folder}: the optimizer is at step {position[0]} but no checkpoint "
                                 "of that step is there; start a new run")
        os.replace(ck + ".next", ck)
    for leftover in (ck + ".next", opt + ".next"):
        if os.path.exists(leftover):
            os.remove(leftover)
    for name in (LOG, SAMPLES, METRICS):
        truncate_records(os.path.join(folder, name), position[0])
    return position


def has_metrics_at(folder, step):
    """Whether the metrics records hold one of step `step`."""
    return any(r.get("step") == step for r in read_records(os.path.join(folder, METRICS)))


def drop_validation_at(folder, step):
    """Removes the samples and metrics records of step `step` (what a
    validation cut short left, before it runs again), keeping every other
    line as written."""
    for name in (SAMPLES, METRICS):
        keep_lines(os.path.join(folder, name), lambda record: record.get("step") != step)


def read_records(path):
    """The whole records of a JSON-lines file (none where it is absent)."""
    return [record for _, record in complete_lines(path)]


def complete_lines(path):
    """(line, record) for each whole line of a JSON-lines file that reads
    as JSON."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text[: text.rfind("\n") + 1].splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append((line, record))
    return out


def keep_lines(path, keep):
    """Rewrites `path` (atomically, where anything changes) with the whole
    lines whose record `keep` accepts."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        before = f.read()
    kept = "".join(line for line, record in complete_lines(path) if keep(record))
    if kept.encode("utf-8") != before:
        write_text_atomic(path, kept)


def truncate_records(path, step):
    """Keeps the complete records written at or before `step`."""
    keep_lines(path, lambda record: isinstance(record.get("step"), int) and record["step"] <= step)
