"""A model's KV cache together with the token ids it holds.

Knowing the ids lets a new request reuse the longest common prefix (the
unchanged part of a conversation) instead of prefilling the whole history
every turn, and lets speculation rewind to exactly the accepted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from specchat.engine import threads
from specchat.engine.runner import Runner

PREFILL_CHUNK = 512


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CacheSlot:
    def __init__(self, runner: Runner):
        self.runner = runner
        self.cache = make_prompt_cache(runner.model)
        self.ids: list[int] = []

    def reset(self) -> None:
        self.cache = make_prompt_cache(self.runner.model)
        self.ids = []

    def rewind(self, n: int) -> None:
        """Keep only the first n cached tokens."""
        drop = len(self.ids) - n
        if drop <= 0:
            return
        if can_trim_prompt_cache(self.cache):
            trim_prompt_cache(self.cache, drop)
            del self.ids[n:]
        else:
            self.reset()

    def sync_to(self, context: Sequence[int], keep_last: bool = True) -> list[int]:
        """Rewind to the longest reusable prefix of ``context``; return the ids
        still to feed. With keep_last, at least one token is left to feed, since
        the next logits come from feeding it."""
        n = common_prefix(self.ids, context)
        if keep_last and n == len(context):
            n -= 1
        self.rewind(n)
        if len(self.ids) != n:  # untrimmable cache was reset
            n = 0
        return list(context[n:])

    def prefill(self, tokens: Sequence[int]) -> None:
        """Feed tokens without computing logits, in chunks to bound memory."""
        for start in range(0, len(tokens), PREFILL_CHUNK):
            threads.governor().tick()
            chunk = list(tokens[start : start + PREFILL_CHUNK])
            out = self.runner(chunk, self.cache, "none")
            mx.eval(out, [c.state for c in self.cache])
            self.ids.extend(chunk)

    def feed(self, tokens: Sequence[int] | mx.array, which: str = "all", ids: Sequence[int] | None = None):
        """Feed tokens and return logits (lazy). ``ids`` are the host-side ids
        when ``tokens`` is a device array."""
        out = self.runner(tokens, self.cache, which)
        self.ids.extend(ids if ids is not None else list(tokens))
        return out

    @property
    def nbytes(self) -> int:
        return sum(getattr(c, "nbytes", 0) for c in self.cache)
