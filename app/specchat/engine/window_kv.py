"""A sliding-window KV cache that can drop its last positions, after the
window has filled too.

mlx-lm's ``RotatingKVCache`` keeps exactly the window, overwriting the
oldest position in place: once it has wrapped, a rejected draft block has
overwritten positions the window still needs, so it cannot be trimmed (and
mlx-lm refuses to speculate). This cache keeps the positions in order and
``slack`` more than the window, dropping the oldest only when its buffer
grows, so up to ``slack`` positions can always be dropped again: the
window of every later query is still there. Attention is limited to the
window by the mask (``make_mask``), as the rotating cache's own mask does
when its buffer is larger than the window.

Memory: ``slack`` positions, plus up to one growth step (at most 256, at
most the window), more than the window, per sliding layer. ``rollback.prepare`` puts one in place of each
``RotatingKVCache`` a model makes (all of mlx-lm's sliding-window models
make them with ``keep=0``, no attention sink).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import _BaseCache

SLACK = 32  # positions past the window: more than the longest verify block (24 + 1)


class WindowKVCache(_BaseCache):
    def __init__(self, window: int, slack: int = SLACK):
        self.window = window
        self.slack = slack
        self.step = max(16, min(256, window))  # growth: at most a window more memory
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # positions seen (what RoPE reads)
        self.start = 0  # the position of stored index 0

    @property
    def stored(self) -> int:
        return self.offset - self.start

    def _forgets(self, n: int) -> int | None:
        """How many of the oldest positions feeding n more will forget (the
        buffer grows then, and keeps window + slack of what it held), or
        None if it has room. The mask, made before the feed, needs it too."""
        prev = self.stored
        if self.keys is not None and prev + n <= self.keys.shape[2]:
            return None
        return max(0, prev - (self.window + self.slack))

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n = keys.shape[2]
        prev = self.stored
        old = self._forgets(n)
        if old is not None:
            size = ((prev - old + n + self.step - 1) // self.step) * self.step
            B, heads, _, kd = keys.shape
            new_k = mx.zeros((B, heads, size, kd), keys.dtype)
            new_v = mx.zeros((B, heads, size, values.shape[3]), values.dtype)
            if self.keys is not None and prev > old:
                new_k[..., :prev - old, :] = self.keys[..., old:prev, :]
                new_v[..., :prev - old, :] = self.values[..., old:prev, :]
            self.keys, self.values = new_k, new_v
            self.start += old
            prev -= old
        self.keys[..., prev:prev + n, :] = keys
        self.values[..., prev:prev + n, :] = values
        self.offset += n
        return self.keys[..., :prev + n, :], self.values[..., :prev + n, :]

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        """Each query sees the keys of its window, which may be fewer than
        the cache holds (the slack)."""
        window = min(window_size or self.window, self.window)
        prev = self.stored - (self._forgets(N) or 0)
        if prev + N <= window and not return_array:
            return None if N == 1 else "causal"
        return create_causal_mask(N, prev, window_size=window)

    def size(self) -> int:
        return self.offset

    def can_trim(self, n: int) -> bool:
        """Whether n positions can go with every later query's window intact."""
        after = self.offset - n
        return n <= self.stored and self.start <= max(0, after - self.window + 1)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.stored, n)
        self.offset -= n
        return n

    @property
    def state(self):
        k, v = self.keys, self.values
        if k is not None:
            k, v = k[..., :self.stored, :], v[..., :self.stored, :]
        return k, v

    @state.setter
    def state(self, v) -> None:
        self.keys, self.values = v
        self.start = 0
        self.offset = 0 if self.keys is None else self.keys.shape[2]

    @property
    def meta_state(self):
        return tuple(map(str, (self.window, self.slack, self.offset, self.start)))

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
