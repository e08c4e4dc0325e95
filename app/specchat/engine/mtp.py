"""The target's own multi-token-prediction (MTP) head as a drafter.

Qwen3.5, Qwen3.6 and Qwen3-Next checkpoints carry an ``mtp.*`` module that
mlx-lm's ``sanitize`` throws away: a projection ``fc`` of [embedding of the
next token; the target's last hidden state], then one decoder layer (full
attention, its own KV cache) and a norm, read out through the target's own
output layer. It drafts at the cost of a layer, not of a second model, and
needs no second download: it is read from the same folder.

It drafts as every head that reads the target does (head_drafter.py, the
layout mlx-vlm's ``qwen3_5_mtp`` drafter uses): row p pairs the target's
final hidden state after token p with the token at p + 1. A mixture of
experts (Qwen3.5 and Qwen3.6 35B-A3B) ships its head's experts stacked, as
its own layers' (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``):
they are read into mlx-lm's layer as mlx-lm's sanitize reads the model's
(``switch_layout``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask

from specchat.engine import compute, mtp_format
from specchat.engine.drafter_kinds import MTP
from specchat.engine.drafters import Absent, Build
from specchat.engine.errors import EngineError
from specchat.engine.folders import weight_files
from specchat.engine.head_drafter import HeadDrafter
from specchat.engine.kv import CacheSlot
from specchat.engine.safetensors_file import Tensor

# Qwen's checkpoints store RMSNorm weights zero-centred (weight + 1 at use);
# mlx-lm adds the 1 when it converts them (a checkpoint whose conv1d weights
# are still in the Hub's layout), and so does this, for the head's norms.
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
          "k_norm.weight", "norm.weight", "pre_fc_norm_embedding.weight",
          "pre_fc_norm_hidden.weight")


class MTPModule(nn.Module):
    def __init__(self, layer_cls: type, args, layers: int):
        super().__init__()
        hidden = args.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        full = replace(args, full_attention_interval=1)  # every layer of it: full attention
        self.layers = [layer_cls(full, layer_idx=0) for _ in range(layers)]
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """[1, L, H] embeddings of the next tokens and hidden states -> [1, L, H]."""
        h = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeddings),
                                    self.pre_fc_norm_hidden(hidden)], axis=-1))
        for layer, c in zip(self.layers, cache, strict=True):
            h = layer(h, mask=create_attention_mask(h, c), cache=c)
        return self.norm(h)


def load_head(folder: Path, target, policy, config: dict,
              name: str) -> tuple[MTPModule | None, str | None]:
    """(the MTP module of a loaded target, from its folder's ``mtp.*``
    weights, in the policy's dtype; None) when it has one that fits, else
    (None, why it cannot draft for itself, in mtp_format's words). Its
    weights are checked from their headers before any is read: against the
    model's config (mtp_format.problem, as the library checks them), then
    against the layer class the model is built with."""
    tensors = mtp_format.read(folder)
    own = mtp_format.head_tensors(tensors)
    if not own:
        return None, mtp_format.no_head(name)
    why = mtp_format.problem(tensors, config)
    inner = getattr(target, "language_model", target)
    args = getattr(inner, "args", None)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if why is None and (args is None or not layers):
        why = "SpecChat cannot run one for its model type"
    if why is not None:
        return None, mtp_format.cannot_draft(name, why)
    n = len({k.split(".")[1] for k in own if k.startswith("layers.")})
    head = MTPModule(type(layers[0]), args, n)  # lazy: nothing is computed before load_weights
    why = _unlike(head, switch_layout(own, _halves_of_header))
    if why is not None:
        return None, mtp_format.cannot_draft(name, why)
    weights: dict[str, mx.array] = {}
    hub_layout = False
    for f in weight_files(folder):
        tensors = mx.load(str(f))
        weights.update((k[len(mtp_format.PREFIX):], v) for k, v in tensors.items()
                       if k.startswith(mtp_format.PREFIX))
        hub_layout |= any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in tensors.items())
        del tensors
    if hub_layout:
        weights = {k: v + 1.0 if k.endswith(_NORMS) and v.ndim == 1 else v
                   for k, v in weights.items()}
    weights = switch_layout(weights, _halves_of_array)
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:  # checked above: the files changed since
        raise EngineError(f"{folder.name}: its MTP weights do not fit the model ({exc})") from exc
    compute.apply(head, policy)
    return head, None


_GATE_UP, _DOWN = ".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"


def switch_layout(items: dict, halves) -> dict:
    """A head's experts as mlx-lm's layer holds them (``mlp.switch_mlp``'s
    gate, up and down projections), from the layout Qwen's MoE checkpoints
    ship them in (``mlp.experts.gate_up_proj``: the gate's then the up's
    rows of every expert, stacked; ``mlp.experts.down_proj``), as mlx-lm's
    qwen3_5_moe sanitize moves the model's own layers'. ``halves`` splits a
    gate_up item (a header or an array) into the gate's and the up's."""
    out = {}
    for k, v in items.items():
        if k.endswith(_GATE_UP):
            base = k[:-len(_GATE_UP)] + ".mlp.switch_mlp."
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = halves(v)
        elif k.endswith(_DOWN):
            out[k[:-len(_DOWN)] + ".mlp.switch_mlp.down_proj.weight"] = v
        else:
            out[k] = v
    return out


def _halves_of_array(v: mx.array) -> tuple[mx.array, mx.array]:
    mid = v.shape[-2] // 2
    return v[..., :mid, :], v[..., mid:, :]


def _halves_of_header(t: Tensor) -> tuple[Tensor, Tensor]:
    shape = (*t.shape[:-2], t.shape[-2] // 2, t.shape[-1]) if len(t.shape) >= 2 else t.shape
    return replace(t, shape=shape), replace(t, shape=shape)


def _unlike(head: MTPModule, tensors: dict) -> str | None:
    """How the head's weights (their headers' shapes) differ from what the
    model's layer class builds, in words; None when they are alike."""
    want = {k: tuple(v.shape) for k, v in tree_flatten(head.parameters())}
    for k, t in sorted(tensors.items()):
        if k not in want:
            return f"tensor {mtp_format.PREFIX}{k} is not part of the model's layer"
        if t.shape != want[k]:
            return (f"tensor {mtp_format.PREFIX}{k} has shape {list(t.shape)} but the model's "
                    f"layer takes {list(want[k])}")
    missing = sorted(set(want) - set(tensors))
    if missing:
        return f"its weights lack {mtp_format.PREFIX}{missing[0]}"
    return None


class MTPDrafter(HeadDrafter):
    """Drafts with the target's MTP head."""

    name = MTP.name

    def __init__(self, head: MTPModule, target: CacheSlot):
        self.head = head
        self.layers = len(head.layers)
        self.embed = target.runner.trunk.embed_tokens if target.runner.split else None
        self.readout = target.runner.head  # the target's own output layer
        super().__init__(target)

    def bytes_per_token(self) -> int:
        """Its layers, and the target's output layer it reads out through."""
        return compute.param_bytes(self.head) + self.target.runner.head_bytes()

    def features(self, tapped: dict) -> mx.array:
        return tapped["final"]

    def forward(self, tokens: mx.array, rows: mx.array, fed: bool) -> mx.array:
        return self.head(self.embed(tokens[None]), rows[None], self.cache)[0]

    def logits(self, out: mx.array) -> mx.array:
        return self.readout(out)


def build(b: Build) -> MTPDrafter:
    """drafter_kinds.MTP's maker: the target's own MTP head, read from the
    target's folder (``b.folder``); Absent, in mtp_format's words, when it
    ships none that can draft."""
    name = b.target.info.name
    head, why = load_head(b.folder, b.target.model, b.compute, b.target.config, name)
    if head is None:
        if why != mtp_format.no_head(name):
            b.say(why)  # it ships one, which cannot draft
        raise Absent(why)
    b.say(f"{name} has an MTP head: it can draft for itself")
    return MTPDrafter(head, b.cache)
