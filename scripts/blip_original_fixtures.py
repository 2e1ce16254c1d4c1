#!/usr/bin/env python3
"""Makes tests/data/blip-original: a checkpoint in the layout of BLIP's own
releases (Li et al., 2022: `model_base_caption_capfilt_large.pth`, and
SMILE's model, saved the same way), of a tiny random model of
tests/data/blip-tiny's sizes, and what BLIP's own code computes with it,
for tests/suite/models/blip.rs to compare captune's conversion with, so
that CI needs no torch.

BLIP is run from its repository (https://github.com/salesforce/BLIP,
given with --blip-repo): models/vit.py's VisionTransformer and
models/med.py's BertLMHeadModel as they are, put together as its
BLIP_Decoder does (the image through the ViT, its every token the text
decoder's cross-attention memory). What is shimmed is outside the model:
fairscale (only its activation-checkpoint wrapper is imported, unused);
the helpers of transformers 4 that med.py calls and transformers 5
moved or dropped (head pruning, unused; the head mask, none; the
inverted cross-attention mask, all ones here; init_weights, which runs
med.py's own _init_weights, the prediction head then tied to the word
embeddings by hand, as BLIP's is);
timm 0.4.12 and torchvision are installed beside (`pip install --target
DIR timm==0.4.12 torchvision`, given with --deps).

`model.pth` is `torch.save({"model": state_dict})`, as BLIP's training
saves it (with an `epoch` too). `expected.safetensors` holds, for the two
pictures tests/data/clip-images/{wide,tall}.png as the folder's processor
prepares them (`processed_pixels` of blip_tiny_expected.safetensors):

- `logits` [2, T, vocab]: the text decoder's logits for `input_ids` [2,
  T] ([DEC] then pieces, as BLIP_Decoder.forward feeds a caption);
- `greedy_ids` [2, 10]: greedy decoding as BLIP_Decoder.generate runs it
  without a prompt (the highest logit after [DEC] until [SEP], at most 10
  pieces), then -1.

Usage:
    pip install torch transformers
    pip install --target /tmp/blipdeps --no-deps timm==0.4.12 torchvision
    git clone https://github.com/salesforce/BLIP
    python3 scripts/blip_original_fixtures.py --blip-repo BLIP --deps /tmp/blipdeps
"""

import argparse
import json
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
FOLDER = DATA / "blip-tiny"
OUT = DATA / "blip-original"
MAX_NEW = 10
CAPTIONS = [[5, 6, 7, 8], [9, 10, 11]]


def blip_modules(repo, deps):
    """BLIP's vit.py and med.py, imported with the shims above."""
    sys.path.insert(0, str(deps))
    sys.path.insert(0, str(repo))
    for name in ["fairscale", "fairscale.nn", "fairscale.nn.checkpoint",
                 "fairscale.nn.checkpoint.checkpoint_activations"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["fairscale.nn.checkpoint.checkpoint_activations"].checkpoint_wrapper = lambda m, **k: m
    import transformers.modeling_utils as mu
    import transformers.pytorch_utils as pu
    import transformers.utils

    def unused(*args, **kwargs):
        raise NotImplementedError("head pruning is not used here")

    for name in ["apply_chunking_to_forward", "find_pruneable_heads_and_indices", "prune_linear_layer"]:
        if not hasattr(mu, name):
            setattr(mu, name, getattr(pu, name, unused))
    sys.modules.setdefault("transformers.file_utils", transformers.utils)
    import models.med as med
    from models.vit import VisionTransformer

    # transformers 5's init_weights expects its post_init to have run;
    # med.py calls init_weights itself: its own _init_weights, then the
    # prediction head tied to the word embeddings by hand below.
    med.BertPreTrainedModel.init_weights = lambda self: self.apply(self._init_weights)
    # And transformers 4's mask helper, which 5 dropped: 0 where a key
    # may be attended to, the type's lowest value where not.
    med.BertPreTrainedModel.invert_attention_mask = lambda self, mask: (
        (1.0 - mask[:, None, None, :].to(self.dtype)) * torch.finfo(self.dtype).min)
    # No head mask: one None per layer, as transformers 4 gave.
    med.BertPreTrainedModel.get_head_mask = lambda self, mask, layers: [None] * layers
    return VisionTransformer, med.BertConfig, med.BertLMHeadModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blip-repo", required=True, help="a clone of salesforce/BLIP")
    parser.add_argument("--deps", required=True, help="where timm 0.4.12 and torchvision are")
    args = parser.parse_args()
    VisionTransformer, BertConfig, BertLMHeadModel = blip_modules(args.blip_repo, args.deps)
    config = json.loads((FOLDER / "config.json").read_text())
    v, t = config["vision_config"], config["text_config"]
    torch.manual_seed(5)
    vision = VisionTransformer(img_size=v["image_size"], patch_size=v["patch_size"],
                               embed_dim=v["hidden_size"], depth=v["num_hidden_layers"],
                               num_heads=v["num_attention_heads"],
                               mlp_ratio=(v["intermediate_size"] + 0.5) / v["hidden_size"])
    assert vision.blocks[0].mlp.fc1.out_features == v["intermediate_size"]
    med = BertConfig(vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                     num_hidden_layers=t["num_hidden_layers"],
                     num_attention_heads=t["num_attention_heads"],
                     intermediate_size=t["intermediate_size"], hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     max_position_embeddings=t["max_position_embeddings"],
                     layer_norm_eps=t["layer_norm_eps"], pad_token_id=0,
                     add_cross_attention=True)
    med.encoder_width = v["hidden_size"]
    decoder = BertLMHeadModel(config=med)
    # Tied, as BLIP's are (its checkpoints hold the one tensor twice).
    decoder.cls.predictions.decoder.weight = decoder.bert.embeddings.word_embeddings.weight

    class BlipDecoder(torch.nn.Module):
        """BLIP_Decoder's modules, under its names."""

        def __init__(self):
            super().__init__()
            self.visual_encoder = vision
            self.text_decoder = decoder

    model = BlipDecoder()
    with torch.no_grad():
        # Layer norms, biases and the class token away from their initial values.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    OUT.mkdir(exist_ok=True)
    torch.save({"model": model.state_dict(), "epoch": 4}, OUT / "model.pth")

    model = model.double().eval()
    pixels = load_file(DATA / "blip_tiny_expected.safetensors")["processed_pixels"].double()
    bos, sep = t["bos_token_id"], t["sep_token_id"]
    with torch.no_grad():
        images = model.visual_encoder(pixels)
        atts = torch.ones(images.shape[:-1], dtype=torch.long)
        longest = max(map(len, CAPTIONS))
        ids = torch.tensor([[bos] + c + [0] * (longest - len(c)) for c in CAPTIONS])
        mask = torch.tensor([[1] * (1 + len(c)) + [0] * (longest - len(c)) for c in CAPTIONS])
        logits = model.text_decoder(ids, attention_mask=mask, encoder_hidden_states=images,
                                    encoder_attention_mask=atts, return_dict=True).logits
        greedy = []
        for i in range(len(CAPTIONS)):
            chosen = [bos]
            while len(chosen) <= MAX_NEW:
                z = model.text_decoder(torch.tensor([chosen]), encoder_hidden_states=images[i:i + 1],
                                       encoder_attention_mask=atts[i:i + 1],
                                       return_dict=True).logits[0, -1]
                # captune's policy: no padding, no start.
                z[[0, bos]] = float("-inf")
                chosen.append(int(z.argmax()))
                if chosen[-1] == sep:
                    break
            greedy.append(chosen[1:])
    padded = [g + [-1] * (MAX_NEW - len(g)) for g in greedy]
    save_file({"input_ids": ids.float(), "logits": logits.float().contiguous(),
               "greedy_ids": torch.tensor(padded, dtype=torch.float32)},
              str(OUT / "expected.safetensors"))
    print("greedy:", greedy)


if __name__ == "__main__":
    main()
