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
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from . import objectives
from .checkpoint import CheckpointError, load_checkpoint
from .config import read_config, write_config
from .data import DataError, Vocabulary, load_data, load_features
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
    p.add_argument("--data", help="karpathy:PATH or coco:PATH (default: the run's)")
    p.add_argument("--features", help="the image embeddings (default: the run's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
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
            dist.init_process_group("nccl" if cuda else "gloo")

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


class Corpus:
    """The training images that have an embedding: their embeddings and
    their captions' ids."""

    def __init__(self, config, vocab):
        f = config["features"]
        items = [i for i in load_data(f["data"]) if i.split == "train"]
        embeddings = load_features(f["features"])
        kept = [i for i in items if i.id in embeddings]
        if not kept:
            raise DataError(f"{f['features']}: no embedding of any training image of {f['data']}; "
                            "the features file is not this data set's")
        self.features = torch.stack([embeddings[i.id] for i in kept])
        self.captions = [[vocab.encode(c) for c in i.captions] for i in kept]

    def __len__(self):
        return len(self.captions)


def epoch_order(corpus, seed, epoch):
    """The epoch's (image, reference) pairs: a permutation of the images,
    one reference drawn for each; the same on every process."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2 ** 63))
    images = torch.randperm(len(corpus), generator=g).tolist()
    return [(i, int(torch.randint(len(corpus.captions[i]), (1,), generator=g))) for i in images]


def tensors_of(corpus, pairs, device, pad):
    """Features, inputs `<bos> w..` and targets `w.. <eos>`, padded with `pad`."""
    ids = [corpus.captions[i][r] for i, r in pairs]
    width = max(len(c) for c in ids) - 1
    inputs = torch.full((len(ids), width), pad, dtype=torch.long)
    targets = torch.full((len(ids), width), pad, dtype=torch.long)
    for row, c in enumerate(ids):
        inputs[row, : len(c) - 1] = torch.tensor(c[:-1])
        targets[row, : len(c) - 1] = torch.tensor(c[1:])
    features = corpus.features[[i for i, _ in pairs]]
    return features.to(device), inputs.to(device), targets.to(device)


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
    objective = objectives.TokenObjective(t.get("objective", "mle"), t, vocab.alternatives)
    corpus = Corpus(config, vocab)
    batch, world = t["batch"], ranks.world
    if batch % world:
        fail(f"[train] batch {batch} does not split evenly among {world} processes; choose a multiple of {world}")
    if len(corpus) < batch:
        fail(f"{len(corpus)} training images, fewer than one batch of {batch}; lower [train] batch")
    per_epoch = len(corpus) // batch
    total = per_epoch * t["epochs"]

    model = Captioner(ck.config, ck.tensors).to(ranks.device)
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
    log_every = max(t.get("log_every", 50), 1)
    since, tokens_since = time.time(), 0
    while step < total:
        order = epoch_order(corpus, t.get("seed", 0), epoch)
        mean_tokens = sum(len(corpus.captions[i][r]) - 1 for i, r in order) / len(order)
        for b in range(step - epoch * per_epoch, per_epoch):
            pairs = order[b * batch:(b + 1) * batch]
            tokens = sum(len(corpus.captions[i][r]) - 1 for i, r in pairs)
            mine = pairs[ranks.rank * batch // world:(ranks.rank + 1) * batch // world]
            features, inputs, targets = tensors_of(corpus, mine, ranks.device, model.pad)
            lr = warmup_cosine(t["lr"], t.get("warmup", 0), step, total)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            sums = objective(ddp, features, inputs, targets)
            # DDP averages the processes' gradients: each process's share of
            # the batch's summed loss, times the processes, over the batch's
            # tokens, gives the whole batch's mean. Captions' tokens weigh
            # what they would in an average batch (captune's rule).
            weight = tokens / (batch * mean_tokens)
            (sums["loss"] * (world * weight / tokens)).backward()
            norm = clip(model)
            step += 1
            tokens_since += tokens
            logs = step % log_every == 0 or step == total
            reported = {}
            if logs:
                names = ("loss", "mle", "smile")
                totals = ranks.sum(torch.stack([sums[n].detach().double() for n in names]))
                reported = {n: float(v) / tokens for n, v in zip(names, totals)}
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
        if ranks.world > 1:
            dist.barrier()
    if lead:
        print(f"run folder: {args.out} (step {step}, epoch {epoch}, {world} process{'es' if world > 1 else ''})")


if __name__ == "__main__":
    main()
