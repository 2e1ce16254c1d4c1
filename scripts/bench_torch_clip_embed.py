#!/usr/bin/env python3
"""PyTorch reference for `captune bench embed`: a CLIP folder's image tower
(transformers' CLIPModel, float32, under torch.no_grad) on the same number
of random preprocessed images (rounded up to whole batches), `--batch` at
a time, after one warm-up batch, each batch's embeddings read back to the
host: images/s and the process's peak memory, as captune reports them.
Preprocessing and image decoding are left out on both sides.

    python3 scripts/bench_torch_clip_embed.py --clip FOLDER [--images 64] [--batch 32] [--device cpu|cuda] [--json]
    python3 scripts/bench_torch_clip_embed.py --random-clip FOLDER   # writes a ViT-B/32-shaped CLIP with random weights

A random CLIP of ViT-B/32's shape (CLIPConfig's defaults) times as the real
one does; its folder is what both benchmarks read.
"""
import argparse
import json
import time

import torch
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from bench_torch_captioner import describe_memory, memory


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clip", help="a CLIP folder (config.json, model.safetensors)")
    p.add_argument("--random-clip", help="write a random ViT-B/32-shaped CLIP folder here and stop")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.random_clip:
        torch.manual_seed(0)
        CLIPModel(CLIPConfig()).save_pretrained(a.random_clip, safe_serialization=True)
        CLIPImageProcessor().save_pretrained(a.random_clip)
        print(f"wrote a random ViT-B/32-shaped CLIP to {a.random_clip}")
        return
    if not a.clip or a.images <= 0 or a.batch <= 0:
        p.error("give --clip FOLDER, and positive --images and --batch")
    dev = torch.device(a.device)
    model = CLIPModel.from_pretrained(a.clip).float().eval().to(dev)
    size = model.config.vision_config.image_size
    pixels = torch.randn(a.batch, 3, size, size, device=dev)
    batches = -(-a.images // a.batch)

    def embed(chunk):
        out = model.visual_projection(model.vision_model(pixel_values=chunk).pooler_output)
        return torch.nn.functional.normalize(out, dim=-1)

    with torch.no_grad():
        embed(pixels).cpu()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batches):
            embed(pixels).cpu()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    record = {"op": "embed", "framework": "pytorch", "device": str(dev), "threads": torch.get_num_threads(),
              "model": a.clip, "images": batches * a.batch, "batch": a.batch, "seconds": seconds,
              "images_per_s": batches * a.batch / seconds, **memory(dev)}
    if a.json:
        print(json.dumps([record], indent=2))
    else:
        print(f"pytorch {dev}: {record['images_per_s']:.1f} images/s ({a.images} images, batch {a.batch}), "
              f"{describe_memory(record)}")


if __name__ == "__main__":
    main()
