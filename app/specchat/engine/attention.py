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
module's globals. ``use`` gives a loaded model's modules whose class calls
it a subclass whose methods are the same code read against a copy of those
globals with the wrapper in its place, and the engine gives them their own
classes back when it unloads the model: no module or class of mlx-lm's
changes, and another model in the process (the bench's mlx-lm runs, one
loaded under ``SPECCHAT_ATTENTION=mlx``) keeps mlx-lm's attention. The
wrapper takes the block path only where it computes what MLX's fallback
computes: two rows or more, a causal mask or none, no attention sinks, no
quantized cache, no fewer keys than rows; a single row above all goes to
mlx-lm's function. Loading applies the compute policy's choice (compute.py:
the block path on the CPU, never on a GPU, where MLX's kernel is fused),
and ``stock()`` turns it off for a stretch of code (the bench's mlx-lm
runs). The EAGLE-3 head's own layer calls mlx-lm's function directly.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

NAME = "scaled_dot_product_attention"  # what mlx-lm's model files call
_state = {"off": 0}  # stock() depth: the engine thread's (the ssd worker only reads it)
_BLOCKED: dict[type, type | None] = {}  # a class's subclass with the block path, if any
_GLOBALS: dict[str, dict] = {}  # an mlx-lm module's globals with the wrapper


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


def wrap(base: Callable) -> Callable:
    """mlx-lm's attention function ``base`` as the loaded model's modules
    call it: the block path where it computes what MLX's fallback computes
    (the cases the module docstring lists), ``base`` with its arguments as
    given everywhere else. Public: each case of that rule is tested on
    arguments a real model would not all produce."""

    def scaled_dot_product_attention(queries, keys, values_, cache, scale, mask, sinks=None):
        causal = isinstance(mask, str) and mask == "causal"
        if (_state["off"] or queries.shape[2] < 2 or sinks is not None
                or hasattr(cache, "bits") or not (mask is None or causal)
                or queries.shape[1] % keys.shape[1] or keys.shape[2] < queries.shape[2]
                or queries.dtype != keys.dtype):
            return base(queries, keys, values_, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return block_attention(queries, keys, values_, scale, causal=causal)

    return scaled_dot_product_attention


def _calls(code: types.CodeType) -> bool:
    """Whether a function's code (nested functions included) names NAME."""
    return NAME in code.co_names or any(
        isinstance(c, types.CodeType) and _calls(c) for c in code.co_consts)


def _with_blocks(fn: types.FunctionType) -> types.FunctionType | None:
    """``fn`` read against its module's globals with the wrapper, if it is
    one of mlx-lm's and calls the attention of its module's."""
    name = fn.__module__ or ""
    module = sys.modules.get(name)
    base = getattr(module, NAME, None)
    if not name.startswith("mlx_lm.") or base is None or not _calls(fn.__code__):
        return None
    if name not in _GLOBALS:
        _GLOBALS[name] = {**vars(module), NAME: wrap(base)}
    out = types.FunctionType(fn.__code__, _GLOBALS[name], fn.__name__, fn.__defaults__,
                             fn.__closure__)
    out.__kwdefaults__, out.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return out


def _blocked(cls: type) -> type | None:
    """The subclass of ``cls`` whose methods take the block path (made
    once per class), or None when none of its methods calls attention."""
    if cls not in _BLOCKED:
        methods, seen = {}, set()
        for klass in cls.__mro__:
            for key, fn in vars(klass).items():
                if key in seen:
                    continue
                seen.add(key)
                if isinstance(fn, types.FunctionType) and (new := _with_blocks(fn)) is not None:
                    methods[key] = new
        _BLOCKED[cls] = type(f"Blocks{cls.__name__}", (cls,), methods) if methods else None
    return _BLOCKED[cls]


def use(model: nn.Module, blocks: bool) -> Callable[[], None]:
    """Apply the policy's choice to ``model``: with ``blocks``, each of its
    modules whose class calls mlx-lm's attention gets that class's subclass
    with the block path. Returns what gives them their own classes back
    (the engine calls it when the model unloads)."""
    swapped = []
    for m in model.modules() if blocks else ():
        cls = type(m)
        sub = _blocked(cls)
        if sub is not None:
            m.__class__ = sub
            swapped.append((m, cls))

    def undo() -> None:
        while swapped:
            m, cls = swapped.pop()
            m.__class__ = cls

    return undo


@contextmanager
def stock() -> Iterator[None]:
    """mlx-lm's attention everywhere while inside (the bench's mlx-lm runs)."""
    _state["off"] += 1
    try:
        yield
    finally:
        _state["off"] -= 1
