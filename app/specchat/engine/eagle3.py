"""EAGLE-3 draft heads (Li et al., 2025): one transformer layer that reads
three of the target's layers and drafts at a few percent of a target forward.

A head is its own folder (a Hub download, or one ``specchat heads train``
wrote): ``config.json`` and safetensors, in the published layout. Two
layouts are read as they are:

- EAGLE-3's own (``LlamaForCausalLMEagle3``: a flat Llama config with
  ``draft_vocab_size``; the layer's weights under ``midlayer.``);
- vLLM's ``speculators`` (``speculators_model_type: eagle3``, the layer's
  config under ``transformer_layer_config``, weights under ``layers.0.``,
  the target's layers in ``eagle_aux_hidden_state_layer_ids``).

How it drafts (head_drafter.py): row p pairs ``fc`` of the target's hidden
states after token p at three layers (by default 2, n/2 and n-3 of its n,
i.e. the outputs of layers 1, n/2-1 and n-4) with the embedding of the token
at p + 1; the first layer attends over [embedding; hidden], chained rows
feed the head's own output back. Its vocabulary is a subset of the
target's: draft id i is target id ``i + d2t[i]`` (a DraftHead with those
rows, so q is scattered back to the target's width for rejection
sampling). The structure follows mlx-vlm's ``eagle3`` drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.rope_utils import initialize_rope

from specchat.engine import compute
from specchat.engine.draft_model import DraftHead
from specchat.engine.drafter_kinds import EAGLE3
from specchat.engine.errors import EngineError
from specchat.engine.folders import head_weight_files, read_config, vocab_map_problems
from specchat.engine.head_drafter import HeadDrafter
from specchat.engine.kv import CacheSlot


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None  # the target's layers it reads (None: 2, n/2, n-3)
    norm_before_residual: bool
    tie_word_embeddings: bool
    rope_scaling: dict | None = None  # as mlx-lm's models read it (rope_utils.initialize_rope)
    rope_traditional: bool = False
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config: dict) -> HeadConfig:
        layer = config.get("transformer_layer_config") or config
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        ids = config.get("eagle_aux_hidden_state_layer_ids") or config.get("target_layer_ids")
        # Newer configs put the scaling in rope_parameters (with rope_theta), as
        # mlx-lm's mistral4 reads them.
        scaling = layer.get("rope_scaling") or layer.get("rope_parameters") or None
        positions = layer.get("max_position_embeddings")
        return cls(
            hidden_size=hidden,
            intermediate_size=int(layer["intermediate_size"]),
            num_layers=int(layer.get("num_hidden_layers", 1)),
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads", heads)),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float((layer.get("rope_parameters") or {}).get(
                "rope_theta", layer.get("rope_theta", 10000.0))),
            vocab_size=int(layer.get("vocab_size", config.get("vocab_size"))),
            draft_vocab_size=int(config.get("draft_vocab_size") or layer.get("vocab_size")),
            target_hidden_size=int(config.get("target_hidden_size") or hidden),
            layer_ids=tuple(int(i) for i in ids) if ids else None,
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=dict(scaling) if isinstance(scaling, dict) else scaling,
            rope_traditional=bool(layer.get("rope_traditional", False)),
            max_position_embeddings=int(positions) if positions is not None else None,
        )

    def read_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose outputs it reads: the published ids name
        hidden states (id i: the input of layer i, the output of layer i - 1)."""
        ids = self.layer_ids or (2, target_layers // 2, target_layers - 3)
        return tuple(max(i - 1, 0) for i in ids)


def make_rope(c: HeadConfig) -> nn.Module:
    """The head's rotary embedding, built by mlx-lm's own
    ``initialize_rope`` from its config, as mlx-lm builds a Llama layer's
    (a Llama 3.1 head's "llama3" scaling, YaRN, linear and the rest)."""
    return initialize_rope(c.head_dim, c.rope_theta, c.rope_traditional, c.rope_scaling,
                           c.max_position_embeddings)


def check_rope(c: HeadConfig, name: str) -> None:
    """Refuse, in words, a rope scaling mlx-lm cannot build: drafting with
    other frequencies than the head was trained with would draft noise."""
    try:  # built and applied once: some scalings fail only when applied
        mx.eval(make_rope(c)(mx.zeros((1, 1, 2, c.head_dim)), offset=1))
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        scaling = c.rope_scaling if isinstance(c.rope_scaling, dict) else {}
        kind = scaling.get("type") or scaling.get("rope_type")
        what = f'rope scaling of type "{kind}"' if kind else f"rope scaling {c.rope_scaling!r}"
        why = f"it lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        raise EngineError(f"{name} is an EAGLE-3 head with a {what}, which mlx-lm cannot "
                          f"build ({why}); it would draft with the wrong positions") from exc


class Attention(nn.Module):
    def __init__(self, c: HeadConfig, input_size: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.scale = c.head_dim ** -0.5
        self.q_proj = nn.Linear(input_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.rope = make_rope(c)

    def __call__(self, x: mx.array, mask, cache) -> mx.array:
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, L, self.kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.kv_heads, -1).transpose(0, 2, 1, 3)
        # Row p sits at position p + 1 (its token's), as the heads were trained.
        q, k = self.rope(q, offset=cache.offset + 1), self.rope(k, offset=cache.offset + 1)
        k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A decoder layer; the first one attends over [embedding; hidden]."""

    def __init__(self, c: HeadConfig, first: bool):
        super().__init__()
        self.first = first
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        if first:
            self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = Attention(c, 2 * c.hidden_size if first else c.hidden_size)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = MLP(c)

    def __call__(self, h: mx.array, embeds: mx.array | None, mask, cache) -> mx.array:
        if self.first:
            normed = self.hidden_norm(h)
            residual = normed if self.norm_before_residual else h
            x = mx.concatenate([self.input_layernorm(embeds), normed], axis=-1)
        else:
            residual, x = h, self.input_layernorm(h)
        h = residual + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    def __init__(self, c: HeadConfig, shared_embed: nn.Module | None = None):
        """``shared_embed``: the target's embedding, for a head that ships
        none; held outside the module's parameters (it is the target's)."""
        super().__init__()
        self.config = c
        if shared_embed is None:
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        object.__setattr__(self, "shared_embed", shared_embed)
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.layers = [Layer(c, i == 0) for i in range(c.num_layers)]
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.d2t = mx.zeros((c.draft_vocab_size,), dtype=mx.int32)

    def __call__(self, tokens: mx.array, h: mx.array, cache: list, fed: bool) -> mx.array:
        """[L] tokens, [L, 3 * target hidden] features (``fed``) or [L, hidden]
        head outputs -> [L, hidden] (before the norm)."""
        h = (self.fc(h) if fed else h)[None]
        embeds = (self.shared_embed or self.embed_tokens)(tokens[None])
        for layer, c in zip(self.layers, cache, strict=True):
            h = layer(h, embeds, create_attention_mask(h, c), c)
        return h[0]

    def logits(self, out: mx.array) -> mx.array:
        return self.lm_head(self.norm(out))

    def rows(self) -> mx.array:
        """The target id of each draft vocabulary column."""
        return mx.arange(self.config.draft_vocab_size, dtype=mx.int32) + self.d2t


def _rename(key: str) -> str | None:
    """A published weight name as this module names it (None: not used;
    ``t2d`` is only checked, vocab_map_problems)."""
    if key.startswith("verifier_") or "rotary_emb.inv_freq" in key:
        return None
    return key.replace("midlayer.", "layers.0.", 1)


def fit(c: HeadConfig, target_hidden: int, target_layers: int, target_vocab: int,
        name: str, target: str) -> None:
    """Refuse, in words, a head that was not made for this target."""
    problems = []
    if c.target_hidden_size != target_hidden:
        problems.append(f"it reads hidden states of width {c.target_hidden_size}, "
                        f"{target} has {target_hidden}")
    bad = [i for i in c.read_layers(target_layers) if not 0 <= i < target_layers]
    if bad:
        problems.append(f"it reads layers {list(c.layer_ids or ())}, {target} has "
                        f"{target_layers}")
    if c.vocab_size != target_vocab:
        problems.append(f"its vocabulary maps into {c.vocab_size:,} ids, {target}'s has "
                        f"{target_vocab:,}")
    if problems:
        raise EngineError(f"{name} is an EAGLE-3 head for another model and cannot draft for "
                          f"{target}: " + "; ".join(problems))


def head_dim_of_weights(c: HeadConfig, weights: dict, name: str) -> HeadConfig:
    """The head width its attention weights have. Published configs may
    state another: AngelSlim's Qwen3-4B head says ``head_dim`` 80 (its
    hidden size over its heads, for the serving frameworks' Llama code),
    while its q_proj holds 32 heads of 128 as Qwen3's do (SafeAILab/EAGLE
    issue 315). The weights are what it was trained with."""
    q = weights.get("layers.0.self_attn.q_proj.weight")
    if q is None or q.shape[0] == c.num_heads * c.head_dim:
        return c
    if q.shape[0] % c.num_heads:
        raise EngineError(f"{name}: its q_proj has {q.shape[0]} rows, not a whole number of "
                          f"its {c.num_heads} attention heads")
    return replace(c, head_dim=q.shape[0] // c.num_heads)


def load_head(folder: Path, target, policy, target_name: str) -> Eagle3Head:
    """A head folder's module, checked against a loaded target, in the
    policy's dtype. The target's embedding is shared when the head ships
    none (or the same shape)."""
    config = read_config(folder)
    c = HeadConfig.from_config(config)
    lm = getattr(target, "language_model", target)
    inner = lm.model
    vocab = int(inner.embed_tokens.weight.shape[0])
    fit(c, int(inner.embed_tokens.weight.shape[1]), len(inner.layers), vocab, folder.name,
        target_name)
    weights: dict[str, mx.array] = {}
    for f in head_weight_files(folder):
        for k, v in mx.load(str(f)).items():
            name = _rename(k)
            if name is not None:
                weights[name] = v.astype(mx.int32) if name == "d2t" else v
    c = head_dim_of_weights(c, weights, folder.name)
    check_rope(c, folder.name)
    t2d = weights.pop("t2d", None)
    if c.draft_vocab_size == c.vocab_size and "d2t" not in weights:
        weights["d2t"] = mx.zeros((c.draft_vocab_size,), dtype=mx.int32)
    if "d2t" in weights:
        problems = vocab_map_problems(
            weights["d2t"].reshape(-1).tolist(),
            None if t2d is None else t2d.reshape(-1).astype(mx.uint8).tolist(),
            c.draft_vocab_size, vocab, target_name)
        if problems:
            raise EngineError(f"{folder.name}'s vocabulary map does not fit {target_name}: "
                              + "; ".join(problems))
    head = Eagle3Head(c, None if "embed_tokens.weight" in weights else inner.embed_tokens)
    if "lm_head.weight" not in weights and c.tie_word_embeddings:
        weights["lm_head.weight"] = (head.shared_embed or head.embed_tokens).weight
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise EngineError(f"{folder.name}: its weights do not fit its config ({exc})") from exc
    d2t = head.d2t
    compute.apply(head, policy)
    head.d2t = d2t.astype(mx.int32)  # ids, never converted
    return head


def head_bytes(head: Eagle3Head) -> int:
    """What one drafted token reads: the layers, fc and the head's output
    layer (its embedding only a row)."""
    own_embed = 0 if head.shared_embed is not None else head.embed_tokens.weight.nbytes
    return compute.param_bytes(head) - own_embed


class Eagle3Drafter(HeadDrafter):
    name = EAGLE3.name

    def __init__(self, head: Eagle3Head, target: CacheSlot):
        self.head = head
        self.layers = len(head.layers)
        lm_layers = len(target.runner.trunk.layers)
        self.read = head.config.read_layers(lm_layers)
        target.runner.tap_layers(self.read)
        self._rows = head.rows()
        self._rows_max = int(mx.max(self._rows).item())
        super().__init__(target)

    def bytes_per_token(self) -> int:
        return head_bytes(self.head)

    def features(self, tapped: dict) -> mx.array:
        return mx.concatenate([tapped[i] for i in self.read], axis=-1)

    def forward(self, tokens: mx.array, rows: mx.array, fed: bool) -> mx.array:
        return self.head(tokens, rows, self.cache, fed)

    def logits(self, out: mx.array) -> mx.array:
        return self.head.logits(out)

    def view(self, vocab: int) -> DraftHead:
        return DraftHead(None, None, vocab, rows=self._rows, rows_max=self._rows_max)
