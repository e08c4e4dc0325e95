"""EAGLE-3 draft heads (Li et al., 2025): one transformer layer that reads
three of the target's layers and drafts at a few percent of a target forward.

A head is its own folder (a Hub download, or one ``specchat heads train``
wrote): ``config.json`` and safetensors, in EAGLE-3's own layout or vLLM's
``speculators``. eagle3_format.py reads and checks it (config, weights'
shapes, vocabulary map, fit to a target) before anything here is built,
with the library's rules and words; this module builds and runs it.

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

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.rope_utils import initialize_rope

from specchat.engine import compute
from specchat.engine.drafter_kinds import EAGLE3
from specchat.engine.drafters import Build
from specchat.engine.drafting import DraftHead
from specchat.engine.eagle3_format import (
    READS,
    Head,
    HeadConfig,
    Target,
    fit_problem,
    map_problem,
    rename,
    rope_refusal,
)
from specchat.engine.errors import EngineError
from specchat.engine.folders import model_name
from specchat.engine.head_drafter import HeadDrafter
from specchat.engine.kv import CacheSlot
from specchat.engine.loading import load_renamed, loaded_head


def make_rope(c: HeadConfig) -> nn.Module:
    """The head's rotary embedding, built by mlx-lm's own
    ``initialize_rope`` from its config, as mlx-lm builds a Llama layer's
    (a Llama 3.1 head's "llama3" scaling, YaRN, linear and the rest)."""
    return initialize_rope(c.head_dim, c.rope_theta, c.rope_traditional, c.rope_scaling,
                           c.max_position_embeddings)


def check_rope(c: HeadConfig, name: str) -> None:
    """Build and apply the head's rope once: eagle3_format refuses the
    scalings mlx-lm cannot build by its table; this catches what only
    building shows, in the same words."""
    try:  # built and applied once: some scalings fail only when applied
        mx.eval(make_rope(c)(mx.zeros((1, 1, 2, c.head_dim)), offset=1))
    except (ValueError, KeyError, TypeError, AssertionError, ArithmeticError) as exc:
        scaling = c.rope_scaling or {}
        kind = scaling.get("type") or scaling.get("rope_type") or "default"
        why = f"it lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        raise EngineError(rope_refusal(name, str(kind), why)) from exc


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
        self.fc = nn.Linear(READS * c.target_hidden_size, c.hidden_size, bias=False)
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

    def published_weights(self, draft_ids: list[int], vocab: int) -> dict[str, mx.array]:
        """Its weights as a head folder holds them (the published layout
        eagle3_format reads): the layers, and the map from its draft ids to
        the target's ``vocab`` ids (d2t offsets, a t2d mask)."""
        out = {k: v for k, v in tree_flatten(self.parameters()) if k != "d2t"}
        ids = mx.array(draft_ids, dtype=mx.int64)
        out["d2t"] = ids - mx.arange(len(draft_ids), dtype=mx.int64)
        t2d = mx.zeros((vocab,), dtype=mx.bool_)
        t2d[ids] = True
        out["t2d"] = t2d
        return out


def load_head(head: Head, target, policy, name: str, target_name: str) -> Eagle3Head:
    """A head's module from its checked folder (eagle3_format.read), checked
    against a loaded target, in the policy's dtype. The target's embedding
    is shared when the head ships none."""
    lm = getattr(target, "language_model", target)
    inner = lm.model
    facts = Target(target_name, int(inner.embed_tokens.weight.shape[1]), len(inner.layers),
                   int(inner.embed_tokens.weight.shape[0]))
    problem = fit_problem(head.facts(), facts, name) or map_problem(head, facts, name)
    if problem:
        raise EngineError(problem)
    c = head.config
    check_rope(c, str(head.folder))
    # d2t and t2d were read as ids with the files' check: d2t goes in below
    weights = load_renamed(head.files, head.folder,
                           lambda k: None if (n := rename(k)) in ("d2t", "t2d") else n)
    d2t = head.d2t if head.d2t is not None else [0] * c.draft_vocab_size
    weights["d2t"] = mx.array(d2t, dtype=mx.int32)
    module = Eagle3Head(c, None if head.own_embedding else inner.embed_tokens)
    if "lm_head.weight" not in weights:  # tied (eagle3_format.check_weights allows it then)
        weights["lm_head.weight"] = (module.shared_embed or module.embed_tokens).weight
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:  # eagle3_format checked the shapes: the files changed since
        raise EngineError(f"{head.folder}: its weights do not fit its config ({exc})") from exc
    d2t = module.d2t
    compute.apply(module, policy)
    module.d2t = d2t.astype(mx.int32)  # ids, never converted
    return module


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
        self.tap_layers = tuple(self.read)
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
        return DraftHead(vocab, rows=self._rows, rows_max=self._rows_max)


def build(b: Build) -> Eagle3Drafter:
    """drafter_kinds.EAGLE3's maker: the head whose folder eagle3_format
    read and checked (``b.files``), checked against the loaded target in
    words, drafting from the target's own hidden states."""
    folder = b.files.folder
    name = model_name(folder)
    b.say(f"loading the draft head {name}")
    head = load_head(b.files, b.target.model, b.compute, name, b.target.info.name)
    drafter = Eagle3Drafter(head, b.cache)
    drafter.loaded = loaded_head(head, folder, EAGLE3.name, head_bytes(head),
                                 head.config.vocab_size, b.target.tokenizer)
    return drafter
