"""Suffix drafting (SuffixDecoding, Oliaro et al. 2024): propose what most
often followed the context's ending, in this conversation or in the user's
history, for the price of a few binary searches.

Two corpora are searched: the conversation itself (the prompt, every earlier
turn and the reply so far, indexed as tokens stream) and the history
(history.py: earlier conversations, by the same tokenizer). Each gives the
continuation of its best match (suffix_index.continuation); the one with the
higher expected number of accepted tokens wins. How far to draft follows the
match, as in SuffixDecoding: at most ``SPEC_FACTOR`` tokens per matched
token, and only while the share of occurrences that agree stays above
``MIN_PROB``; the draft-length policy caps it further by the acceptance it
measures per source and match length (the statistics key).

A suffix draft is a deterministic proposal: at T > 0 its q is one-hot, so
acceptance is p(x) and the output still follows the target's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specchat.engine.drafter_kinds import SUFFIX
from specchat.engine.drafters import Build, DraftControl, Drafter, Proposal, Reading
from specchat.engine.events import SamplingParams
from specchat.engine.history import History
from specchat.engine.suffix_index import Continuation, SuffixIndex, continuation
from specchat.origins import CONVERSATION, HISTORY

MIN_MATCH = 2  # in the conversation; one shared token is a coin toss
# ... and when the draft model is there to draft instead (hybrid): 2-token
# matches were accepted 21% of the time, less than the model's tokens.
MIN_MATCH_FALLBACK = 3
MIN_MATCH_HISTORY = 4  # across many conversations short matches are everywhere
SPEC_FACTOR = 1.0  # draft tokens per matched token (SuffixDecoding's max_spec_factor)
SPEC_OFFSET = 2  # ... plus this many
MIN_PROB = 0.1  # stop where fewer than this share of occurrences agree
# Match lengths are grouped into these buckets for acceptance statistics.
BUCKETS = (2, 3, 4, 8, 16)


def history_applies(sampling: SamplingParams) -> bool:
    """Whether a request may draft from the history. Not a seeded sampled
    one: it must give the same tokens every time, but the history changes
    with every reply, and with it which drafts are verified and so which
    random draws are used. (Greedy output is the same whatever is drafted.)"""
    return sampling.greedy or sampling.seed is None


def bucket(m: int) -> int:
    return max(b for b in BUCKETS if b <= max(m, BUCKETS[0]))


def stats_key(origin: str, m: int) -> str:
    """The statistics key of a suffix draft: its source and match length."""
    return f"{SUFFIX.name}:{origin}:{bucket(m)}"


class SuffixDrafter(Drafter):
    name = SUFFIX.name

    def __init__(self, history: History | None = None):
        self.history = history
        self.history_key: str | None = None  # the conversation being replied to (not history)
        self.use_history = True  # per request (off for seeded sampling)
        self.conv = SuffixIndex(tail=1024)

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        if request is not None:
            self.history_key = request.history_key
            self.use_history = history_applies(request.sampling)
        self._sync(prompt, check_all=True)
        return Reading()

    def reset(self) -> None:
        self.conv = SuffixIndex(tail=1024)

    def _sync(self, context: Sequence[int], check_all: bool = False) -> None:
        """Index the context: extend when it only grew (the reply streaming),
        start again for another conversation. A request starts with
        ``prepare`` (every indexed token compared); within it the context
        only grows, so a step compares the last few indexed tokens, not the
        whole conversation."""
        idx = self.conv
        have = idx.n - idx.depth
        lo = idx.depth if check_all else max(idx.depth, idx.n - 8)
        if have and have <= len(context) and np.array_equal(
                idx.buf[lo:idx.n],
                np.asarray(context[lo - idx.depth:have], dtype=np.int32)):
            idx.extend(context[have:])
            return
        self.conv = SuffixIndex(tail=1024)
        self.conv.extend(context)

    def candidates(self, context: Sequence[int], limit: int,
                   min_match: int = MIN_MATCH) -> list[tuple[str, Continuation]]:
        """The best continuation from each corpus that has one."""
        out = []
        best = _best(self.conv.matches(context, min_match), self.conv.buf, self.conv.n, limit)
        if best is not None:
            out.append((CONVERSATION, best))
        h = self.history
        if h is not None and h.enabled and self.use_history and h.docs:
            idx = h.index
            found = idx.matches(context, MIN_MATCH_HISTORY, exclude=h.span(self.history_key))
            best = _best(found, idx.buf, idx.buf.size, limit)
            if best is not None:
                out.append((HISTORY, best))
        return out

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        self._sync(context)
        options = self.candidates(context, SUFFIX.cap,
                                  MIN_MATCH_FALLBACK if ctl.fallback else MIN_MATCH)
        if not options:
            return Proposal(tokens=[], source=self.name)
        origin, cont = max(options, key=lambda o: o[1].score)
        key = stats_key(origin, cont.match)
        k = min(len(cont.tokens), ctl.cap(self.name, key))
        if k <= 0:
            return Proposal(tokens=[], source=self.name)
        return Proposal(tokens=cont.tokens[:k], source=self.name, key=key,
                        confidences=cont.probs[:k], origins=[origin] * k)


def build(b: Build) -> SuffixDrafter:
    """drafter_kinds.SUFFIX's maker: matching the conversation and the
    engine's history index."""
    return SuffixDrafter(b.history)


def _best(found: list[tuple[int, np.ndarray]], buf: np.ndarray, end: int,
          limit: int) -> Continuation | None:
    """The highest-scoring continuation among the longest match and the
    shorter ones that have clearly more occurrences (a longer match is more
    specific; a shorter one may have seen the same text many more times)."""
    best: Continuation | None = None
    seen = 0
    for m, pos in found:
        if best is not None and pos.size < 2 * seen:
            continue
        seen = pos.size
        cap = min(limit, int(SPEC_FACTOR * m) + SPEC_OFFSET)
        cont = continuation(buf, end, pos, m, cap, MIN_PROB)
        if cont.tokens and (best is None or cont.score > best.score):
            best = cont
    return best
