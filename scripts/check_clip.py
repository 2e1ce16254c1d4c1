#!/usr/bin/env python3
"""Checks captune against transformers on a CLIP folder: a real one you
brought (OpenAI's ViT-B/32, B/16, L/14 as `save_pretrained` writes them),
or a random one of a named shape that this script writes first.

For a few image files it runs `captune embed --clip FOLDER` and compares
each image embedding with transformers' (the folder's image processor,
its PIL backend, then CLIPModel in float64), and it runs `captune score
--clip FOLDER` on a caption per image and compares CLIP-S and RefCLIP-S
(Hessel et al., 2021) with transformers' computation, which covers the
tokenizer and the text tower. It prints the largest differences and
fails above 1e-4 (relative to the largest embedding value; absolute for
the scores).

    pip install torch transformers tokenizers safetensors pillow
    cargo build --release
    python3 scripts/check_clip.py --clip clip-b32 [--images a.jpg b.jpg ...]
    python3 scripts/check_clip.py --random l14 --layers 2 --out /tmp/clip-l14

A random folder takes its tokenizer from tests/data/clip-tiny (the text
tower's vocabulary is then that tokenizer's 500 pieces); its other
widths, its image and patch sizes are the named model's, with `--layers`
blocks per tower (its real depth when not given).
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from PIL import Image
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
# (vision: width, layers, heads, MLP, image, patch), (text: width, layers, heads, MLP), projection
SHAPES = {
    "b32": ((768, 12, 12, 3072, 224, 32), (512, 12, 8, 2048), 512),
    "b16": ((768, 12, 12, 3072, 224, 16), (512, 12, 8, 2048), 512),
    "l14": ((1024, 24, 16, 4096, 224, 14), (768, 12, 12, 3072), 768),
}
CAPTIONS = ["a dog runs through the grass", "two girls play in the water",
            "a man in a red shirt climbs a rock", "a child sits on a bench"]


def random_clip(shape, layers, out):
    (vw, vl, vh, vm, image, patch), (tw, tl, th, tm), projection = SHAPES[shape]
    tiny = ROOT / "tests" / "data" / "clip-tiny"
    tokenizer = CLIPTokenizerFast.from_pretrained(tiny)
    config = CLIPConfig(
        text_config=dict(hidden_size=tw, num_hidden_layers=layers or tl, num_attention_heads=th,
                         intermediate_size=tm, vocab_size=len(tokenizer),
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.eos_token_id),
        vision_config=dict(hidden_size=vw, num_hidden_layers=layers or vl, num_attention_heads=vh,
                           intermediate_size=vm, image_size=image, patch_size=patch),
        projection_dim=projection)
    torch.manual_seed(0)
    model = CLIPModel(config)
    with torch.no_grad():  # biases and norms away from their initial 0 and 1
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    CLIPImageProcessorPil(size={"shortest_edge": image},
                          crop_size={"height": image, "width": image}).save_pretrained(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clip", type=Path, help="a CLIP folder")
    p.add_argument("--random", choices=sorted(SHAPES), help="write a random CLIP of this shape")
    p.add_argument("--layers", type=int, help="blocks per tower of the random CLIP")
    p.add_argument("--out", type=Path, help="where to write the random CLIP")
    p.add_argument("--images", type=Path, nargs="*",
                   default=sorted((ROOT / "tests" / "data" / "clip-images").glob("*.png")))
    p.add_argument("--captune", default=str(ROOT / "target" / "release" / "captune"))
    a = p.parse_args()
    if a.random:
        if not a.out:
            p.error("--random needs --out FOLDER")
        random_clip(a.random, a.layers, a.out)
        a.clip = a.out
    if not a.clip:
        p.error("give --clip FOLDER or --random SHAPE --out FOLDER")
    images = a.images[: len(CAPTIONS)]
    work = Path(tempfile.mkdtemp(prefix="check-clip-"))
    (work / "images").mkdir()
    entries, results = [], []
    for k, path in enumerate(images):
        shutil.copy(path, work / "images" / f"{k}{path.suffix}")
        refs = [CAPTIONS[(k + 1) % len(CAPTIONS)], CAPTIONS[(k + 2) % len(CAPTIONS)]]
        entries.append({"filename": f"{k}{path.suffix}", "imgid": k, "split": "test",
                        "sentids": [2 * k, 2 * k + 1],
                        "sentences": [{"tokens": r.split(), "raw": r, "imgid": k, "sentid": 2 * k + j}
                                      for j, r in enumerate(refs)]})
        results.append({"image_id": k, "caption": CAPTIONS[k]})
    (work / "data.json").write_text(json.dumps({"dataset": "check", "images": entries}))
    (work / "results.json").write_text(json.dumps(results))
    data = f"karpathy:{work / 'data.json'}"
    run = lambda *args: subprocess.run([a.captune, "--device", "cpu", *args], check=True,
                                       capture_output=True, text=True).stdout
    run("embed", "--clip", str(a.clip), "--data", data, "--out", str(work / "f.safetensors"))
    scores = json.loads(run("score", "--data", data, "--results", str(work / "results.json"),
                            "--clip", str(a.clip), "--json"))
    got = load_file(str(work / "f.safetensors"))["embeddings"].double()

    model = CLIPModel.from_pretrained(a.clip).double().eval()
    processor = CLIPImageProcessorPil.from_pretrained(a.clip)
    tokenizer = CLIPTokenizerFast.from_pretrained(a.clip)
    max_len = model.config.text_config.max_position_embeddings
    with torch.no_grad():
        pixels = processor(images=[Image.open(p).convert("RGB") for p in images],
                           return_tensors="pt")["pixel_values"].double()
        want = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)

        def text(texts):
            t = tokenizer(["A photo depicts " + x for x in texts], padding=True, truncation=True,
                          max_length=max_len, return_tensors="pt")
            return F.normalize(model.get_text_features(**t).pooler_output, dim=-1)

        candidates = text(CAPTIONS[: len(images)])
        clip_s = 2.5 * (want * candidates).sum(-1).clamp(min=0)
        ref_clip_s = []
        for k, entry in enumerate(entries):
            best = (text([s["raw"] for s in entry["sentences"]]) @ candidates[k]).max().clamp(min=0)
            ref_clip_s.append(2 * clip_s[k] * best / (clip_s[k] + best))
    embed_diff = ((got - want).abs().max() / want.abs().max()).item()
    s_diff = abs(scores["CLIP-S"] - clip_s.mean().item())
    r_diff = abs(scores["RefCLIP-S"] - torch.stack(ref_clip_s).mean().item())
    print(f"{a.clip}: {len(images)} images; image embeddings differ by {embed_diff:.2e} of their "
          f"largest; CLIP-S {scores['CLIP-S']:.4f} differs by {s_diff:.2e}, RefCLIP-S "
          f"{scores['RefCLIP-S']:.4f} by {r_diff:.2e}")
    shutil.rmtree(work)
    sys.exit(0 if max(embed_diff, s_diff, r_diff) < 1e-4 else 1)


if __name__ == "__main__":
    main()
