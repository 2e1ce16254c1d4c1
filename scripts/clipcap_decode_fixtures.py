#!/usr/bin/env python3
"""Makes tests/data/clipcap-tiny/: a ClipCap captioner whose decoder is the
tiny GPT-2 of tests/data/gpt2-tiny (made by scripts/gpt2_fixtures.py),
fine-tuned here in float64 with its tanh MLP mapper until it captions a
few random image embeddings, saved as transformers saves a GPT-2
(config.json, model.safetensors, tokenizer.json) with the mapper in
mapper.safetensors as `captune export` writes it; and
decode_expected.safetensors: transformers' greedy and beam captions of
those embeddings and of a few it never saw, for tests/suite/models/clipcap.rs to
compare captune's decoding with on both backends, so that CI needs no
torch.

Decoding as captune's (docs/checkpoints.md): the mapper's prefix, then
<|endoftext|>; greedy takes the highest logit until <|endoftext|> or
max_len - 1 ids. Beam search is transformers' own `generate` with
num_beams = 3, length_penalty = 0 and early_stopping = "never": the
canonical search, captions ranked by their total log-probability, as
captune runs it.

Usage:
    pip install torch transformers
    python3 scripts/clipcap_decode_fixtures.py
"""

import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SOURCE = DATA / "gpt2-tiny"
OUT = DATA / "clipcap-tiny"
END = "<|endoftext|>"
EMBED_DIM, PREFIX_LEN, MAPPER_HIDDEN, MAX_LEN = 8, 4, 32, 16
BEAMS = 3
CAPTIONS = [
    "a black dog is running through the grass",
    "two girls play on a swing",
    "a man climbs a rock wall",
    "a boy jumps into the water",
    "a brown dog carries a stick",
    "people walk down a busy street",
]
UNSEEN = 4


def main():
    torch.manual_seed(7)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(SOURCE))
    end = tokenizer.convert_tokens_to_ids(END)
    model = GPT2LMHeadModel.from_pretrained(str(SOURCE)).double()
    model.eval()  # no dropout: the steps are deterministic
    d = model.config.n_embd
    steps = MAX_LEN - 1
    features = F.normalize(
        torch.randn(len(CAPTIONS) + UNSEEN, EMBED_DIM, dtype=torch.float64), dim=1
    )
    mapper = {
        "mapper.fc1.weight": torch.randn(EMBED_DIM, MAPPER_HIDDEN, dtype=torch.float64) * 0.5,
        "mapper.fc1.bias": torch.zeros(MAPPER_HIDDEN, dtype=torch.float64),
        "mapper.fc2.weight": torch.randn(MAPPER_HIDDEN, PREFIX_LEN * d, dtype=torch.float64) * 0.2,
        "mapper.fc2.bias": torch.zeros(PREFIX_LEN * d, dtype=torch.float64),
    }
    for p in mapper.values():
        p.requires_grad_(True)

    def prefix_of(x):
        hidden = torch.tanh(x @ mapper["mapper.fc1.weight"] + mapper["mapper.fc1.bias"])
        return (hidden @ mapper["mapper.fc2.weight"] + mapper["mapper.fc2.bias"]).view(-1, PREFIX_LEN, d)

    def embeds_of(x, ids):
        return torch.cat([prefix_of(x), model.transformer.wte(ids)], dim=1)

    sequences = [[end] + tokenizer.encode(c)[: MAX_LEN - 2] + [end] for c in CAPTIONS]
    ids = torch.tensor([(s + [end] * steps)[:steps] for s in sequences])
    mask = torch.tensor([[t < len(s) - 1 for t in range(steps)] for s in sequences])
    targets = torch.tensor([(s[1:] + [end] * steps)[:steps] for s in sequences])
    params = list(model.parameters()) + list(mapper.values())
    opt = torch.optim.Adam(params, lr=1e-2)
    seen = features[: len(CAPTIONS)]
    for step in range(400):
        logits = model(inputs_embeds=embeds_of(seen, ids)).logits[:, PREFIX_LEN:]
        loss = F.cross_entropy(logits[mask], targets[mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"fine-tuned: loss {loss.item():.4f}")
    # The reference decodes the float32 weights and features captune reads.
    with torch.no_grad():
        for p in params:
            p.copy_(p.float().double())
        features = features.float().double()

    out = {"features": features}
    greedy, beam, beam_logp = [], [], []
    with torch.no_grad():
        for x in features:
            chosen = [end]
            while len(chosen) - 1 < steps:
                z = model(inputs_embeds=embeds_of(x[None], torch.tensor([chosen]))).logits[0, -1]
                chosen.append(int(z.argmax()))
                if chosen[-1] == end:
                    break
            greedy.append(chosen[1:])
            generated = model.generate(
                inputs_embeds=embeds_of(x[None], torch.tensor([[end]])),
                attention_mask=torch.ones(1, PREFIX_LEN + 1, dtype=torch.long),
                num_beams=BEAMS,
                length_penalty=0.0,
                early_stopping="never",
                do_sample=False,
                max_new_tokens=steps,
                eos_token_id=end,
                pad_token_id=end,
                output_scores=True,
                return_dict_in_generate=True,
            )
            caption = generated.sequences[0].tolist()
            if end in caption:
                caption = caption[: caption.index(end) + 1]
            beam.append(caption)
            beam_logp.append(float(generated.sequences_scores[0]))

    def padded(rows):
        return torch.tensor([r + [-1] * (MAX_LEN - len(r)) for r in rows], dtype=torch.float64)

    out["greedy"] = padded(greedy)
    out["beam"] = padded(beam)
    out["beam_logp"] = torch.tensor(beam_logp, dtype=torch.float64)
    for name, g, bm in zip(range(len(greedy)), greedy, beam):
        print(f"{name}: greedy {tokenizer.decode(g)!r} | beam {tokenizer.decode(bm)!r}")

    if OUT.exists():
        shutil.rmtree(OUT)
    model.float().save_pretrained(str(OUT), safe_serialization=True)
    shutil.copy(SOURCE / "tokenizer.json", OUT / "tokenizer.json")
    shutil.copy(SOURCE / "tokenizer_config.json", OUT / "tokenizer_config.json")
    save_file(
        {k: v.detach().float().contiguous() for k, v in mapper.items()},
        str(OUT / "mapper.safetensors"),
        metadata={"embed_dim": str(EMBED_DIM), "prefix_len": str(PREFIX_LEN),
                  "mapper_hidden": str(MAPPER_HIDDEN), "activation": "tanh"},
    )
    save_file(
        {k: v.float().contiguous() for k, v in out.items()},
        str(OUT / "decode_expected.safetensors"),
        metadata={"max_len": str(MAX_LEN), "beams": str(BEAMS), "end": str(end),
                  "seen": str(len(CAPTIONS))},
    )


if __name__ == "__main__":
    main()
