"""What the package reads, and what it says about input it cannot use:
COCO captions files (split from the file name, images in file order),
and errors that name the file, the field and what to do."""

import json
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import save_file

from captune_torch.checkpoint import CheckpointError, load_checkpoint
from captune_torch.data import DataError, load_coco, load_data, load_features, load_karpathy
from captune_torch.objectives import TokenObjective

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


class Inputs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def test_coco_captions_files(self):
        doc = {"images": [{"id": 7, "file_name": "a.jpg"}, {"id": 3, "file_name": "b.jpg"},
                          {"id": 9, "file_name": "c.jpg"}],
               "annotations": [{"image_id": 3, "caption": "A Dog, running."},
                               {"image_id": 7, "caption": "Two cats"}, {"image_id": 3, "caption": "..."},
                               {"image_id": 7, "caption": "a cat's toy"}]}
        path = self.path / "captions_val2014.json"
        path.write_text(json.dumps(doc))
        images = self.path / "images"
        images.mkdir()
        for name in ("a.jpg", "b.jpg"):  # c.jpg is missing: captune leaves it out
            (images / name).write_bytes(b"")
        items, missing = load_coco(str(path), str(images))
        self.assertEqual(missing, 1)
        self.assertEqual([(i.id, i.split) for i in items], [("7", "val"), ("3", "val")])
        self.assertEqual(items[0].captions, [["two", "cats"], ["a", "cat", "'s", "toy"]])
        self.assertEqual(items[1].captions, [["a", "dog", "running"]])
        self.assertEqual([i.id for i in load_data(f"coco:{path}", str(images))[0]], ["7", "3"])
        with self.assertRaisesRegex(DataError, "pass the image folder with --images"):
            load_coco(str(path))
        unnamed = self.path / "captions.json"
        unnamed.write_text(json.dumps(doc))
        with self.assertRaisesRegex(DataError, "cannot tell the split from the file name"):
            load_coco(str(unnamed), str(images))

    def test_karpathy_files(self):
        """Ids as captune reads them (cocoid, else imgid, else the file
        name; a null id counts as none), images looked for under an
        entry's filepath, entries without their image left out."""
        doc = {"images": [
            {"filename": "a.jpg", "filepath": "train2014", "cocoid": 5, "split": "train",
             "sentences": [{"raw": "A dog."}]},
            {"filename": "b.jpg", "cocoid": None, "imgid": 8, "split": "restval", "sentences": [{"raw": "b"}]},
            {"filename": "c.jpg", "split": "val", "sentences": [{"raw": "c"}]},
            {"filename": "gone.jpg", "imgid": 9, "split": "test", "sentences": [{"raw": "d"}]},
            {"filename": "a.jpg", "imgid": 10, "split": "unknown", "sentences": [{"raw": "e"}]}]}
        path = self.path / "dataset.json"
        path.write_text(json.dumps(doc))
        (self.path / "images" / "train2014").mkdir(parents=True)
        (self.path / "images" / "train2014" / "a.jpg").write_bytes(b"")
        for name in ("b.jpg", "c.jpg"):
            (self.path / "images" / name).write_bytes(b"")
        items, missing = load_karpathy(str(path))
        self.assertEqual([(i.id, i.split) for i in items], [("5", "train"), ("8", "train"), ("c.jpg", "val")])
        self.assertEqual(items[0].captions, [["a", "dog"]])
        self.assertEqual(missing, 1)
        elsewhere, missing = load_karpathy(str(path), str(self.path))
        self.assertEqual((elsewhere, missing), ([], 4))

    def test_errors_name_the_file_and_what_to_do(self):
        with self.assertRaisesRegex(CheckpointError, "'captune retriever', not 'captune captioner'"):
            load_checkpoint(DATA / "golden_retriever.safetensors")
        with self.assertRaisesRegex(CheckpointError, "no such file"):
            load_checkpoint(self.path / "missing.safetensors")
        blip = self.path / "blip.safetensors"
        save_file({"head.bias": torch.zeros(3)}, str(blip), metadata={
            "format": "captune captioner", "captioner_config": '{"family": "blip"}'})
        with self.assertRaisesRegex(CheckpointError, "blip.safetensors: a blip captioner; .*captune train"):
            load_checkpoint(blip)
        updown = self.path / "updown.safetensors"
        save_file({"logit.bias": torch.zeros(3)}, str(updown), metadata={
            "format": "captune captioner", "captioner_config": '{"family": "lstm", "lstm": {"model": "updown"}}'})
        with self.assertRaisesRegex(CheckpointError, "updown.safetensors: a lstm:updown captioner; .*captune train"):
            load_checkpoint(updown)
        converted = self.path / "fc-sc.safetensors"
        save_file({"logit.bias": torch.zeros(3)}, str(converted), metadata={
            "format": "captune captioner",
            "captioner_config": '{"family": "lstm", "lstm": {"model": "fc", "variant": "self-critical"}}'})
        with self.assertRaisesRegex(CheckpointError, "fc-sc.safetensors: .*self-critical.pytorch's variant.*captune train"):
            load_checkpoint(converted)
        clipcap = self.path / "clipcap.safetensors"
        save_file({"mapper.fc1.bias": torch.zeros(3)}, str(clipcap), metadata={
            "format": "captune captioner",
            "captioner_config": '{"prefix_predicts_first": true, "raw_embeddings": true}'})
        with self.assertRaisesRegex(CheckpointError, "clipcap.safetensors: .*ClipCap's own layout"):
            load_checkpoint(clipcap)
        bad = self.path / "dataset.json"
        bad.write_text('{"images": [\n  {"split": "train",}\n]}')
        with self.assertRaisesRegex(DataError, r"dataset.json: malformed JSON at line 2 column"):
            load_karpathy(str(bad))
        bad.write_text('{"annotations": []}')
        with self.assertRaisesRegex(DataError, "not a Karpathy split file"):
            load_karpathy(str(bad))
        with self.assertRaisesRegex(DataError, "shapes"):
            load_data("shapes")
        features = self.path / "features.safetensors"
        save_file({"embeddings": torch.ones(2, 3)}, str(features), metadata={"image_ids": '["a"]'})
        with self.assertRaisesRegex(DataError, "1 image_ids for 2 embeddings"):
            load_features(features)
        save_file({"embeddings": torch.zeros(1, 3)}, str(features), metadata={"image_ids": '["a"]'})
        with self.assertRaisesRegex(DataError, "image a .row 0. is zero"):
            load_features(features)
        with self.assertRaisesRegex(ValueError, "not supported by captune_torch; it trains mle, smile, scst"):
            TokenObjective("discritune", {}, {})
