"""Trains a captune captioner under PyTorch DistributedDataParallel and
writes captune's run-folder format from process 0.

    torchrun --nproc_per_node 8 -m captune_torch.train --init RUN --out RUN2 [--epochs N]
    torchrun --nproc_per_node 8 -m captune_torch.train --resume --out RUN2 [--epochs N]
    python -m captune_torch.train ...      # one process, no torchrun

`--init` takes a captune run folder (its checkpoint and config.toml) or a
checkpoint with `--config FILE`, and starts a new run with fresh AdamW
state, as `captune train --init` does. `--resume` continues a run folder,
whichever of captune or this package wrote it; `--epochs N` on resume
trains N more. A step takes `[train] batch` images in all, split evenly
among the processes; the loss is normalised by the whole batch's tokens
(or samples), so N processes take the step one process would take on the
same batch.
"""

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import objectives
from .checkpoint import CheckpointError, load_checkpoint
from .config import ConfigError, check_train, read_config, write_config
from .data import Corpus, DataError, Vocabulary, epoch_order, load_features, mixed_seed
from .model import Captioner, is_adapter
from .optim import adamw, clip, warmup_cosine
from .run_folder import (CHECKPOINT, CONFIG, LOG, RunFolderError, append_record, drop_validation_at,
                         has_metrics_at, holds_a_run, load_optimizer, recover, save_state,
                         write_text_atomic)

ERRORS = (CheckpointError, ConfigError, DataError, RunFolderError)


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
                   help="train the mapper (an LSTM's image projection) only ([train] freeze_decoder = true)")
    p.add_argument("--data", help="karpathy:PATH or coco:PATH (default: the run's)")
    p.add_argument("--images", help="the data set's image folder (default: the run's, or `images` beside it)")
    p.add_argument("--features", help="the image embeddings (default: the run's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--captune", help="the captune binary that validates each epoch's state into "
                                     "samples.jsonl and metrics.jsonl (default: captune on PATH; "
                                     "'none' skips validation)")
    p.add_argument("--captune-device", default="auto", choices=["auto", "gpu", "cpu"],
                   help="what captune validates on")
    return p.parse_args(argv)


class Distributed:
    """This process's place among torchrun's (one process without it)."""

    def __init__(self, device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.lead = self.rank == 0
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
        """The sum over the processes of a tensor on this one's device."""
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def first(self, work):
        """`work()` on process 0, its answer (or its error) on every
        process, so that all go on or all stop."""
        answer = [None]
        if self.lead:
            try:
                answer = [("ok", work())]
            except ERRORS as e:
                answer = [("error", str(e))]
        if self.world > 1:
            dist.broadcast_object_list(answer, src=0)
        kind, value = answer[0]
        if kind == "error":
            raise RunFolderError(value) if self.lead else Stopped()
        return value

    def leave(self, code):
        """Ends this process with `code`. Among several processes, a
        finished run leaves the group together with the others (gloo
        aborts a process that tears its group down while another still
        talks), and every process ends without the interpreter's teardown:
        gloo's threads can outlive it and abort the process ("terminate
        called without an active exception") after its work is saved."""
        if self.world == 1:
            sys.exit(code)
        if code == 0:
            dist.barrier()
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Stopped(Exception):
    """Process 0 failed and says why; the others stop quietly."""


def main(argv=None):
    args = arguments(argv)
    ranks = Distributed(args.device)
    try:
        run(args, ranks)
    except ERRORS as e:
        if ranks.lead:
            print(f"error: {e}", file=sys.stderr)
        ranks.leave(2)
    except Stopped:
        ranks.leave(2)
    ranks.leave(0)


def starting_point(args):
    """The checkpoint file and the config the run starts from."""
    if args.resume:
        if not os.path.isdir(args.out):
            raise RunFolderError(f"{args.out}: no such run folder to resume")
        missing = "the folder was not written by captune train or captune_torch"
        return os.path.join(args.out, CHECKPOINT), read_config(os.path.join(args.out, CONFIG), missing)
    source = args.init
    if os.path.isdir(source):
        config = args.config or os.path.join(source, CONFIG)
        return os.path.join(source, CHECKPOINT), read_config(config, "give --config FILE (a run's config.toml)")
    if not args.config:
        raise ConfigError(f"--init {source}: a checkpoint file needs --config FILE (a run's config.toml); "
                          "or give its run folder")
    return source, read_config(args.config, "give a run's config.toml")


def apply_overrides(args, config):
    """The command line's changes to the config's [train] table."""
    train = config.setdefault("train", {})
    for key, value in (("objective", args.objective), ("lr", args.lr), ("first_token", args.first_token),
                       ("mle_weight", args.mle_weight)):
        if value is not None:
            train[key] = value
    if args.freeze_decoder:
        train["freeze_decoder"] = True
    if args.batch is not None:
        if args.resume and args.batch != train.get("batch"):
            raise ConfigError(f"--batch {args.batch}: a resumed run keeps its batch of {train.get('batch')}; "
                              "start a new run with --init instead")
        train["batch"] = args.batch
    if args.epochs is not None and args.epochs <= 0:
        raise ConfigError(f"--epochs {args.epochs}: a whole number of epochs above 0")
    if train.get("labelled", 1.0) != 1.0:
        raise ConfigError(f"[train] labelled = {train['labelled']}: captune_torch trains on every training "
                          "image's captions; train a labelled fraction with captune")


def feature_record(args, config, checkpoint_metadata):
    """The run's data and features as captune records them ([features] and
    the checkpoint's `features` metadata): the config's or checkpoint's
    record with the command line's paths, absolute."""
    record = dict(config.get("features") or json.loads(checkpoint_metadata.get("features", "{}")))
    for key, value in (("data", args.data), ("features", args.features), ("images", args.images)):
        if value:
            record[key] = value
    if "data" not in record or "features" not in record:
        raise ConfigError("the run names no data set or features file ([features] data and features in "
                          "config.toml); give --data and --features")
    kind, _, path = record["data"].partition(":")
    record["data"] = f"{kind}:{os.path.abspath(path)}" if path else record["data"]
    for key in ("features", "images"):
        if key in record:
            record[key] = os.path.abspath(record[key])
    return record


def with_features(record, features, config, path):
    """`record` with the features file's dimension and encoder, refused
    where they are not what the captioner was trained on."""
    dim = config["embed_dim"]
    if features.dim != dim:
        raise DataError(f"{record['features']}: {features.dim}-dimensional embeddings, but {path} reads "
                        f"{dim}-dimensional ones; use the captioner's own features")
    was = record.get("encoder")
    if was and features.encoder and was != features.encoder:
        raise DataError(f"{record['features']} was made by {features.encoder}, but the captioner was trained "
                        f"on embeddings by {was}; use features from the same encoder")
    out = {k: record[k] for k in ("data", "images") if k in record}
    out.update(dim=dim, features=record["features"])
    if features.encoder or was:
        out["encoder"] = features.encoder or was
    return out


@dataclass
class StepContext:
    """What a step's objective needs beside the batch: the device, the
    seed of its samples, where this process's share starts, and whether
    the step logs."""

    device: torch.device
    seed: int
    first_image: int
    monitor: bool


def validator(args):
    """The captune command that validates the run's saved state, or None
    where validation is off or (with a note) where there is no captune."""
    if args.captune == "none":
        return None
    found = shutil.which(args.captune or "captune")
    if not found:
        if args.captune:
            raise ConfigError(f"--captune {args.captune}: no such program; give the captune binary's path "
                              "or --captune none")
        print("note: no captune binary on PATH (give --captune PATH): the run's log and state are written, "
              "its samples.jsonl and metrics.jsonl are not", file=sys.stderr)
        return None
    return [found, "--device", args.captune_device, "train", "--resume", "--out", args.out, "--validate-only"]


def validate(command):
    """Appends the saved state's samples and metrics records, as captune's
    epoch end writes them."""
    if command:
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            raise RunFolderError(f"{' '.join(command)} failed:\n{out.stderr.strip()}")


def run(args, ranks):
    checkpoint_path, config = starting_point(args)
    apply_overrides(args, config)
    t = config["train"]
    check_train(t, args.out if args.resume else (args.config or args.init))
    if t["batch"] % ranks.world:
        raise ConfigError(f"[train] batch {t['batch']} does not split evenly among {ranks.world} processes; "
                          f"choose a multiple of {ranks.world}")
    validation = ranks.first(lambda: validator(args))

    if args.resume:
        step, epoch = ranks.first(lambda: recover(args.out))
        if args.epochs is not None:
            t["epochs"] = epoch + args.epochs
    else:
        ranks.first(lambda: refuse_a_run_in(args.out))
        step, epoch = 0, 0
        if args.epochs is not None:
            t["epochs"] = args.epochs
    ck = load_checkpoint(checkpoint_path)
    Captioner.check(ck.config, ck.tensors, checkpoint_path)
    record = feature_record(args, config, ck.metadata)
    features = load_features(record["features"])
    config["features"] = with_features(record, features, ck.config, checkpoint_path)
    vocab = Vocabulary(ck.metadata, ck.config)
    corpus = Corpus(config["features"], features, vocab)
    objective = objectives.find(t["objective"], t, vocab, corpus)
    batch, world = t["batch"], ranks.world
    if len(corpus) < batch:
        raise ConfigError(f"{len(corpus)} training images, fewer than one batch of {batch}; lower [train] batch")
    if ranks.lead and corpus.missing_images:
        print(f"note: {corpus.missing_images} entries of {config['features']['data']} have no image there and "
              "are left out, as captune leaves them out", file=sys.stderr)
    per_epoch = len(corpus) // batch
    total = per_epoch * t["epochs"]

    model = Captioner(ck.config, ck.tensors).to(ranks.device)
    if t.get("freeze_decoder", False):
        # ClipCap's prefix-only mode: the decoder stays as it is (no
        # update, no decay, no part in the norm) while the loss's gradient
        # still flows through it to the prefix.
        for name in model.names:
            model.tensor(name).requires_grad_(is_adapter(ck.config, name))
    opt = adamw(model, t["lr"], t["weight_decay"])
    if args.resume:
        load_optimizer(args.out, model, opt)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    metadata = {k: v for k, v in ck.metadata.items() if k not in ("step", "epoch")}

    def save():
        metadata["features"] = json_of(config["features"])
        save_state(args.out, model, opt, metadata, step, epoch, fresh_objective_state(t["objective"]))

    def start():
        os.makedirs(args.out, exist_ok=True)
        write_text_atomic(os.path.join(args.out, CONFIG), write_config(config))
        if not args.resume:
            save()
        # The state's records, where a validation is owed: a run's start
        # (the "before" point of a run from a checkpoint), or one cut short.
        if validation and not has_metrics_at(args.out, step):
            drop_validation_at(args.out, step)
            validate(validation)

    ranks.first(start)
    since, tokens_since = time.time(), 0
    while step < total:
        order = epoch_order(corpus, t["seed"], epoch)[: per_epoch * batch]
        mean_tokens = corpus.tokens(order) / len(order)
        for b in range(step - epoch * per_epoch, per_epoch):
            pairs = order[b * batch:(b + 1) * batch]
            share = slice(ranks.rank * batch // world, (ranks.rank + 1) * batch // world)
            logs = (step + 1) % t["log_every"] == 0 or step + 1 == total
            context = StepContext(ranks.device, mixed_seed(t["seed"], step), share.start, logs)
            lr = warmup_cosine(t["lr"], t["warmup"], step, total)
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
            tokens_since += corpus.tokens(pairs)
            if logs:
                # Only a logged step reads anything back, and is checked
                # for NaN, as captune's are.
                local = torch.stack([sums[n].detach().double().to(ranks.device) for n in objective.reports])
                totals = ranks.sum(local).tolist()
                reported = objective.report(dict(zip(objective.reports, totals)), per_batch)
                grad_norm = float(norm)
                if not all(map(math.isfinite, [grad_norm, *reported.values()])):
                    raise RunFolderError(
                        f"the loss became NaN or infinite at step {step}; {args.out} keeps its last saved state "
                        f"(epoch {epoch}): resume at a tenth of the rate with `torchrun ... -m "
                        f"captune_torch.train --resume --out {args.out} --lr {t['lr'] / 10:g}`")
            opt.step()
            if logs and ranks.lead:
                now = time.time()
                append_record(args.out, LOG, {
                    "step": step, "epoch": epoch + 1, "objective": objective.describe(), **reported,
                    "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens_since / max(now - since, 1e-9)})
                since, tokens_since = now, 0
        epoch += 1

        def end_epoch():
            save()
            validate(validation)

        ranks.first(end_epoch)
        # Saving and validating take no part in the speed.
        since, tokens_since = time.time(), 0
    if ranks.lead:
        print(f"run folder: {args.out} (step {step}, epoch {epoch}, {world} process{'es' if world > 1 else ''})")


def refuse_a_run_in(folder):
    if holds_a_run(folder):
        raise RunFolderError(f"{folder} already holds a run; --resume continues it (or choose another --out)")


def fresh_objective_state(objective):
    """What captune's state records of an objective that carries nothing
    from step to step, with a collapse guard that has seen no log line."""
    return {"objective": objective, "values": [], "guard": {"first": None, "streak": 0, "since": 0}}


def json_of(record):
    return json.dumps(record, separators=(",", ":"))


if __name__ == "__main__":
    main()
