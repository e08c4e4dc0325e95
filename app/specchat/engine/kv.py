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

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specchat.engine import rollback, threads
from specchat.engine.prompt_cache import common_prefix
from specchat.engine.runner import Runner

PREFILL_CHUNK = 512

Tokens = Sequence[int] | mx.array


@dataclass(frozen=True)
class HiddenTap:
    """What a drafter reads of the target's forwards (head_drafter.py): the
    final hidden states and the outputs of ``layers``, handed to ``collect``
    with the first position each forward fed."""

    layers: tuple[int, ...]
    collect: Callable[[int, dict], None]


class CacheSlot:
    """A model's cache and how far it reaches: ``length`` positions, of
    which the last ``pending`` are not fed yet (see ``rewind``)."""

    def __init__(self, runner: Runner):
        self.runner = runner
        # Called with (first position, what the runner tapped) after every
        # forward while a request's drafter reads the target (``tapped``).
        self.on_hidden: Callable[[int, dict], None] | None = None
        self.reset()

    def reset(self) -> None:
        self.cache = rollback.prepare(make_prompt_cache(self.runner.model))
        self.length = 0  # positions the cache stands for, pending ones included
        self.reused = 0  # positions the last sync_to kept
        self.ids: list[int] = []  # their ids, as of the last settle (for prefix reuse)
        self._pending: list[Tokens] = []  # kept after a rewind, fed with the next forward
        self.pending = 0  # how many tokens _pending holds
        self._mark: rollback.Checkpoint | None = None
        self._tail: list[Tokens] = []  # every token past the checkpoint, in order
        self._prompt: rollback.Checkpoint | None = None  # where the last prompt ended
        self._plain = rollback.always_trimmable(self.cache)  # checkpoints are lengths

    @property
    def fed(self) -> int:
        """Positions really in the cache (``length`` less the pending ones)."""
        return self.length - self.pending

    # -- feeding -----------------------------------------------------------------------
    def _take_pending(self, tokens: Tokens) -> tuple[Tokens, int]:
        """``tokens`` with the pending ones before them, and how many those were."""
        n = self.pending
        if not n:
            return tokens, 0
        joined = _first([*self._pending, tokens], n + _count(tokens))
        self._pending, self.pending = [], 0
        return joined, n

    def _fed_now(self, tokens: Tokens) -> None:
        self.length += _count(tokens)
        if self._mark is not None and not self._plain:
            self._tail.append(tokens)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Feed tokens without computing logits, in chunks to bound memory."""
        tokens = list(tokens)
        for start in range(0, len(tokens), PREFILL_CHUNK):
            threads.governor().tick()
            chunk = tokens[start : start + PREFILL_CHUNK]
            start = self.fed
            x, _ = self._take_pending(chunk)
            out = self._run(x, "none", start)
            mx.eval(out, rollback.state_arrays(self.cache))
            self._fed_now(chunk)

    def feed(self, tokens: Tokens, which: str = "all"):
        """Feed tokens (host ids, or a device array of them) and return
        logits (lazy): for "all" one row per token of ``tokens``."""
        start = self.fed
        x, before = self._take_pending(tokens)
        out = self._run(x, which, start)
        if which == "all" and before:
            out = out[before:]
        self._fed_now(tokens)
        return out

    def _run(self, x: Tokens, which: str, start: int):
        """One forward of what is physically fed (pending tokens first, from
        position ``start``), handing its hidden states to ``on_hidden``."""
        self.runner.tap = self.on_hidden is not None
        out = self.runner(x, self.cache, which)
        if self.on_hidden is not None and self.runner.tapped is not None:
            self.on_hidden(start, self.runner.tapped)
        self.runner.tapped = None
        return out

    @contextmanager
    def tapped(self, tap: HiddenTap | None) -> Iterator[None]:
        """Every forward's hidden states go to ``tap`` while inside (a
        request), and only then are its layers recorded (Runner.recording)."""
        if tap is None:
            yield
            return
        with self.runner.recording(tap.layers):
            self.on_hidden = tap.collect
            try:
                yield
            finally:
                self.on_hidden = None

    def adopt(self, cache: list, length: int) -> None:
        """Take over a cache built elsewhere (ssd/'s branches) holding
        ``length`` positions of the context."""
        self.cache, self.length = cache, length
        self._pending, self.pending = [], 0
        self._mark, self._tail = None, []
        self._plain = rollback.always_trimmable(cache)

    # -- going back --------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Before a speculative feed: what ``rewind`` returns to when an
        entry cannot drop positions. Free for trimmable entries (a length);
        references to the recurrent states otherwise (MLX arrays are not
        written in place by those layers)."""
        if self._plain:
            self._mark = rollback.Checkpoint(self.fed, [])
        else:
            self._mark = rollback.checkpoint(self.cache, self.fed)
            self._tail = list(self._pending)

    def mark_prompt(self) -> None:
        """After a request's prefill: a checkpoint the next request can go
        back to when its prompt shares this one's (a regenerated reply), for
        caches that cannot drop positions. Free, as ``checkpoint`` is."""
        if not self._plain and not self.pending:
            self._prompt = rollback.checkpoint(self.cache, self.fed)

    def rewind(self, keep: int) -> None:
        """Keep the first ``keep`` positions: drop what was fed past them.

        Where every cache entry can drop positions, they are dropped. Where
        one cannot, the cache goes back to the checkpoint and the kept
        tokens past it become pending: they are fed with the next forward
        (the next verify, or the draft's next block), which costs a few
        more positions in a forward that runs anyway instead of a forward
        of its own."""
        drop = self.length - keep
        if drop <= 0:
            return
        if self._prompt is not None and keep < self._prompt.length:
            self._prompt = None  # positions it stands on are going
        mark = self._mark
        if keep >= self.fed:  # only pending tokens go: nothing to undo
            self._pending = [_first(self._pending, keep - self.fed)] if keep > self.fed else []
            self.pending = keep - self.fed
        elif rollback.drop(self.cache, self.fed - keep):
            self._pending, self.pending = [], 0
        elif mark is not None and keep >= mark.length and rollback.restorable(self.cache, mark):
            rollback.restore(self.cache, mark)
            kept = keep - mark.length
            self._pending = [_first(self._tail, kept)] if kept else []
            self.pending = kept
        else:  # nothing to go back to: start again (prefix reuse lost)
            self.reset()
            return
        self.length = keep
        if mark is not None and not self._plain:
            self._tail = [_first(self._tail, keep - mark.length)] if keep > mark.length else []
        rollback.done(self.cache)

    def _shared(self, context: Sequence[int], keep_last: bool, limit: int | None) -> int:
        """The positions of ``context`` a sync would like to keep."""
        n = common_prefix(self.ids, context)
        if limit is not None:
            n = min(n, limit)
        if keep_last and n == len(context):
            n -= 1
        return n

    def _to_prompt(self, n: int) -> bool:
        """Whether keeping ``n`` positions goes back to where the last
        prompt ended (a cache that cannot drop them otherwise)."""
        prompt = self._prompt
        return (prompt is not None and prompt.length <= n < self.fed
                and not rollback.can_drop(self.cache, self.fed - n)
                and rollback.restorable(self.cache, prompt))

    def reusable(self, context: Sequence[int], limit: int | None = None,
                 keep_last: bool = True) -> int:
        """How many positions ``sync_to`` with the same arguments keeps, asked
        before it runs (a head trims its rows to what the target keeps)."""
        n = self._shared(context, keep_last, limit)
        if n >= self.fed or rollback.can_drop(self.cache, self.fed - n) or self._to_prompt(n):
            return n
        return 0  # a cache that cannot go back there starts again

    def sync_to(self, context: Sequence[int], keep_last: bool = True,
                limit: int | None = None) -> list[int]:
        """At a request's start: rewind to the longest reusable prefix of
        ``context`` and return the ids still to feed. With keep_last, at
        least one token is left to feed, since the next logits come from
        feeding it. A cache that cannot drop positions is reused only as
        far as it ends on a prefix of ``context``; ``limit`` caps the reuse
        (a drafter needs the positions past it computed again)."""
        n = self._shared(context, keep_last, limit)
        self._mark, self._tail = None, []
        if self._to_prompt(n):
            # Back to where the last prompt ended; the rest of the shared
            # prefix is fed with this request's prefill.
            prompt = self._prompt
            rollback.restore(self.cache, prompt)
            self._pending, self.pending = [list(context[prompt.length:n])], n - prompt.length
            self.length = n
        else:
            self.rewind(n)
        if self.length != n:  # a cache that cannot go back was reset
            n = 0
        self.ids = list(context[:n])
        self.reused = n
        return list(context[n:])

    def settle(self, context: Sequence[int]) -> None:
        """At a request's end: the cache holds a prefix of ``context`` (what
        was fed past the committed tokens is dropped), recorded for the next
        request's prefix reuse."""
        self.rewind(min(self.length, len(context)))
        self._mark, self._tail = None, []
        self.ids = list(context[:self.length])

    @property
    def nbytes(self) -> int:
        return sum(getattr(c, "nbytes", 0) for c in self.cache)

    # -- several conversations (prompt_cache.py) ---------------------------------------
    _STATE = ("cache", "length", "reused", "ids", "_pending", "pending", "_mark", "_tail",
              "_prompt", "_plain")

    def take(self) -> SlotState:
        """What this cache holds (a conversation's prefix, settled), moved
        out: the slot starts empty, the state can be ``put`` back later.
        Nothing is copied."""
        state = SlotState({k: getattr(self, k) for k in self._STATE}, self.nbytes)
        self.reset()
        return state

    def put(self, state: SlotState) -> None:
        """Hold ``state`` again (what ``take`` moved out), as it was."""
        for k, v in state.fields.items():
            setattr(self, k, v)


@dataclass
class SlotState:
    """A CacheSlot's contents moved out of it: its cache and how far it reaches."""

    fields: dict
    nbytes: int


def _count(tokens: Tokens) -> int:
    return int(tokens.size) if isinstance(tokens, mx.array) else len(tokens)


def _first(chunks: list[Tokens], n: int) -> Tokens:
    """The first n tokens of ``chunks``, as one feed: host ids, or a device
    array when any chunk is one (a pipelined step's token)."""
    if all(not isinstance(t, mx.array) for t in chunks):
        return [int(t) for chunk in chunks for t in chunk][:n]
    parts = [t.reshape(-1).astype(mx.uint32) if isinstance(t, mx.array)
             else mx.array(list(t), dtype=mx.uint32) for t in chunks if _count(t)]
    return mx.concatenate(parts)[:n]
