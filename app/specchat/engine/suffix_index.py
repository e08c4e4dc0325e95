"""Where has the context's ending been seen before, and what followed it?

A suffix array over the *reversed* token corpus answers that: the
occurrences of the context's last m tokens form one contiguous range of the
array, and growing m by one token (further back in the context) narrows the
range by one binary search. So the longest match, and the occurrences of
every shorter match too, come from at most ``depth`` binary searches, with
no per-n-gram tables. The array holds one int32 per corpus position, next
to the int32 tokens: 8 bytes per token, 8 MB for a million tokens of
history, where a suffix tree of Python objects (SuffixDecoding's structure
in C++) would need gigabytes. Sorting only compares the first ``depth``
tokens of each reversed suffix, as SuffixDecoding bounds its tree's depth:
matches longer than that do not predict better.

A suffix array is static, and the corpus grows with every streamed token.
It is kept dynamic by the logarithmic method (Bentley and Saxe): positions
are split into sorted segments whose sizes grow geometrically, plus a short
unsorted tail that a query scans with numpy. A token appends to the tail;
a full tail is sorted into a segment and equal-sized segments are merged,
so each position is re-sorted O(log n) times and an update costs
microseconds amortised (measured in docs/benchmarks.md).

Documents (conversations) are separated by a separator id that never
matches, so no match or continuation crosses from one into the next.
Removing a document marks its positions dead; they are dropped from
answers at once and from memory at the next compaction.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEP = -1  # between documents (and before the first): matches nothing
DEPTH = 32  # longest match compared, in tokens
TAIL = 512  # positions left unsorted (scanned) before they become a segment
SCAN_BELOW = 2048  # narrow ranges this small with one vectorised gather
MAX_OCCURRENCES = 4096  # occurrences scored per match (the most recent)


@dataclass
class _Segment:
    start: int  # first position (a position is where a continuation starts)
    end: int
    sa: np.ndarray  # positions in [start, end), ordered by their reversed prefixes


class SuffixIndex:
    """A growing token corpus with a dynamic suffix array over it.

    ``buf[:n]`` is the corpus; position p (``depth <= p < n``) stands for the
    text ending just before it, whose continuation starts at ``buf[p]``.
    """

    def __init__(self, depth: int = DEPTH, tail: int = TAIL):
        self.depth = depth
        self.tail_max = tail
        self.buf = np.full(max(1024, 4 * depth), SEP, dtype=np.int32)
        self.n = depth  # leading separators, so a position never looks before 0
        self.segments: list[_Segment] = []
        self.tail_start = depth
        self.dead: np.ndarray | None = None  # bool per position, once anything is removed
        self.dead_count = 0

    # -- growing ----------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        need = self.n + extra + 1  # one separator always follows the corpus
        if need <= self.buf.size:
            return
        grown = np.full(max(need, 2 * self.buf.size), SEP, dtype=np.int32)
        grown[:self.n] = self.buf[:self.n]
        self.buf = grown
        if self.dead is not None:
            dead = np.zeros(grown.size, dtype=bool)
            dead[:self.dead.size] = self.dead
            self.dead = dead

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the last document (streamed tokens)."""
        k = len(tokens)
        if not k:
            return
        self._reserve(k)
        self.buf[self.n:self.n + k] = np.asarray(tokens, dtype=np.int32)
        self.n += k
        if self.n - self.tail_start >= self.tail_max:
            self._seal()

    def new_document(self) -> int:
        """Start a new document; returns its first position."""
        if self.n > self.depth and self.buf[self.n - 1] != SEP:
            self._reserve(1)
            self.buf[self.n] = SEP
            self.n += 1
        return self.n

    def remove(self, start: int, end: int) -> None:
        """The document at [start, end) never answers a query again: its
        positions, and the one just after it (the separator's, whose text
        before it is the document's end)."""
        if self.dead is None:
            self.dead = np.zeros(self.buf.size, dtype=bool)
        stop = min(end + 1, self.dead.size)
        was = int(self.dead[start:stop].sum())
        self.dead[start:stop] = True
        self.dead_count += (stop - start) - was

    @property
    def tokens(self) -> int:
        return self.n - self.depth

    @property
    def nbytes(self) -> int:
        total = self.buf.nbytes + sum(s.sa.nbytes for s in self.segments)
        return total + (self.dead.nbytes if self.dead is not None else 0)

    # -- sorting ------------------------------------------------------------
    def _seal(self) -> None:
        """Sort the tail into a segment; merge segments of similar size."""
        end = self.n
        if end <= self.tail_start:
            return
        self.segments.append(_Segment(self.tail_start, end, self._sorted(self.tail_start, end)))
        self.tail_start = end
        while len(self.segments) >= 2 and (
                self.segments[-2].end - self.segments[-2].start
                <= 2 * (self.segments[-1].end - self.segments[-1].start)):
            b = self.segments.pop()
            a = self.segments.pop()
            self.segments.append(_Segment(a.start, b.end, self._sorted(a.start, b.end)))

    def _sorted(self, start: int, end: int) -> np.ndarray:
        """Positions in [start, end) ordered by their reversed prefixes of
        ``depth`` tokens (prefix doubling: each round sorts by pairs of the
        previous round's ranks, so depth 32 takes 5 sorts), recent first
        among equals."""
        lo = start - self.depth
        window = self.buf[lo:end].astype(np.int64) + 1  # SEP -> 0
        # rank[i]: rank of the reversed prefix of length L ending before position lo + i
        rank = np.zeros(end - lo, dtype=np.int64)
        rank[1:] = window[:-1]
        length = 1
        while length < self.depth:
            shifted = np.zeros_like(rank)
            shifted[length:] = rank[:-length]
            _, rank = np.unique(rank * (int(shifted.max()) + 1) + shifted, return_inverse=True)
            rank = rank.astype(np.int64)
            length *= 2
        pos = np.arange(start, end, dtype=np.int64)
        r = rank[start - lo:]
        valid = self.buf[start - 1:end - 1] != SEP  # a position needs one token before it
        pos, r = pos[valid], r[valid]
        order = np.lexsort((-pos, r))
        return pos[order].astype(np.int32)

    def compact(self) -> None:
        """Sort everything, tail included, into one segment."""
        self._seal()
        if len(self.segments) > 1:
            start, end = self.segments[0].start, self.segments[-1].end
            self.segments = [_Segment(start, end, self._sorted(start, end))]

    # -- querying -------------------------------------------------------------
    def matches(self, context: Sequence[int], min_len: int = 1,
                exclude: tuple[int, int] | None = None) -> list[tuple[int, np.ndarray]]:
        """(m, positions) for each match length m >= min_len of the context's
        last m tokens, longest first; positions are where what followed each
        occurrence starts (at most MAX_OCCURRENCES, the latest). Positions
        in ``exclude`` (a [start, end) span: the conversation itself, in the
        history) and dead ones are left out."""
        ctx = [int(t) for t in context[-self.depth:]]
        if not ctx:
            return []
        per_len: list[list[np.ndarray]] = [[] for _ in range(len(ctx) + 1)]
        for seg in self.segments:
            self._search(seg.sa, ctx, per_len)
        self._scan(ctx, per_len)
        out = []
        for m in range(len(ctx), min_len - 1, -1):
            parts = [p for p in per_len[m] if p.size]
            if not parts:
                continue
            pos = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if exclude is not None:
                pos = pos[(pos < exclude[0]) | (pos >= exclude[1])]
            if self.dead is not None and self.dead_count:
                pos = pos[~self.dead[pos]]
            if pos.size:
                if pos.size > MAX_OCCURRENCES:
                    pos = np.partition(pos, pos.size - MAX_OCCURRENCES)[-MAX_OCCURRENCES:]
                out.append((m, pos))
        return out

    def _search(self, sa: np.ndarray, ctx: list[int], per_len: list[list[np.ndarray]]) -> None:
        buf = self.buf
        lo, hi = 0, sa.size
        for j in range(len(ctx)):
            x = ctx[-1 - j]
            if hi - lo <= SCAN_BELOW:
                vals = buf[sa[lo:hi].astype(np.int64) - 1 - j]
                a = lo + int(np.searchsorted(vals, x, "left"))
                b = lo + int(np.searchsorted(vals, x, "right"))
            else:
                def key(i: int, j: int = j) -> int:
                    return int(buf[int(sa[i]) - 1 - j])
                a = bisect.bisect_left(range(sa.size), x, lo, hi, key=key)
                b = bisect.bisect_right(range(sa.size), x, a, hi, key=key)
            lo, hi = a, b
            if lo >= hi:
                return
            per_len[j + 1].append(sa[lo:hi])

    def _scan(self, ctx: list[int], per_len: list[list[np.ndarray]]) -> None:
        """The unsorted tail, by elimination: keep the positions whose
        preceding tokens equal the context's, one token further back at a time."""
        if self.n <= self.tail_start:
            return
        cand = np.arange(self.tail_start, self.n, dtype=np.int64)
        for j in range(len(ctx)):
            cand = cand[self.buf[cand - 1 - j] == ctx[-1 - j]]
            if not cand.size:
                return
            per_len[j + 1].append(cand.astype(np.int32))


@dataclass(frozen=True)
class Continuation:
    """The most likely continuation of one match, as SuffixDecoding scores it."""

    tokens: list[int]
    probs: list[float]  # estimated probability that the draft survives to each token
    match: int  # length of the match it continues

    @property
    def score(self) -> float:
        """Expected accepted tokens if the estimates hold."""
        return float(sum(self.probs))


def continuation(buf: np.ndarray, end: int, positions: np.ndarray, match: int, limit: int,
                 min_prob: float) -> Continuation:
    """Follow the occurrences token by token, each time taking the token most
    of them continue with (the latest one's, on a tie) and keeping only those; a token's probability is
    the share of occurrences that agree, multiplied along the path. Stops
    when that falls below ``min_prob``, at ``limit`` tokens, or when no
    occurrence goes on. An occurrence that reaches ``end`` reads on in the
    continuation so far (a repeating list continues its own repeat, as in
    LZ77)."""
    alive = positions.astype(np.int64)
    tokens: list[int] = []
    probs: list[float] = []
    p = 1.0
    if alive.size == 1 and alive[0] + limit <= end:
        # One occurrence (the usual long match): its text is the continuation.
        run = buf[alive[0]:alive[0] + limit]
        stop = np.flatnonzero(run == SEP)
        run = run[:stop[0]] if stop.size else run
        return Continuation(run.tolist(), [1.0] * run.size, match)
    for t in range(limit):
        at = alive + t
        inside = at < end
        nxt = np.where(inside, buf[np.minimum(at, buf.size - 1)], SEP)
        if not inside.all():
            back = at[~inside] - end
            got = np.full(back.size, SEP, dtype=np.int32)
            have = back < len(tokens)
            got[have] = np.asarray(tokens, dtype=np.int32)[back[have]]
            nxt[~inside] = got
        ok = nxt != SEP
        if not ok.any():
            break
        vals, counts = np.unique(nxt[ok], return_counts=True)
        top = counts.max()
        p *= top / alive.size
        if p < min_prob:
            break
        if (counts == top).sum() > 1:  # a tie: the most recent occurrence decides
            tied = np.isin(nxt, vals[counts == top])
            tok = int(nxt[np.flatnonzero(tied)[np.argmax(alive[tied])]])
        else:
            tok = int(vals[int(np.argmax(counts))])
        tokens.append(tok)
        probs.append(p)
        alive = alive[nxt == tok]
    return Continuation(tokens, probs, match)
