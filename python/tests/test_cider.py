"""CIDEr-D with the training statistics against pycocoevalcap's (the
values of tests/data/cider_reward_flickr8k.json, from
scripts/cider_reward_reference.py): three candidates for each of the first
12 training images of Flickr8k, every training image's references taking
part. Needs $CAPTUNE_FLICKR8K (the folder with dataset_flickr8k.json)."""

import json
import os
import unittest
from pathlib import Path

from captune_torch.cider import CiderD

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
FLICKR8K = os.environ.get("CAPTUNE_FLICKR8K", "")


@unittest.skipUnless(FLICKR8K and Path(FLICKR8K, "dataset_flickr8k.json").is_file(),
                     "CAPTUNE_FLICKR8K is not set (a folder holding dataset_flickr8k.json)")
class Cider(unittest.TestCase):
    def test_rewards_equal_pycocoevalcap_with_the_training_statistics(self):
        doc = json.loads(Path(FLICKR8K, "dataset_flickr8k.json").read_text())
        train = [i for i in doc["images"] if i["split"] == "train"]
        want = json.loads((DATA / "cider_reward_flickr8k.json").read_text())
        self.assertEqual(len(train), want["training_images"])
        cider = CiderD([[s["tokens"] for s in image["sentences"]] for image in train])
        for group in want["sets"]:
            for i, (candidate, value) in enumerate(zip(group["candidates"], group["cider_d"])):
                got = cider.score(i, candidate.split())
                self.assertLess(abs(got - value), 1e-9 * max(1.0, abs(value)), (group["name"], i, got, value))
