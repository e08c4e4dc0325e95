"""Attention over a block of rows on the CPU, where MLX's own is slow.

Every verify step feeds the target two rows or more, and so does every
draft-model catch-up and prefill chunk. On the CPU, MLX's
``mx.fast.scaled_dot_product_attention`` has no kernel for that: it falls
back to plain ops that broadcast the keys over each group of query heads,
so a grouped-query model runs one small product per query head. For one row
that costs 0.14-0.39 ms a layer here, for two rows 1.5-1.6 ms: about 50 of
the 167 ms a verify's second token costs the bundled 1.5B target
(docs/bench/journal.md, "Where the jump from one verified token to two goes").
Folding the heads that share a key head into the rows of one product does
the same arithmetic as one product per key head (0.41-0.61 ms).

mlx-lm's model files call ``scaled_dot_product_attention`` from their own
module's globals (``from .base import scaled_dot_product_attention``), so
``use`` wraps that name in the module of a loaded model. The wrapper takes
the block path only where it computes what MLX's fallback computes: two rows
or more, a causal mask or none, no attention sinks, no quantized cache, no
fewer keys than rows. Everything else, a single row above all, goes to mlx-lm's
function unchanged. Loading a model applies the compute policy's choice
(compute.py: the block path on the CPU, never on a GPU, where MLX's kernel is
fused; ``SPECCHAT_ATTENTION=mlx`` keeps MLX's, to compare the two). The
wrapper, once in a module, stays for the process, so the choice is a flag it
reads, and ``stock()`` turns the block path off for a stretch of code: the
bench times mlx-lm's generators as mlx-lm ships them. The EAGLE-3 head's own
layer (eagle3.py) calls mlx-lm's function directly and is not wrapped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

_MARK = "_specchat_blocks"  # set on the wrapper: a module is wrapped once
# "on": the policy's choice, set at each load (a process has one policy);
# "off": stock() depth. Only the engine thread runs forwards of a loaded
# model's attention (the ssd worker reads the flags, never sets them).
_state = {"on": False, "off": 0}


def block_attention(queries: mx.array, keys: mx.array, vals: mx.array, scale: float,
                    causal: bool) -> mx.array:
    """softmax(q k^T * scale, causal) v for queries [B, H, L, D] and keys and
    values [B, Hkv, S, D], with H a multiple of Hkv. The query heads that
    share a key head become rows of one product, so each key head's keys are
    read once. Rows are the last L positions of the S keys (the cache holds
    the block), as in MLX's fallback."""
    b, h, rows, d = queries.shape
    hkv, s = keys.shape[1], keys.shape[2]
    group = h // hkv
    q = (queries * mx.array(scale, queries.dtype)).reshape(b, hkv, group * rows, d)
    scores = q @ keys.swapaxes(-1, -2)  # [B, Hkv, group * L, S]
    if causal:
        offset = s - rows
        allowed = mx.arange(offset, offset + rows)[:, None] >= mx.arange(s)[None]
        scores = scores.reshape(b, hkv, group, rows, s)
        scores = mx.where(allowed, scores, mx.array(-mx.inf, scores.dtype))
        scores = scores.reshape(b, hkv, group * rows, s)
    weights = mx.softmax(scores, axis=-1, precise=True)
    out = weights @ vals  # [B, Hkv, group * L, Dv]
    return out.reshape(b, h, rows, vals.shape[-1])


def _wrap(base: Callable) -> Callable:
    def scaled_dot_product_attention(queries, keys, values_, cache, scale, mask, sinks=None):
        causal = isinstance(mask, str) and mask == "causal"
        if (not _state["on"] or _state["off"] or queries.shape[2] < 2 or sinks is not None
                or hasattr(cache, "bits") or not (mask is None or causal)
                or queries.shape[1] % keys.shape[1] or keys.shape[2] < queries.shape[2]
                or queries.dtype != keys.dtype):
            return base(queries, keys, values_, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return block_attention(queries, keys, values_, scale, causal=causal)

    setattr(scaled_dot_product_attention, _MARK, base)
    return scaled_dot_product_attention


def use(model: nn.Module, blocks: bool) -> bool:
    """Apply the policy's choice: with ``blocks``, wrap the attention of the
    mlx-lm module(s) ``model`` is built from (a wrapper model's language
    model may live in another module) and turn the block path on; without,
    turn it off for every wrapped module. True if ``model`` now takes it."""
    _state["on"] = blocks
    if not blocks:
        return False
    done = False
    for module_name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(module_name)
        base = getattr(module, "scaled_dot_product_attention", None)
        if module is None or not module_name.startswith("mlx_lm.") or base is None:
            continue
        if not hasattr(base, _MARK):
            module.scaled_dot_product_attention = _wrap(base)
        done = True
    return done


@contextmanager
def stock() -> Iterator[None]:
    """mlx-lm's attention everywhere while inside (the bench's mlx-lm runs)."""
    _state["off"] += 1
    try:
        yield
    finally:
        _state["off"] -= 1
