"""A model's forward pass, split into trunk and head where that is safe.

mlx-lm's ``Model.__call__`` computes logits for every input position. During
prefill we need none of them, and when a drafter catches up on several
accepted tokens we need only the last; the vocabulary projection is the
largest single matmul in small models (Qwen2.5-0.5B: 136M of 494M weights),
so skipping it where unused is a real saving. For architectures whose
``__call__`` is exactly ``head(model.model(x))`` we call the two halves
ourselves; anything else falls back to the full call. Gemma 4's head
soft-caps its logits (``final_logit_softcapping``): its head here is the
projection and mlx-lm's own cap, so its trunk's output (the final hidden
states, after the norm) is there to tap as every split model's is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gemma4_text import logit_softcap

from specchat.engine import folders
from specchat.engine.compute import param_bytes

# model_type values whose Model.__call__ is `head(self.model(inputs, cache))`
# with no logit scaling or soft-capping (checked against mlx-lm's sources).
_SPLIT_SAFE = {"llama", "qwen2", "qwen3", "mistral", "smollm3", "qwen3_next", "qwen3_5",
               "qwen3_5_moe"}
# model_type values whose Model.__call__ is `softcap(head(self.model(inputs, cache)))`,
# with the cap its ``final_logit_softcapping`` (mlx-lm's gemma4_text).
_SOFTCAPPED = {"gemma4_text", "gemma4"}
# model_type values whose Model wraps the language model it runs
# (``Model.language_model``): its trunk and head are that one's.
_WRAPPED = {"qwen3_5", "qwen3_5_moe", "gemma4"}

Which = Literal["none", "last", "all", "hidden"]


class CappedHead(nn.Module):
    """An output layer whose logits are soft-capped, ``cap * tanh(x / cap)``
    (Gemma 4), computed by mlx-lm's own function: the tied embedding's
    ``as_linear`` or the ``lm_head``, then the cap."""

    def __init__(self, project: nn.Module, cap: float):
        super().__init__()
        self.project = project
        self.cap = cap

    def __call__(self, h: mx.array) -> mx.array:
        p = self.project
        return logit_softcap(self.cap, p.as_linear(h) if hasattr(p, "as_linear") else p(h))


def embedding_rows(model: nn.Module, config: dict | None = None) -> int | None:
    """How many token ids the model can embed (its padded vocabulary)."""
    inner = getattr(model, "model", None)
    emb = getattr(inner, "embed_tokens", None) if inner is not None else None
    weight = getattr(emb, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    rows = folders.text_config(config or {}).get("vocab_size")
    return int(rows) if rows else None


class Runner:
    def __init__(self, model: nn.Module, model_type: str, config: dict | None = None):
        self.model = model
        self.trunk = None
        self.head = None
        # While set, each forward keeps its final hidden states [L, H] in
        # ``tapped["final"]``, and those of the layers being recorded
        # (``recording``) under their index (kv.CacheSlot hands them to a
        # drafter that reads them: mtp.py, eagle3.py).
        self.tap = False
        self.tapped: dict | None = None
        lm = model.language_model if model_type in _WRAPPED else model
        if model_type in _SPLIT_SAFE | _SOFTCAPPED and hasattr(lm, "model"):
            tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", False)
            project = lm.model.embed_tokens if tied else getattr(lm, "lm_head", None)
            cap = getattr(lm, "final_logit_softcapping", None) if model_type in _SOFTCAPPED \
                else None
            if project is not None:
                self.trunk = lm.model
                self.head = (CappedHead(project, cap) if cap is not None
                             else project.as_linear if tied else project)
        # An embedding lookup does not check its ids: one past the table reads
        # whatever memory follows. A draft can be handed such ids when the
        # target's padded vocabulary is wider than the draft's (or the other
        # way round), so ids are clamped into range. Correctness does not
        # depend on what a clamped id means: the draft's proposals are all
        # verified, and the target never proposes ids it cannot embed.
        self.rows = embedding_rows(model, config)

    @property
    def split(self) -> bool:
        return self.trunk is not None

    def _ids(self, tokens: list[int] | mx.array) -> mx.array:
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens, dtype=mx.uint32)
        if self.rows is not None:
            x = mx.minimum(x, self.rows - 1)
        return x[None]

    def __call__(self, tokens: list[int] | mx.array, cache, which: Which = "all"):
        """Feed tokens through the model, extending ``cache``.

        Returns [L, V] logits for "all", [1, V] for "last", the last final
        hidden state [1, H] for "hidden" (split models only: a drafter's
        pruned head projects it); for "none" a small array whose evaluation
        forces the cache writes (no head computed).
        """
        x = self._ids(tokens)
        if self.trunk is None:
            logits = self.model(x, cache=cache)[0]
            return logits if which == "all" else logits[-1:]
        if self.tap:
            self.tapped = {}
        h = self.trunk(x, cache)[0]
        if self.tap:
            self.tapped["final"] = h
        if which in ("none", "hidden"):
            return h[-1:]
        if which == "last":
            h = h[-1:]
        return self.head(h)

    def tapped_forward(self, tokens: list[int] | mx.array, cache, which: Which = "all",
                       layers: Sequence[int] = ()):
        """``self(tokens, cache, which)`` with the tap on for this forward
        only, recording ``layers`` too: (its output, the outputs it tapped).
        For callers outside a CacheSlot (head training, timing, read-back),
        which sets the tap per forward itself."""
        was = self.tap
        self.tap = True
        try:
            with self.recording(layers):
                return self(tokens, cache, which), self.tapped
        finally:
            self.tap, self.tapped = was, None

    @contextmanager
    def recording(self, ids: Sequence[int]) -> Iterator[None]:
        """While inside, the trunk's layers ``ids`` keep their outputs in
        ``tapped`` too when the tap is on (an EAGLE-3 head reads three): each
        layer object gets a subclass of its class that records, and its own
        class back on the way out. No other model is touched."""
        layers = self.trunk.layers if ids else []
        swapped = []
        try:
            for i in dict.fromkeys(ids):  # a head may read a layer twice
                layer = layers[i]
                base = type(layer)

                def call(module, *args, _base=base, _i=i, **kwargs):
                    out = _base.__call__(module, *args, **kwargs)
                    if self.tapped is not None:
                        self.tapped[_i] = (out[0] if isinstance(out, tuple) else out)[0]
                    return out

                layer.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": call})
                swapped.append((layer, base))
            yield
        finally:
            for layer, base in reversed(swapped):
                layer.__class__ = base

    def hidden(self, tokens: list[int] | mx.array, cache) -> mx.array:
        """Final hidden states [L, H] (only for split-safe models)."""
        return self.trunk(self._ids(tokens), cache)[0]

    def bytes_per_token(self) -> int:
        """Weight bytes one decoding step reads: everything except an untied
        input embedding, of which a step reads only a row. Single-sequence
        decoding is bandwidth-bound, so this is its cost up to a constant."""
        total = param_bytes(self.model)
        args = getattr(self.model, "args", None)
        inner = getattr(self.model, "model", None)
        emb = getattr(inner, "embed_tokens", None) if inner is not None else None
        if emb is not None and not getattr(args, "tie_word_embeddings", True):
            total -= param_bytes(emb)
        return total

    def head_bytes(self) -> int:
        """Weight bytes of the output layer (what a drafter reading it out,
        the MTP head, pays per token)."""
        if not self.split:
            return 0
        owner = self.head.__self__ if hasattr(self.head, "__self__") else self.head
        return param_bytes(owner)

    def head_weight(self) -> mx.array | None:
        """The [V, H] projection matrix, if the head is a plain (unquantized)
        one: not soft-capped, since whoever projects with it would leave
        the cap out."""
        if not self.split or isinstance(self.head, CappedHead):
            return None
        if isinstance(self.head, nn.Linear):
            return self.head.weight
        emb = self.trunk.embed_tokens  # a tied head: the embedding's as_linear
        return emb.weight if isinstance(emb, nn.Embedding) else None

    def output_rows(self, rows: mx.array) -> mx.array | None:
        """The output layer's rows for the ids ``rows`` in float32,
        dequantized from a 4- or 8-bit layer (most MLX models on the Hub);
        None for a layer of another kind (a trained head starts from them)."""
        w = self.head_weight()
        if w is not None:
            return w[rows].astype(mx.float32)
        layer = getattr(self.head, "__self__", self.head)  # a tied head: the embedding's
        if isinstance(layer, nn.QuantizedLinear | nn.QuantizedEmbedding):
            biases = layer.biases[rows] if getattr(layer, "biases", None) is not None else None
            return mx.dequantize(layer.weight[rows], layer.scales[rows], biases,
                                 group_size=layer.group_size, bits=layer.bits,
                                 mode=getattr(layer, "mode", "affine")).astype(mx.float32)
        return None
