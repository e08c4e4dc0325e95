"""Drafters that read the target: a head of one or a few layers fed the
target's own hidden states (the target's MTP head, mtp.py; an EAGLE-3 head,
eagle3.py).

Row p of the head's cache pairs the target's features after token p (its
final hidden state, or a few of its layers' outputs) with the token at p + 1,
and predicts the token at p + 2. The features come from the forwards the
loop runs anyway: for the length of a request the loop taps the target for
the head (``hidden_tap``, kv.CacheSlot.tapped) and its CacheSlot hands them
here by position, so reading them costs no forward. A step
feeds the rows for the tokens committed since the last one; the last row's
output predicts the first draft token, and the head chains from there,
feeding its own output with each drafted token. Chained rows are dropped
after the verify (``kept``), so the head's cache only ever holds rows fed
the target's real features; its output for every committed row is kept, so
that after going back to any row it drafts without feeding it again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specchat.engine import drafter_kinds
from specchat.engine.drafters import DraftControl, Drafter, Proposal, Reading
from specchat.engine.drafting import DraftHead, draft_block
from specchat.engine.errors import EngineError
from specchat.engine.kv import CacheSlot, HiddenTap
from specchat.engine.prompt_cache import common_prefix


class HiddenLog:
    """Rows by position, as forwards produce them (a later forward's rows
    replace an earlier one's: those of a rejected draft are overwritten once
    the position is committed)."""

    def __init__(self):
        self.parts: list[tuple[int, mx.array]] = []  # (first position, [L, F])

    def add(self, start: int, rows: mx.array) -> None:
        self.parts.append((start, rows))

    def rows(self, a: int, b: int) -> mx.array:
        """[b - a, F] (b > a): positions a..b-1, each from the newest part holding it."""
        out: list[mx.array] = []
        p = a
        while p < b:
            for start, rows in reversed(self.parts):
                if start <= p < start + rows.shape[0]:
                    end = min(b, start + rows.shape[0])
                    out.append(rows[p - start:end - start])
                    p = end
                    break
            else:
                raise EngineError(f"the target's hidden state at position {p} was not kept")
        return mx.concatenate(out, axis=0)

    def covers(self, a: int, b: int) -> bool:
        try:
            if a < b:
                self.rows(a, b)
        except EngineError:
            return False
        return True

    def forget_before(self, p: int) -> None:
        self.parts = [(s, r) for s, r in self.parts if s + r.shape[0] > p]

    def truncate(self, p: int) -> None:
        """Forget positions p and later."""
        self.parts = [(s, r[:p - s]) for s, r in self.parts if s < p]

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for _, rows in self.parts)


class HeadDrafter(Drafter):
    """What a head that reads the target shares; a kind of head says how to
    take its features from a tap, run its layers and read out its logits."""

    layers: int  # KV caches the head keeps (one per attention layer)
    tap_layers: tuple[int, ...] = ()  # the target's layers it reads besides the final ones
    own_cap_only = True
    # Unfed rows a request's first proposal may feed itself; more (a long
    # prompt: ``prepare`` says it is behind) are fed by ``catch_up`` after the
    # reply's first token has gone out, so that they count as reading the
    # prompt and not as drafting.
    READY_ROWS = 8

    def __init__(self, target: CacheSlot):
        if not target.runner.split:
            raise EngineError("a draft head needs the target's hidden states, which this "
                              "model type does not expose")
        self.target = target
        self.reset()

    # -- what a kind of head says ----------------------------------------------------
    def features(self, tapped: dict) -> mx.array:
        """[L, F] features of the positions a forward fed, from the runner's tap."""
        raise NotImplementedError

    def forward(self, tokens: mx.array, rows: mx.array, fed: bool) -> mx.array:
        """The head's output [L, H] for ``tokens`` [L] paired with ``rows``:
        the target's features (``fed``) or the head's own output (chained)."""
        raise NotImplementedError

    def logits(self, out: mx.array) -> mx.array:
        """[1, W] logits over ``view``'s columns for one output row."""
        raise NotImplementedError

    def view(self, vocab: int) -> DraftHead:
        """How logit columns map to the target's ids (and q is widened)."""
        return DraftHead(vocab)

    # -- the drafter -----------------------------------------------------------------
    def reset(self) -> None:
        self.cache = [KVCache() for _ in range(self.layers)]
        self.rows = 0  # committed rows in the head's cache
        self.log = HiddenLog()  # the target's features, by position
        self.outs = HiddenLog()  # the head's output for each committed row, by row
        # The conversation its rows and kept features belong to, as of the
        # last request it drafted in (the target's cache follows every request).
        self.ids: list[int] = []

    _STATE = ("cache", "rows", "log", "outs", "ids")

    def state_bytes(self) -> int:
        return sum(c.nbytes for c in self.cache) + self.log.nbytes + self.outs.nbytes

    def _collect(self, start: int, tapped: dict) -> None:
        self.log.add(start, self.features(tapped))

    @property
    def hidden_tap(self) -> HiddenTap:
        """The target's final hidden states, and its layers ``tap_layers``."""
        return HiddenTap(self.tap_layers, self._collect)

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        """The head keeps its rows and the target's kept features as far as
        its own conversation agrees with ``prompt``; the target may reuse
        its cache as far as the kept features cover the positions past the
        head's rows (none are kept between requests that did not use the
        head), else only as far as the head's rows go, computing the rest
        again. The head's rows past what the target keeps go too."""
        # The features after token p, and row p (which also reads token
        # p + 1), hold only as far as the head's own conversation agrees with
        # this prompt: a request without the head in between may have moved
        # the target's cache to another conversation.
        mine = common_prefix(self.ids, prompt)
        self.log.truncate(mine)
        self._trim(min(self.rows, max(0, mine - 1)))
        n = min(common_prefix(self.target.ids, prompt), len(prompt) - 1)
        keep = min(self.rows, n)
        limit = None if self.log.covers(keep, n) else keep
        self._trim(min(self.rows, self.target.reusable(prompt, limit)))
        self.log.forget_before(self.rows)
        return Reading(reuse=limit, behind=len(prompt) - 1 - self.rows > self.READY_ROWS)

    def _trim(self, rows: int) -> None:
        for c in self.cache:
            c.trim(c.offset - rows)
        self.rows = rows
        self.outs.truncate(rows)

    def catch_up(self, context: Sequence[int]) -> None:
        """Feed the committed rows not fed yet: on a long prompt one forward
        of the head's layers over a thousand rows, about as long as several
        target forwards, which would otherwise delay the first token."""
        feats = self._unfed(len(context))
        if feats is None:
            return  # nothing to feed, or features missing: propose declines
        mx.eval(self._feed_rows(context, feats))
        self.log.forget_before(self.rows)

    def _unfed(self, n: int) -> mx.array | None:
        """The target's features of the committed rows not fed yet, for a
        context of ``n`` tokens; None when there are none, or when some were
        never computed by the target (a paused request's backlog)."""
        if self.rows >= n - 1:
            return None
        try:
            return self.log.rows(self.rows, n - 1)
        except EngineError:
            return None

    def _feed_rows(self, context: Sequence[int], feats: mx.array) -> mx.array:
        """The head's outputs for the committed rows from ``self.rows`` to
        the context's last (the target's features ``feats``), kept by row."""
        start, n = self.rows, len(context)
        out = self.forward(self._ids(context[start + 1:n]), feats, fed=True)
        self.outs.add(start, out)
        self.rows = n - 1
        return out

    def _ids(self, tokens: Sequence[int] | mx.array) -> mx.array:
        return tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        return self._draft(context, (), ctl)

    def propose_after(self, context: Sequence[int], given: Sequence[int],
                      ctl: DraftControl) -> Proposal:
        """The target has no features for ``given`` (a suffix draft still to
        be verified), so the head reads them as it reads its own drafts: each
        from its own output for the row before, one forward a token. Its
        drafts after them are deeper in its own chain than any it makes on
        the target's features, so their acceptance is kept under
        ``drafter_kinds.after_key``, apart from its drafts' own."""
        if not given:
            return self.propose(context, ctl)
        return self._draft(context, tuple(given), ctl)

    def _draft(self, context: Sequence[int], given: tuple[int, ...],
               ctl: DraftControl) -> Proposal:
        key = drafter_kinds.after_key(self.name) if given else None
        k = ctl.cap(self.name, key) if given else ctl.cap(self.name)
        n = len(context)
        if k <= 0 or n < 2:
            return Proposal(tokens=[], source=self.name, key=key or "")
        t0 = time.perf_counter()
        feats = self._unfed(n)
        if feats is None and self.rows < n - 1:  # rows the target never computed
            return Proposal(tokens=[], source=self.name, key=key or "")
        state: dict = {}

        def feed(x):
            if feats is not None and "h" not in state:  # the committed rows
                out = self._feed_rows(context, feats)
            elif "h" in state:  # chained: a drafted token with the head's own output
                out = self.forward(self._ids(x).reshape(-1), state["h"], fed=False)
            else:  # no new row: the last committed row's output drafts
                out = self.outs.rows(n - 2, n - 1)
            if "h" not in state:
                for t in given:  # the other drafter's tokens, as if drafted here
                    out = self.forward(self._ids([t]), out[-1:], fed=False)
            state["h"] = out[-1:]
            return self.logits(out[-1:])

        head = self.view(ctl.vocab)
        block = draft_block(head, feed, [], k, ctl.sampling, key_at=lambda _i: ctl.keys.next(),
                            keep_going=partial(ctl.keep_going, self.name), lazy=ctl.lazy)
        self.log.forget_before(self.rows)
        return block.proposal(self.name, head, ctl.sampling, t0, key=key or "",
                              forwards=block.forwards + len(given))

    def kept(self, length: int) -> None:
        # Chained rows were fed the head's own outputs: they go, whatever was kept.
        self._trim(min(self.rows, max(0, length - 1)))

    def finish(self, context: Sequence[int]) -> None:
        self._trim(min(self.rows, max(0, len(context) - 1)))
        self.ids = list(context)
