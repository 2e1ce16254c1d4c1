"""A run's data, read as captune reads it: a Karpathy split file
(`karpathy:PATH`) or a COCO captions file (`coco:PATH`), its captions
PTB-tokenised and encoded with the checkpoint's vocabulary, and the image
embeddings of a features file (`embeddings` [n, dim], metadata
`image_ids`), L2-normalised. Images without an embedding are left out;
captions without a token are skipped."""

import json
import os
from dataclasses import dataclass

import torch
from safetensors import safe_open

from .tokenize import ptb_tokenize

PAD, BOS, EOS, UNK = 0, 1, 2, 3


class DataError(ValueError):
    """Data this package cannot read; the message names the file and the
    field, and what to do."""


@dataclass
class Item:
    id: str
    split: str  # train, val or test
    captions: list  # each a list of PTB tokens


def split_of(name):
    return {"train": "train", "restval": "train", "val": "val", "test": "test"}.get(name)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; the run's [features] data names it (copy the data "
                        "there, or give --data)")
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}; fix or re-download the file")


def id_text(v):
    return v if isinstance(v, str) else json.dumps(v)


def tokenised(raws):
    """The PTB tokens of each raw caption; a caption with none is skipped,
    as captune skips it."""
    return [tokens for tokens in map(ptb_tokenize, raws) if tokens]


def karpathy_image(folder, filepath, filename):
    """Where an entry's image is, as captune looks: under `filepath` when
    the entry has one and the image is there, else in the folder."""
    if filepath:
        nested = os.path.join(folder, filepath, filename)
        if os.path.isfile(nested):
            return nested
    return os.path.join(folder, filename)


def load_karpathy(path, images=None):
    """A Karpathy split file. As captune trains on it, an entry counts only
    where its image is in `images` (default: the `images` folder beside the
    file); returns the items and how many entries were skipped for a
    missing image."""
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise DataError(f'{path}: no "images" array: this is not a Karpathy split file '
                        "(for COCO annotation files use coco:PATH)")
    folder = images or os.path.join(os.path.dirname(os.path.abspath(path)), "images")
    items, missing = [], 0
    for entry in doc["images"]:
        filename = entry.get("filename")
        split = split_of(entry.get("split"))
        if not isinstance(filename, str) or split is None:
            continue
        ident = entry.get("cocoid")
        if ident is None:
            ident = entry.get("imgid")
        ident = filename if ident is None else id_text(ident)
        if not os.path.isfile(karpathy_image(folder, entry.get("filepath"), filename)):
            missing += 1
            continue
        captions = tokenised(s.get("raw", "") for s in entry.get("sentences", []))
        if captions:
            items.append(Item(ident, split, captions))
    return items, missing


def load_coco(path, images=None):
    """A COCO captions file, its split read from its name as captune reads
    it (captions_train2014.json: train), with its images in `images`
    (needed, as captune needs them); returns the items and how many
    images were missing."""
    name = os.path.basename(path).lower()
    split = next((s for s in ("train", "val", "test") if s in name), None)
    if split is None:
        raise DataError(f"{path}: cannot tell the split from the file name (it should contain train, "
                        "val or test, as captions_train2014.json does); rename the file")
    if images is None:
        raise DataError(f"coco:{path}: pass the image folder with --images")
    doc = read_json(path)
    for key in ("annotations", "images"):
        if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
            raise DataError(f"{path}: no {key!r} array: this is not a COCO caption annotation file")
    by_image = {}
    for a in doc["annotations"]:
        by_image.setdefault(a.get("image_id"), []).append(a.get("caption", ""))
    items, missing = [], 0
    for image in doc["images"]:
        if not os.path.isfile(os.path.join(images, str(image.get("file_name")))):
            missing += 1
            continue
        captions = tokenised(by_image.get(image.get("id"), []))
        if captions:
            items.append(Item(str(image["id"]), split, captions))
    return items, missing


def load_data(source, images=None):
    """`karpathy:PATH` or `coco:PATH`: the items whose images are there,
    and how many were not."""
    kind, _, path = source.partition(":")
    if kind == "karpathy":
        return load_karpathy(path, images)
    if kind == "coco":
        return load_coco(path, images)
    raise DataError(f"data source {source!r}: captune_torch reads karpathy:PATH and coco:PATH "
                    "(embed the shapes world's images into a features file and give its "
                    "dataset_shapes.json as karpathy:PATH)")


@dataclass
class Features:
    """A features file: each image's L2-normalised embedding by id, and
    the encoder that made them when the file says."""

    embeddings: dict
    dim: int
    encoder: str = None


def load_features(path):
    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
            embeddings = f.get_tensor("embeddings").to(torch.float32)
    except FileNotFoundError:
        raise DataError(f"{path}: no such features file; the run's [features] features names it (or give --features)")
    except Exception as e:
        raise DataError(f"{path}: not a features file ({e}); it needs a tensor `embeddings` and metadata `image_ids`")
    try:
        ids = json.loads(meta["image_ids"])
    except (KeyError, json.JSONDecodeError):
        raise DataError(f"{path}: metadata image_ids is missing or not a JSON list of strings")
    if embeddings.dim() != 2:
        raise DataError(f"{path}: embeddings have shape {list(embeddings.shape)}; expected [N, D]")
    if len(ids) != embeddings.shape[0]:
        raise DataError(f"{path}: {len(ids)} image_ids for {embeddings.shape[0]} embeddings")
    norms = embeddings.double().norm(dim=1)
    bad = (~torch.isfinite(norms)) | (norms == 0)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise DataError(f"{path}: embedding of image {ids[row]} (row {row}) is zero or not finite")
    # Rows already of unit length stay as they are, as captune keeps them.
    scale = torch.where((norms - 1).abs() > 1e-6, norms, torch.ones_like(norms))
    embeddings = (embeddings.double() / scale[:, None]).to(torch.float32)
    encoder = meta.get("encoder_id", meta.get("encoder"))
    return Features({i: embeddings[r] for r, i in enumerate(ids)}, embeddings.shape[1], encoder)


class Vocabulary:
    """The checkpoint's: a word list (`vocab` metadata, after the four
    specials) or a GPT-2 tokenizer (`tokenizer` metadata)."""

    def __init__(self, metadata, config):
        self.max_len = config["max_len"]
        if "vocab" in metadata:
            words = json.loads(metadata["vocab"])
            self.words = ["<pad>", "<bos>", "<eos>", "<unk>"] + words
            self.index = {w: 4 + i for i, w in enumerate(words)}
            self.tokenizer = None
            # Each word's reserved first-token alternative, `##word`.
            self.alternatives = {self.index[w[2:]]: i for w, i in self.index.items()
                                 if w.startswith("##") and w[2:] in self.index}
        elif "tokenizer" in metadata:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise DataError("this checkpoint's decoder came from a GPT-2: install the tokenizers "
                                "library (pip install 'captune-torch[gpt2]')")
            self.tokenizer = Tokenizer.from_str(metadata["tokenizer"])
            self.alternatives = {}
            self.end = config["specials"]["end"]
        else:
            raise DataError("the checkpoint has neither a vocab nor a tokenizer in its metadata")

    def words_of(self, ids):
        """A generated caption's words: its ids up to `<eos>`, read back
        (an alternative `##word` as the word; a GPT-2's pieces decoded and
        PTB-tokenised)."""
        end = EOS if self.tokenizer is None else self.end
        kept = []
        for i in ids:
            if i == end:
                break
            kept.append(int(i))
        if self.tokenizer is not None:
            return ptb_tokenize(self.tokenizer.decode(kept, skip_special_tokens=False))
        words = [self.words[i] if i < len(self.words) else "<unk>" for i in kept if i >= UNK]
        return [w[2:] if w.startswith("##") else w for w in words]

    def encode(self, tokens):
        """`<bos> ids <eos>`, truncated to fit max_len."""
        keep = self.max_len - 2
        if self.tokenizer is None:
            return [BOS] + [self.index.get(t, UNK) for t in tokens[:keep]] + [EOS]
        pieces = self.tokenizer.encode(" ".join(tokens), add_special_tokens=False).ids
        return [self.end] + pieces[:keep] + [self.end]


class Corpus:
    """The training images that have their image and an embedding: their
    embeddings, their captions' ids, and every reference's words (SCST's
    reward reads them)."""

    def __init__(self, record, features, vocab):
        items, self.missing_images = load_data(record["data"], record.get("images"))
        items = [i for i in items if i.split == "train"]
        kept = [i for i in items if i.id in features.embeddings]
        if not kept:
            why = (f"{record['data']} has no training image" if not items else
                   f"{record['features']} has no embedding of any training image of {record['data']}: "
                   "the features file is not this data set's")
            raise DataError(f"{why} (images found: {len(items)}, missing: {self.missing_images})")
        self.features = torch.stack([features.embeddings[i.id] for i in kept])
        self.captions = [[vocab.encode(c) for c in i.captions] for i in kept]
        self.references = [i.captions for i in kept]

    def __len__(self):
        return len(self.captions)

    def tokens(self, pairs):
        """The real target tokens of (image, reference) pairs."""
        return sum(len(self.captions[i][r]) - 1 for i, r in pairs)


def mixed_seed(seed, counter):
    """A seed of its own for each epoch (or step) of a run's seed."""
    return (seed * 1_000_003 + counter) % (2 ** 63)


def epoch_order(corpus, seed, epoch):
    """The epoch's (image, reference) pairs: a permutation of the images,
    one reference drawn for each; the same on every process."""
    g = torch.Generator().manual_seed(mixed_seed(seed, epoch))
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
