"""A model's cache, how far it reaches, and how it goes back.

During a request a cache holds a prefix of the committed context, except
between a forward pass and the rewind that follows it: every feed extends
``length``, and whoever fed speculative tokens says how many positions to
keep (``rewind(n)``), by arithmetic, as mlx-lm's ``_rewind_cache`` does. The
token ids are recorded only for prefix reuse across requests: ``settle``
writes them at a request's end, ``sync_to`` compares them at the next one's
start.

Going back is per cache entry (one per layer). An entry that can drop its
last positions (mlx-lm's trimmable caches) drops them. One that cannot (a
recurrent state, ``ArraysCache``; a sliding window that has wrapped) goes
back to the checkpoint taken before the speculative feed, and the slot feeds
the kept tokens again. ``rollback.py`` says, per kind of entry, which of the
two it does.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specchat.engine import rollback, threads
from specchat.engine.runner import Runner

PREFILL_CHUNK = 512

Tokens = Sequence[int] | mx.array


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CacheSlot:
    def __init__(self, runner: Runner):
        self.runner = runner
        self.reset()

    def reset(self) -> None:
        self.cache = make_prompt_cache(self.runner.model)
        self.length = 0  # positions in the cache
        self.ids: list[int] = []  # their ids, as of the last settle (for prefix reuse)
        self._mark: rollback.Checkpoint | None = None
        self._fed: list[Tokens] = []  # what was fed since the checkpoint, in order
        self._plain = rollback.always_trimmable(self.cache)  # checkpoints are lengths

    # -- feeding -----------------------------------------------------------------------
    def _fed_now(self, tokens: Tokens) -> int:
        n = int(tokens.size) if isinstance(tokens, mx.array) else len(tokens)
        self.length += n
        if self._mark is not None and not self._plain:
            self._fed.append(tokens)
        return n

    def prefill(self, tokens: Sequence[int]) -> None:
        """Feed tokens without computing logits, in chunks to bound memory."""
        for start in range(0, len(tokens), PREFILL_CHUNK):
            threads.governor().tick()
            chunk = list(tokens[start : start + PREFILL_CHUNK])
            out = self.runner(chunk, self.cache, "none")
            mx.eval(out, rollback.state_arrays(self.cache))
            self._fed_now(chunk)

    def feed(self, tokens: Tokens, which: str = "all"):
        """Feed tokens (host ids, or a device array of them) and return
        logits (lazy)."""
        out = self.runner(tokens, self.cache, which)
        self._fed_now(tokens)
        return out

    def adopt(self, cache: list, length: int) -> None:
        """Take over a cache built elsewhere (ssd.py's branches) holding
        ``length`` positions of the context."""
        self.cache, self.length = cache, length
        self._mark, self._fed = None, []
        self._plain = rollback.always_trimmable(cache)

    # -- going back --------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Before a speculative feed: what ``rewind`` returns to when an
        entry cannot drop positions. Free for trimmable entries (a length);
        references to the recurrent states otherwise (MLX arrays are not
        written in place by those layers)."""
        self._mark = (rollback.Checkpoint(self.length, []) if self._plain
                      else rollback.checkpoint(self.cache, self.length))
        self._fed = []

    def rewind(self, keep: int) -> None:
        """Keep the first ``keep`` positions: drop what was fed past them."""
        drop = self.length - keep
        if drop <= 0:
            return
        if rollback.drop(self.cache, drop):
            self.length = keep
        elif self._mark is not None and self._mark.complete and keep >= self._mark.length:
            refeed = _first(self._fed, keep - self._mark.length)
            rollback.restore(self.cache, self._mark)
            self.length = self._mark.length
            self._fed = []
            if refeed is not None:
                out = self.runner(refeed, self.cache, "none")
                mx.eval(out, rollback.state_arrays(self.cache))
                self._fed_now(refeed)
        else:  # nothing to go back to: start again (prefix reuse lost)
            self.reset()
            return
        rollback.done(self.cache)

    def sync_to(self, context: Sequence[int], keep_last: bool = True) -> list[int]:
        """At a request's start: rewind to the longest reusable prefix of
        ``context`` and return the ids still to feed. With keep_last, at
        least one token is left to feed, since the next logits come from
        feeding it. A cache that cannot drop positions is reused only when
        it ends exactly on a prefix of ``context``."""
        n = common_prefix(self.ids, context)
        if keep_last and n == len(context):
            n -= 1
        self._mark = None
        self.rewind(n)
        if self.length != n:  # a cache that cannot go back was reset
            n = 0
        self.ids = list(context[:n])
        return list(context[n:])

    def settle(self, context: Sequence[int]) -> None:
        """At a request's end: the cache holds a prefix of ``context`` (what
        was fed past the committed tokens is dropped), recorded for the next
        request's prefix reuse."""
        self.rewind(min(self.length, len(context)))
        self._mark, self._fed = None, []
        self.ids = list(context[:self.length])

    @property
    def nbytes(self) -> int:
        return sum(getattr(c, "nbytes", 0) for c in self.cache)


def _first(fed: list[Tokens], n: int) -> Tokens | None:
    """The first n tokens fed since the checkpoint, as one feed."""
    if n <= 0:
        return None
    if all(not isinstance(t, mx.array) for t in fed):
        flat = [int(t) for chunk in fed for t in chunk]
        return flat[:n]
    parts = [t.reshape(-1).astype(mx.uint32) if isinstance(t, mx.array)
             else mx.array(list(t), dtype=mx.uint32) for t in fed]
    return mx.concatenate(parts)[:n]
