"""A run folder's life beyond one clean run: a validation cut short runs
again on resume and leaves one set of records; an error on process 0
(no state to resume, a folder that holds a run, features of another
dimension) stops every process with one message, never a hang; a
setting's number is named as captune names it."""

import json
import unittest

from captune_torch.objectives import rust_f32

from .world import World, captune, captune_binary, package


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class Names(unittest.TestCase):
    def test_numbers_print_as_rust_prints_an_f32(self):
        for value, text in ((0.0, "0"), (1.0, "1"), (0.3, "0.3"), (1e-5, "0.00001"), (0.1 + 0.2, "0.3"),
                            (2.5e-4, "0.00025"), (123.0, "123")):
            self.assertEqual(rust_f32(value), text)


@unittest.skipUnless(captune_binary(), "no captune binary (build it, or set CAPTUNE_BIN)")
class Resume(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.world = World()
        cls.start = cls.world.dir / "start"
        captune("train", "--preset", "tiny", *cls.world.data_args(), "--epochs", 1, "--out", cls.start)

    @classmethod
    def tearDownClass(cls):
        cls.world.close()

    def test_a_validation_cut_short_runs_again(self):
        run = self.world.dir / "cut"
        package("--init", self.start, "--epochs", 1, "--out", run)
        metrics, samples = run / "metrics.jsonl", run / "samples.jsonl"
        step = records(metrics)[-1]["step"]
        per_validation = sum(r["step"] == step for r in records(samples))
        # As if killed while captune validated the saved state: its samples
        # written, half a metrics line.
        kept = [line for line in metrics.read_text().splitlines(keepends=True) if json.loads(line)["step"] != step]
        metrics.write_text("".join(kept) + '{"epoch":1,"step":')
        package("--resume", "--out", run, "--epochs", 1, processes=2)
        steps = [r["step"] for r in records(metrics)]
        self.assertEqual(steps, sorted(set(steps)))
        self.assertIn(step, steps)
        self.assertEqual(sum(r["step"] == step for r in records(samples)), per_validation)

    def test_errors_on_the_first_process_stop_every_process(self):
        empty = self.world.dir / "empty"
        empty.mkdir()
        (empty / "config.toml").write_text((self.start / "config.toml").read_text())
        err = package("--resume", "--out", empty, processes=2, fails=True)
        self.assertIn("no saved state to resume from", err)
        err = package("--init", self.start, "--out", self.start, processes=2, fails=True)
        self.assertIn("already holds a run", err)
        wrong = self.world.dir / "wrong.safetensors"
        from safetensors.torch import save_file
        import torch
        save_file({"embeddings": torch.ones(1, 5)}, str(wrong), metadata={"image_ids": '["0"]'})
        err = package("--init", self.start, "--features", wrong, "--out", self.world.dir / "never", fails=True)
        self.assertIn("5-dimensional embeddings", err)
        self.assertFalse((self.world.dir / "never").exists())
