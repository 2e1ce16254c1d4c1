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
        items = load_coco(str(path))
        self.assertEqual([(i.id, i.split) for i in items], [("7", "val"), ("3", "val")])
        self.assertEqual(items[0].captions, [["two", "cats"], ["a", "cat", "'s", "toy"]])
        self.assertEqual(items[1].captions, [["a", "dog", "running"]])
        self.assertEqual([i.id for i in load_data(f"coco:{path}")], ["7", "3"])
        unnamed = self.path / "captions.json"
        unnamed.write_text(json.dumps(doc))
        with self.assertRaisesRegex(DataError, "cannot tell the split from the file name"):
            load_coco(str(unnamed))

    def test_errors_name_the_file_and_what_to_do(self):
        with self.assertRaisesRegex(CheckpointError, "'captune retriever', not 'captune captioner'"):
            load_checkpoint(DATA / "golden_retriever.safetensors")
        with self.assertRaisesRegex(CheckpointError, "no such file"):
            load_checkpoint(self.path / "missing.safetensors")
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
