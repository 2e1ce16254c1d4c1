"""captune's captioner in PyTorch, as docs/checkpoints.md states it: a
mapper (ClipCap's MLP, or its transformer) turns an L2-normalised image
embedding into k prefix vectors; a causal pre-LN transformer with learned
positions runs over the prefix and `<bos> w1 .. wn`; the output layer is
the token table, tied. Or an LSTM captioner (`family` "lstm"): an image
projection, a word table, stacked LSTM cells, an untied output layer.
Every tensor keeps its checkpoint name and layout (the prefix decoder's
dense weights input-major: y = x W + b; the LSTM's PyTorch's)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import CheckpointError

LN_EPS = 1e-5
# The masked ids' logit (captune's rule, not a stored tensor).
MASKED_LOGIT = -1e30


def activation(name):
    return {
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "tanh": torch.tanh,
        "relu": F.relu,
        "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
        "gelu_erf": F.gelu,
    }[name]


def transformer_shapes(prefix, t, final_norm=True):
    """The tensors of a transformer config `t` under `prefix`, in the order
    captune creates them."""
    d = t["width"]
    h = t.get("mlp_width", 4 * d)
    out = []
    if t.get("pre_norm", False):
        out += [(f"{prefix}.ln_pre.weight", (d,)), (f"{prefix}.ln_pre.bias", (d,))]
    for i in range(t["layers"]):
        b = f"{prefix}.blocks.{i}"
        out += [(f"{b}.ln1.weight", (d,)), (f"{b}.ln1.bias", (d,)),
                (f"{b}.attn.qkv.weight", (d, 3 * d))]
        if t.get("qkv_bias", True):
            out.append((f"{b}.attn.qkv.bias", (3 * d,)))
        out += [(f"{b}.attn.proj.weight", (d, d)), (f"{b}.attn.proj.bias", (d,)),
                (f"{b}.ln2.weight", (d,)), (f"{b}.ln2.bias", (d,)),
                (f"{b}.mlp.fc1.weight", (d, h)), (f"{b}.mlp.fc1.bias", (h,)),
                (f"{b}.mlp.fc2.weight", (h, d)), (f"{b}.mlp.fc2.bias", (d,))]
    if t.get("final_norm", final_norm):
        out += [(f"{prefix}.ln_f.weight", (d,)), (f"{prefix}.ln_f.bias", (d,))]
    return out


def mapper_transformer(config):
    """The transformer config of ClipCap's transformer mapper."""
    mt = config["mapper_transformer"]
    return {"width": config["decoder"]["width"], "layers": mt["layers"], "heads": mt["heads"],
            "causal": False, "mlp_width": config["mapper_hidden"],
            "activation": config.get("mapper_activation", "gelu"), "qkv_bias": False,
            "final_norm": False}


def lstm_shapes(config):
    """An LSTM captioner's tensors, PyTorch's names and layouts (`[outputs,
    inputs]`), in the order captune creates them."""
    e, h, v = config["embed_dim"], config["decoder"]["width"], config["vocab_size"]
    out = [("fc_embed.weight", (h, e)), ("fc_embed.bias", (h,)), ("embed.weight", (v, h))]
    for i in range(config["decoder"]["layers"]):
        out += [(f"core.lstm.weight_ih_l{i}", (4 * h, h)), (f"core.lstm.weight_hh_l{i}", (4 * h, h)),
                (f"core.lstm.bias_ih_l{i}", (4 * h,)), (f"core.lstm.bias_hh_l{i}", (4 * h,))]
    return out + [("logit.weight", (v, h)), ("logit.bias", (v,))]


def captioner_shapes(config):
    """Every tensor of a captioner, in the order captune creates them (the
    order of the optimizer file's moments)."""
    if config.get("family") == "lstm":
        return lstm_shapes(config)
    e, k, hidden = config["embed_dim"], config["prefix_len"], config["mapper_hidden"]
    d = config["decoder"]["width"]
    if config.get("mapper_transformer"):
        c = config["mapper_transformer"]["clip_len"]
        out = [("mapper.linear.weight", (e, c * d)), ("mapper.linear.bias", (c * d,)),
               ("mapper.constants", (k, d))]
        out += transformer_shapes("mapper.transformer", mapper_transformer(config))
    else:
        out = [("mapper.fc1.weight", (e, hidden)), ("mapper.fc1.bias", (hidden,)),
               ("mapper.fc2.weight", (hidden, k * d)), ("mapper.fc2.bias", (k * d,))]
    out += [("decoder.tokens", (config["vocab_size"], d)),
            ("decoder.positions", (k + config["max_len"] - 1, d))]
    out += transformer_shapes("decoder", config["decoder"])
    return out


def decays(name, shape):
    """Weight decay applies to dense layers' weight matrices only: an
    LSTM's are also its cells' (`core.lstm.weight_*`), and its word table
    (`embed.weight`) is not one."""
    if name == "embed.weight":
        return False
    return name.startswith("core.lstm.weight_") or (name.endswith(".weight") and len(shape) == 2)


def is_adapter(config, name):
    """Whether tensor `name` is the adapter between the image and the
    decoder (the mapper; an LSTM's image projection): what
    `--freeze-decoder` trains."""
    return name.startswith("fc_embed." if config.get("family") == "lstm" else "mapper.")


class Captioner(nn.Module):
    """The captioner; `tensor(name)` is a parameter by its checkpoint name."""

    def __init__(self, config, tensors=None):
        super().__init__()
        self.config = config
        self.names = [n for n, _ in captioner_shapes(config)]
        shapes = dict(captioner_shapes(config))
        self.weights = nn.ParameterList()
        for name in self.names:
            t = torch.zeros(shapes[name]) if tensors is None else tensors[name]
            self.weights.append(nn.Parameter(t.clone().to(torch.float32)))
        self.index = {n: i for i, n in enumerate(self.names)}
        specials = config.get("specials", {"start": 1, "end": 2, "pad": 0})
        self.start, self.end, self.pad = specials["start"], specials["end"], specials["pad"]
        # The ids outside the policy: the padding, and the start unless it
        # is also the end (GPT-2's <|endoftext|>).
        self.masked = sorted({self.pad, self.pad if self.start == self.end else self.start})

    @staticmethod
    def check(config, tensors, path="the checkpoint"):
        """Raises CheckpointError naming the first config field or tensor
        that is missing, unexpected or of the wrong shape."""
        try:
            want = dict(captioner_shapes(config))
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: metadata captioner_config has no field {e}; not a captune captioner")
        for name, shape in want.items():
            if name not in tensors:
                raise CheckpointError(f"{path}: tensor {name} is missing (its config needs it)")
            if tuple(tensors[name].shape) != tuple(shape):
                raise CheckpointError(
                    f"{path}: tensor {name} is {list(tensors[name].shape)}, its config says {list(shape)}")
        extra = sorted(set(tensors) - set(want))
        if extra:
            raise CheckpointError(f"{path}: tensor {extra[0]} is not part of the captioner its config describes")

    def tensor(self, name):
        return self.weights[self.index[name]]

    def state(self):
        return {n: self.weights[i].detach() for i, n in enumerate(self.names)}

    def dense(self, x, name, bias=True):
        y = x @ self.tensor(name + ".weight")
        return y + self.tensor(name + ".bias") if bias else y

    def norm(self, x, name):
        return F.layer_norm(x, (x.shape[-1],), self.tensor(name + ".weight"), self.tensor(name + ".bias"), LN_EPS)

    def transformer(self, x, prefix, t, final_norm=True):
        """Pre-LN blocks over x [batch, seq, width]."""
        d, heads = t["width"], t["heads"]
        act = activation(t.get("activation", "gelu"))
        if t.get("pre_norm", False):
            x = self.norm(x, f"{prefix}.ln_pre")
        n = x.shape[1]
        mask = None
        if t.get("causal", True):
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[None, None]
        for i in range(t["layers"]):
            b = f"{prefix}.blocks.{i}"
            qkv = self.dense(self.norm(x, f"{b}.ln1"), f"{b}.attn.qkv", bias=t.get("qkv_bias", True))
            q, k, v = (z.reshape(x.shape[0], n, heads, d // heads).transpose(1, 2) for z in qkv.split(d, -1))
            scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            att = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(x.shape[0], n, d)
            x = x + self.dense(att, f"{b}.attn.proj")
            x = x + self.dense(act(self.dense(self.norm(x, f"{b}.ln2"), f"{b}.mlp.fc1")), f"{b}.mlp.fc2")
        if t.get("final_norm", final_norm):
            x = self.norm(x, f"{prefix}.ln_f")
        return x

    def prefix(self, features):
        """k prefix vectors [batch, k, width] from image embeddings, which
        are L2-normalised first."""
        c = self.config
        k, d = c["prefix_len"], c["decoder"]["width"]
        x = F.normalize(features, dim=-1)
        if c.get("mapper_transformer"):
            mt = mapper_transformer(c)
            clip = c["mapper_transformer"]["clip_len"]
            h = self.dense(x, "mapper.linear").reshape(x.shape[0], clip, d)
            h = torch.cat([h, self.tensor("mapper.constants").expand(x.shape[0], k, d)], 1)
            return self.transformer(h, "mapper.transformer", mt)[:, clip:]
        act = activation(c.get("mapper_activation", "gelu"))
        return self.dense(act(self.dense(x, "mapper.fc1")), "mapper.fc2").reshape(x.shape[0], k, d)

    def lstm(self, features, inputs):
        """An LSTM captioner's outputs [batch, positions, width] at the
        token positions: PyTorch's LSTM cell (gates i, f, g, o), the image
        projection as every layer's first hidden state or as the input
        of a step before the start."""
        c = self.config
        layers = c["decoder"]["layers"]
        image = self.dense_t(F.normalize(features, dim=-1), "fc_embed")
        words = self.tensor("embed.weight")[inputs]
        zero = torch.zeros_like(image)
        as_input = c["lstm"]["image_feed"] == "input"
        states = [(zero if as_input else image, zero) for _ in range(layers)]
        steps = torch.cat([image[:, None], words], 1) if as_input else words
        outputs = []
        for t in range(steps.shape[1]):
            x = steps[:, t]
            for i in range(layers):
                h, cell = states[i]
                gates = (x @ self.tensor(f"core.lstm.weight_ih_l{i}").T + self.tensor(f"core.lstm.bias_ih_l{i}")
                         + h @ self.tensor(f"core.lstm.weight_hh_l{i}").T + self.tensor(f"core.lstm.bias_hh_l{i}"))
                g_in, g_forget, g_cell, g_out = gates.chunk(4, -1)
                cell = torch.sigmoid(g_forget) * cell + torch.sigmoid(g_in) * torch.tanh(g_cell)
                x = torch.sigmoid(g_out) * torch.tanh(cell)
                states[i] = (x, cell)
            outputs.append(x)
        return torch.stack(outputs[1:] if as_input else outputs, 1)

    def dense_t(self, x, name):
        """A PyTorch-layout linear layer (`[outputs, inputs]`)."""
        return x @ self.tensor(name + ".weight").T + self.tensor(name + ".bias")

    def forward(self, features, inputs):
        """Logits [batch, positions, vocab] of the token positions for
        inputs `<bos> w1 .. wn` (padded with the padding id), the masked
        ids at MASKED_LOGIT."""
        if self.config.get("family") == "lstm":
            logits = self.dense_t(self.lstm(features, inputs), "logit")
            logits[..., self.masked] = MASKED_LOGIT
            return logits
        k = self.config["prefix_len"]
        tokens = self.tensor("decoder.tokens")
        x = torch.cat([self.prefix(features), tokens[inputs]], 1)
        x = x + self.tensor("decoder.positions")[: x.shape[1]]
        h = self.transformer(x, "decoder", self.config["decoder"])[:, k:]
        logits = h @ tokens.T
        logits[..., self.masked] = MASKED_LOGIT
        return logits
