"""How each kind of cache entry goes back after a rejected draft block.

kv.CacheSlot asks two things of the entries of a model's cache (one per
layer): can every entry drop its last n positions (``drop``), and if not,
return to the checkpoint taken before the speculative feed (``checkpoint``,
``restore``), after which the slot feeds the kept tokens again.

- mlx-lm's trimmable entries (``KVCache``, ``QuantizedKVCache``,
  ``ChunkedKVCache``) drop positions: ``trim``.
- A sliding window: ``prepare`` replaces each ``RotatingKVCache`` a model
  makes with a ``WindowKVCache`` (window_kv.py), which keeps ``SLACK``
  positions past the window so that it can drop them after it has filled.
- ``ArraysCache`` (recurrent and convolution state: Gated DeltaNet, Mamba,
  short convolutions) has no positions to drop; its layers assign new
  arrays to it rather than writing into the old ones, so a checkpoint is a
  list of references, free to take, and restoring it is assigning them
  back; the slot then feeds the kept tokens again (kv.py).
- DeepSeek-V4's ``LayerCache`` (a window, compressed groups, an open
  group) also assigns new arrays to its attributes and never writes into
  them: a checkpoint is a copy of its attributes.
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
    RotatingKVCache,
)

from specchat.engine.window_kv import WindowKVCache

# Kinds that can always drop positions: a checkpoint of them is a length.
ALWAYS_TRIMMABLE = (KVCache, QuantizedKVCache, ChunkedKVCache, ConcatenateKVCache)
# Kinds (by class name; they live in their model's module) whose updates only
# assign new arrays to attributes: a checkpoint is a copy of the attributes.
REBOUND = frozenset({"LayerCache"})


@dataclass
class Checkpoint:
    length: int  # the slot's length when it was taken
    entries: list[Any]  # per cache entry: what restore needs
    complete: bool = True  # every entry can go back to it


class _Unmarked(Exception):
    """An entry of a kind that cannot go back to a checkpoint."""


def _swap(c):
    if isinstance(c, CacheList):
        c.caches = tuple(_swap(e) for e in c.caches)
        return c
    if type(c) is RotatingKVCache and c.keep == 0 and c.offset == 0:
        return WindowKVCache(c.max_size)
    return c


def prepare(cache: list) -> list:
    """A model's new cache, with every sliding window one that can go back."""
    return [_swap(c) for c in cache]


def _can_drop(c, n: int) -> bool:
    if isinstance(c, CacheList):
        return all(_can_drop(e, n) for e in c.caches)
    if isinstance(c, WindowKVCache):
        return c.can_trim(n)
    return c.is_trimmable()


def _drop(c, n: int) -> None:
    if isinstance(c, CacheList):
        for e in c.caches:
            _drop(e, n)
    else:
        c.trim(n)


def can_drop(cache: list, n: int) -> bool:
    return all(_can_drop(c, n) for c in cache)


def drop(cache: list, n: int) -> bool:
    """Drop the last n positions of every entry, if every entry can (else
    change nothing and return False)."""
    if not can_drop(cache, n):
        return False
    for c in cache:
        _drop(c, n)
    return True


def _mark(c) -> Any:
    if isinstance(c, CacheList):
        return [_mark(e) for e in c.caches]
    if isinstance(c, ArraysCache):
        return list(c.cache)
    if type(c) in ALWAYS_TRIMMABLE or isinstance(c, WindowKVCache):
        return c.offset
    if type(c).__name__ in REBOUND:
        return dict(vars(c))
    raise _Unmarked(type(c).__name__)


def checkpoint(cache: list, length: int) -> Checkpoint:
    try:
        return Checkpoint(length, [_mark(c) for c in cache])
    except _Unmarked:
        return Checkpoint(length, [], complete=False)


def unsupported(cache: list) -> list[str]:
    """The kinds of entries in a (prepared) cache that cannot go back at
    all; speculation needs every entry to."""
    def bad(c):
        if isinstance(c, CacheList):
            for e in c.caches:
                yield from bad(e)
        elif not (type(c) in ALWAYS_TRIMMABLE or isinstance(c, (WindowKVCache, ArraysCache))
                  or type(c).__name__ in REBOUND):
            yield type(c).__name__
    return sorted({name for c in cache for name in bad(c)})


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
    elif isinstance(mark, dict):  # REBOUND
        vars(c).clear()
        vars(c).update(mark)
    else:
        extra = c.offset - mark
        if extra > 0:
            c.trim(extra)


def _restorable(c, mark: Any) -> bool:
    if isinstance(c, CacheList):
        return all(_restorable(e, m) for e, m in zip(c.caches, mark, strict=True))
    if isinstance(c, WindowKVCache):
        return c.can_trim(c.offset - mark)
    return True


def restorable(cache: list, mark: Checkpoint) -> bool:
    """Whether ``cache`` can go back to ``mark`` (a window cannot go back
    further than its slack)."""
    return mark.complete and all(_restorable(c, m) for c, m in zip(cache, mark.entries,
                                                                    strict=True))


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
