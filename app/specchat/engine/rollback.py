"""How each kind of cache entry goes back after a rejected draft block.

kv.CacheSlot asks two things of the entries of a model's cache (one per
layer): can every entry drop its last n positions (``drop``), and if not,
return to the checkpoint taken before the speculative feed (``checkpoint``,
``restore``), after which the slot feeds the kept tokens again.

- mlx-lm's trimmable entries (``KVCache``, a ``RotatingKVCache`` that has
  not wrapped, ``QuantizedKVCache``, ``ChunkedKVCache``) drop positions:
  ``trim``.
- ``ArraysCache`` (recurrent and convolution state: Mamba, Gated DeltaNet)
  has no positions to drop; its layers assign new arrays to it rather than
  writing into the old ones, so a checkpoint is a list of references, free
  to take, and restoring it is assigning them back.
- ``CacheList`` is its entries, each by its own rule.

An entry of any other kind cannot go back: the slot starts again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
)

# Kinds that can always drop positions: a checkpoint of them is a length.
ALWAYS_TRIMMABLE = (KVCache, QuantizedKVCache, ChunkedKVCache, ConcatenateKVCache)


@dataclass
class Checkpoint:
    length: int  # the slot's length when it was taken
    entries: list[Any]  # per cache entry: what restore needs
    complete: bool = True  # every entry can go back to it


class _Unmarked(Exception):
    """An entry of a kind that cannot go back to a checkpoint."""


def _can_drop(c, n: int) -> bool:
    if isinstance(c, CacheList):
        return all(_can_drop(e, n) for e in c.caches)
    return c.is_trimmable()


def _drop(c, n: int) -> None:
    if isinstance(c, CacheList):
        for e in c.caches:
            _drop(e, n)
    else:
        c.trim(n)


def drop(cache: list, n: int) -> bool:
    """Drop the last n positions of every entry, if every entry can (else
    change nothing and return False)."""
    if not all(_can_drop(c, n) for c in cache):
        return False
    for c in cache:
        _drop(c, n)
    return True


def _mark(c) -> Any:
    if isinstance(c, CacheList):
        return [_mark(e) for e in c.caches]
    if isinstance(c, ArraysCache):
        return list(c.cache)
    if type(c) in ALWAYS_TRIMMABLE:
        return c.size()
    raise _Unmarked(type(c).__name__)


def checkpoint(cache: list, length: int) -> Checkpoint:
    try:
        return Checkpoint(length, [_mark(c) for c in cache])
    except _Unmarked:
        return Checkpoint(length, [], complete=False)


def always_trimmable(cache: list) -> bool:
    """Whether every entry can always drop positions (then checkpoints need
    no per-entry marks: a plain transformer's cache)."""
    def ok(c) -> bool:
        if isinstance(c, CacheList):
            return all(ok(e) for e in c.caches)
        return type(c) in ALWAYS_TRIMMABLE
    return all(ok(c) for c in cache)


def _restore(c, mark: Any) -> None:
    if isinstance(c, CacheList):
        for e, m in zip(c.caches, mark, strict=True):
            _restore(e, m)
    elif isinstance(c, ArraysCache):
        c.cache = list(mark)
    else:
        extra = c.size() - mark
        if extra > 0:
            c.trim(extra)


def restore(cache: list, mark: Checkpoint) -> None:
    for c, m in zip(cache, mark.entries, strict=True):
        _restore(c, m)


def done(cache: list) -> None:
    """After a rewind: nothing to forget for these kinds."""


def state_arrays(cache: list) -> list[mx.array]:
    """Every array a cache holds, to evaluate after a feed."""
    out: list[mx.array] = []

    def walk(v) -> None:
        if isinstance(v, mx.array):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    for c in cache:
        walk(c.state)
    return out
