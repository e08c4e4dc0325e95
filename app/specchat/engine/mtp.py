"""The target's own multi-token-prediction (MTP) head as a drafter.

Qwen3.5, Qwen3.6 and Qwen3-Next checkpoints carry an ``mtp.*`` module that
mlx-lm's ``sanitize`` throws away: a projection ``fc`` of [embedding of the
next token; the target's last hidden state], then one decoder layer (full
attention, its own KV cache) and a norm, read out through the target's own
output layer. It drafts at the cost of a layer, not of a second model, and
needs no second download: it is read from the same folder.

It drafts as every head that reads the target does (head_drafter.py, the
layout mlx-vlm's ``qwen3_5_mtp`` drafter uses): row p pairs the target's
final hidden state after token p with the token at p + 1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from specchat.engine import compute
from specchat.engine.drafter_kinds import MTP
from specchat.engine.errors import EngineError
from specchat.engine.folders import MTP_PREFIX, mtp_keys, weight_files
from specchat.engine.head_drafter import HeadDrafter
from specchat.engine.kv import CacheSlot

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


def load_head(folder: Path, target, policy) -> MTPModule | None:
    """The MTP module of a loaded target from its folder's ``mtp.*`` weights,
    in the policy's dtype; None if the folder has none."""
    keys = mtp_keys(folder)
    if not keys:
        return None
    inner = getattr(target, "language_model", target)
    args = getattr(inner, "args", None)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if args is None or not layers:
        raise EngineError(f"{folder.name} has MTP weights, but SpecChat cannot run them for "
                          f"its model type")
    n = len({k.split(".")[2] for k in keys if k.startswith(MTP_PREFIX + "layers.")}) or 1
    head = MTPModule(type(layers[0]), args, n)
    weights: dict[str, mx.array] = {}
    hub_layout = False
    for f in weight_files(folder):
        tensors = mx.load(str(f))
        weights.update((k[len(MTP_PREFIX):], v) for k, v in tensors.items()
                       if k.startswith(MTP_PREFIX))
        hub_layout |= any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in tensors.items())
        del tensors
    if hub_layout:
        weights = {k: v + 1.0 if k.endswith(_NORMS) and v.ndim == 1 else v
                   for k, v in weights.items()}
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise EngineError(f"{folder.name}: its MTP weights do not fit the model ({exc})") from exc
    compute.apply(head, policy)
    return head


class MTPDrafter(HeadDrafter):
    """Drafts with the target's MTP head."""

    name = MTP.name

    def __init__(self, head: MTPModule, target: CacheSlot):
        self.head = head
        self.layers = len(head.layers)
        self.embed = target.runner.trunk.embed_tokens if target.runner.split else None
        self.readout = target.runner.head  # the target's own output layer
        super().__init__(target)

    def features(self, tapped: dict) -> mx.array:
        return tapped["final"]

    def forward(self, tokens: mx.array, rows: mx.array, fed: bool) -> mx.array:
        return self.head(self.embed(tokens[None]), rows[None], self.cache)[0]

    def logits(self, out: mx.array) -> mx.array:
        return self.readout(out)


def build(parts) -> MTPDrafter:
    """drafter_kinds.MTP's maker."""
    if parts.mtp_head is None:
        raise EngineError("This target has no MTP head.")
    return MTPDrafter(parts.mtp_head, parts.target)
