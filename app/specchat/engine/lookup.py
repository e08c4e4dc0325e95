"""Prompt-lookup drafting: propose the continuation of an earlier occurrence
of the context's last n-gram (llama.cpp's lookup decoding, HF's prompt lookup).

It costs no model at all, and it is strong exactly where a draft model is
weak: input-grounded replies (edits, refactors, quotes) that copy long spans
of the prompt or of earlier output.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """For each n in [min_n, max_n], the latest position following each n-gram.

    Updated incrementally as the context grows; rebuilt when the context is
    not an extension of what was indexed (a new conversation).
    """

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n
        self._ids: list[int] = []
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending before this position are in the maps

    def _sync(self, context: Sequence[int]) -> None:
        m = len(self._ids)
        if len(context) < m or list(context[:m]) != self._ids:
            self._ids = []
            self._maps = {n: {} for n in self._maps}
            self._indexed = 0
        self._ids.extend(context[len(self._ids):])
        # Index every n-gram whose continuation exists, i.e. ending at
        # position e < len(ids): map ngram -> e (start of its continuation).
        ids = self._ids
        for e in range(max(self._indexed, 1), len(ids)):
            for n in self._maps:
                if e - n >= 0:
                    self._maps[n][tuple(ids[e - n:e])] = e
        self._indexed = max(self._indexed, len(ids))

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens continuing the longest matching suffix n-gram, and
        the n of that match (0 when nothing matched).

        The continuation is copied from the latest earlier occurrence. Where
        that copy reaches the end of the context and the context already ends
        in two full periods of the repeat, it goes on copying what it has just
        proposed: text that repeats with period p (a list, a table, the same
        line again) is proposed as k tokens of the repeat, not cut at one
        period (an overlapping copy, as in LZ77). Without two periods the
        match is as likely a chance one (a digit or a comma seen a few tokens
        back), and a long copy of it would only cost verification."""
        if k <= 0 or not context:
            return [], 0
        self._sync(context)
        ids = self._ids
        L = len(ids)
        for n in range(self.max_n, self.min_n - 1, -1):
            if n > L:
                continue
            pos = self._maps[n].get(tuple(ids[L - n:]))
            # pos == L would be the suffix itself (never indexed: e < L).
            if pos is not None and pos < L:
                if pos + k > L and not ends_in_repeat(ids, L - pos):
                    return list(ids[pos:]), n
                return repeat_from(ids, pos, k), n
        return [], 0


def ends_in_repeat(ids: Sequence[int], period: int) -> bool:
    """Whether ``ids`` ends in two full periods of the same tokens."""
    end = len(ids)
    return end >= 2 * period and list(ids[end - 2 * period:end - period]) == list(ids[end - period:])


def repeat_from(ids: Sequence[int], pos: int, k: int) -> list[int]:
    """k tokens that continue ``ids`` the way ``ids[pos:]`` continued the
    same text before: ``out[j] = (ids + out)[pos + j]``."""
    end = len(ids)
    out = list(ids[pos:pos + k])
    while len(out) < k:
        out.append(out[pos + len(out) - end])
    return out
