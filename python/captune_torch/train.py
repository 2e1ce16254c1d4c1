"""Trains a captune captioner under PyTorch DistributedDataParallel and
writes captune's run-folder format from rank 0.

    torchrun --nproc_per_node 8 -m captune_torch.train --init RUN --out RUN2 [--epochs N]
    torchrun --nproc_per_node 8 -m captune_torch.train --resume --out RUN2 [--epochs N]
    python -m captune_torch.train ...      # one process, no torchrun

`--init` takes a captune run folder (its checkpoint and config.toml) or a
checkpoint with `--config FILE`, and starts a new run with fresh AdamW
state, as `captune train --init` does. `--resume` continues a run folder,
whichever of captune or this package wrote it; `--epochs N` on resume
trains N more. A step takes `[train] batch` images in all, split evenly
among the processes; the loss is normalised by the whole batch's tokens,
so N processes take the step one process would take on the same batch.
"""

import argparse
import datetime
import shutil
import subprocess
from dataclasses import dataclass
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from . import objectives
from .checkpoint import CheckpointError, load_checkpoint
from .config import read_config, write_config
from .data import Corpus, DataError, Vocabulary, epoch_order
from .model import Captioner
from .optim import adamw, clip, warmup_cosine
from .run_folder import (CONFIG, LOG, RunFolderError, append_record, holds_a_run, load_optimizer,
                         recover, save_state, write_text_atomic)

# What an MLE run carries from step to step: nothing but the collapse
# guard's first look (captune's layout).
FRESH_OBJECTIVE_STATE = {"values": [], "guard": {
    "first": {"repetition": None, "no_entropy_at_full_length": False, "reward": None},
    "streak": 0, "since": 0}}


def arguments(argv=None):
    p = argparse.ArgumentParser(prog="captune_torch.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the run folder to write")
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--init", help="a captune run folder, or a checkpoint (with --config)")
    start.add_argument("--resume", action="store_true", help="continue the run folder --out")
    p.add_argument("--config", help="a run config (TOML) for --init with a checkpoint file")
    p.add_argument("--epochs", type=int, help="epochs to train (more epochs, with --resume)")
    p.add_argument("--lr", type=float, help="the peak learning rate")
    p.add_argument("--batch", type=int, help="images per step, over all processes")
    p.add_argument("--objective", help=f"one of: {', '.join(objectives.SUPPORTED)}")
    p.add_argument("--first-token", choices=["mle", "shift", "none"], help="SMILE's step 0")
    p.add_argument("--mle-weight", type=float, help="SMILE: the loss is L * MLE + (1 - L) * SMILE")
    p.add_argument("--freeze-decoder", action="store_true",
                   help="train the mapper only ([train] freeze_decoder = true)")
    p.add_argument("--data", help="karpathy:PATH or coco:PATH (default: the run's)")
    p.add_argument("--features", help="the image embeddings (default: the run's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--captune", default="captune",
                   help="the captune binary that validates each epoch's state into samples.jsonl and "
                        "metrics.jsonl (default: captune on PATH; 'none' skips validation)")
    p.add_argument("--captune-device", default="auto", choices=["auto", "gpu", "cpu"],
                   help="what captune validates on")
    return p.parse_args(argv)


class Distributed:
    """This process's place among torchrun's (one process without it)."""

    def __init__(self, device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        self.device = torch.device(f"cuda:{local}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        if self.world > 1:
            # The other processes wait at each epoch's end while the first
            # has captune validate the saved state.
            dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=2))

    def sum(self, x):
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def close(self):
        if self.world > 1:
            dist.destroy_process_group()


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def start_config(args):
    """The checkpoint and the config the run starts from."""
    if args.resume:
        folder = args.out
        if not os.path.isdir(folder):
            fail(f"{folder}: no such run folder to resume")
        return os.path.join(folder, "checkpoint.safetensors"), read_config(os.path.join(folder, CONFIG))
    source = args.init
    if os.path.isdir(source):
        return os.path.join(source, "checkpoint.safetensors"), read_config(args.config or os.path.join(source, CONFIG))
    if not args.config:
        fail(f"--init {source}: a checkpoint file needs --config FILE (a run's config.toml); or give its run folder")
    return source, read_config(args.config)


def apply_overrides(args, config, checkpoint_metadata):
    train = config.setdefault("train", {})
    if args.objective:
        train["objective"] = args.objective
    if args.freeze_decoder:
        train["freeze_decoder"] = True
    if args.first_token:
        train["first_token"] = args.first_token
    if args.mle_weight is not None:
        if not 0.0 <= args.mle_weight <= 1.0:
            fail(f"--mle-weight {args.mle_weight}: a weight between 0 and 1")
        train["mle_weight"] = args.mle_weight
    if args.lr is not None:
        train["lr"] = args.lr
    if args.batch is not None:
        if args.resume and args.batch != train.get("batch"):
            fail(f"--batch {args.batch}: a resumed run keeps its batch of {train.get('batch')}; "
                 "start a new run with --init instead")
        train["batch"] = args.batch
    features = config.setdefault("features", {})
    if not features and "features" in checkpoint_metadata:
        import json
        features.update(json.loads(checkpoint_metadata["features"]))
    if args.data:
        features["data"] = args.data
    if args.features:
        features["features"] = args.features
    if "data" not in features or "features" not in features:
        fail("the run names no data or features file ([features] data and features in config.toml); "
             "give --data and --features")
    return config


@dataclass
class StepContext:
    """What a step's objective needs beside the batch: the device, the
    seed of its samples, and where this process's share starts."""

    device: torch.device
    seed: int
    first_image: int


def validator(args):
    """The captune command that validates the run's saved state, or None
    (with a note) where there is no captune."""
    if args.captune == "none":
        return None
    found = shutil.which(args.captune)
    if not found:
        print(f"note: no captune binary ({args.captune!r} is not on PATH; give --captune PATH): the run's "
              "log and state are written, its samples.jsonl and metrics.jsonl are not", file=sys.stderr)
        return None
    return [found, "--device", args.captune_device, "train", "--resume", "--out", args.out, "--validate-only"]


def validate(command):
    """Appends the saved state's samples and metrics records, as captune's
    epoch end writes them."""
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{out.stderr.strip()}")


def main(argv=None):
    args = arguments(argv)
    ranks = Distributed(args.device)
    try:
        run(args, ranks)
    except (CheckpointError, DataError, RunFolderError, ValueError) as e:
        fail(str(e))
    finally:
        ranks.close()


def run(args, ranks):
    lead = ranks.rank == 0
    if not args.resume and holds_a_run(args.out):
        fail(f"{args.out} already holds a run; --resume continues it (or choose another --out)")
    checkpoint_path, config = start_config(args)
    ck = load_checkpoint(checkpoint_path)
    config = apply_overrides(args, config, ck.metadata)
    t = config["train"]
    step, epoch = 0, 0
    if args.resume:
        step, epoch = recover(args.out) if lead else (0, 0)
        position = ranks.sum(torch.tensor([step, epoch]) if lead else torch.zeros(2, dtype=torch.long))
        step, epoch = int(position[0]), int(position[1])
        ck = load_checkpoint(os.path.join(args.out, "checkpoint.safetensors"))
        if args.epochs is not None:
            t["epochs"] = epoch + args.epochs
    elif args.epochs is not None:
        t["epochs"] = args.epochs
    Captioner.check(ck.config, ck.tensors, checkpoint_path)
    vocab = Vocabulary(ck.metadata, ck.config)
    corpus = Corpus(config, vocab)
    objective = objectives.find(t.get("objective", "mle"), t, vocab, corpus)
    if t.get("labelled", 1.0) != 1.0:
        fail(f"[train] labelled = {t['labelled']}: captune_torch trains on every training image's "
             "captions; train a labelled fraction with captune")
    batch, world = t["batch"], ranks.world
    if batch % world:
        fail(f"[train] batch {batch} does not split evenly among {world} processes; choose a multiple of {world}")
    if len(corpus) < batch:
        fail(f"{len(corpus)} training images, fewer than one batch of {batch}; lower [train] batch")
    per_epoch = len(corpus) // batch
    total = per_epoch * t["epochs"]

    model = Captioner(ck.config, ck.tensors).to(ranks.device)
    if t.get("freeze_decoder", False):
        # ClipCap's prefix-only mode: the decoder stays as it is (no
        # update, no decay, no part in the norm) while the loss's gradient
        # still flows through it to the prefix.
        for name in model.names:
            model.tensor(name).requires_grad_(name.startswith("mapper."))
    opt = adamw(model, t["lr"], t.get("weight_decay", 0.01))
    if args.resume:
        load_optimizer(args.out, model, opt)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    metadata = {k: v for k, v in ck.metadata.items() if k not in ("step", "epoch")}
    if lead:
        os.makedirs(args.out, exist_ok=True)
        write_text_atomic(os.path.join(args.out, CONFIG), write_config(config))
        if not args.resume:
            save_state(args.out, model, opt, metadata, step, epoch, dict(FRESH_OBJECTIVE_STATE, objective=t["objective"]))
    validation = validator(args) if lead else None
    log_every = max(t.get("log_every", 50), 1)
    since, tokens_since = time.time(), 0
    while step < total:
        order = epoch_order(corpus, t.get("seed", 0), epoch)
        mean_tokens = sum(len(corpus.captions[i][r]) - 1 for i, r in order) / len(order)
        for b in range(step - epoch * per_epoch, per_epoch):
            pairs = order[b * batch:(b + 1) * batch]
            share = slice(ranks.rank * batch // world, (ranks.rank + 1) * batch // world)
            context = StepContext(ranks.device, (t.get("seed", 0) * 1_000_003 + step) % 2 ** 64, share.start)
            lr = warmup_cosine(t["lr"], t.get("warmup", 0), step, total)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            sums = objective.step(ddp, corpus, pairs[share], context)
            # DDP averages the processes' gradients: each process's share of
            # the batch's summed loss, times the processes, over the whole
            # batch's tokens (or samples), gives the whole batch's mean.
            per_batch = objective.per_batch(corpus, pairs)
            weight = objective.gradient_weight(corpus, pairs, batch, mean_tokens)
            (sums["loss"] * (world * weight / per_batch)).backward()
            norm = clip(model)
            step += 1
            tokens_since += sum(len(corpus.captions[i][r]) - 1 for i, r in pairs)
            logs = step % log_every == 0 or step == total
            reported = {}
            if logs:
                totals = ranks.sum(torch.stack([sums[n].detach().double().cpu() for n in objective.reports]).to(ranks.device))
                reported = objective.report(dict(zip(objective.reports, totals.tolist())), per_batch)
            if not math.isfinite(norm) or not all(map(math.isfinite, reported.values())):
                fail(f"the loss became NaN or infinite at step {step}; {args.out} keeps its last saved "
                     f"state (epoch {epoch}): resume at a tenth of the rate with "
                     f"`torchrun ... -m captune_torch.train --resume --out {args.out} --lr {t['lr'] / 10:g}`")
            opt.step()
            if logs and lead:
                now = time.time()
                append_record(args.out, LOG, {
                    "step": step, "epoch": epoch + 1, "objective": objective.describe(), **reported,
                    "lr": lr, "grad_norm": norm,
                    "tokens_per_s": tokens_since / max(now - since, 1e-9)})
                since, tokens_since = now, 0
        epoch += 1
        if lead:
            save_state(args.out, model, opt, metadata, step, epoch, dict(FRESH_OBJECTIVE_STATE, objective=t["objective"]))
            if validation:
                validate(validation)
        if ranks.world > 1:
            dist.barrier()
    if lead:
        print(f"run folder: {args.out} (step {step}, epoch {epoch}, {world} process{'es' if world > 1 else ''})")


if __name__ == "__main__":
    main()
