"""Streaming text out of token ids, with stop strings.

mlx-lm's streaming detokenizers already hold back incomplete UTF-8 bytes;
on top of that this holds back any tail that could still become a stop
string, so the text a caller has seen never has to be taken back.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper


class TextStream:
    def __init__(self, tokenizer: TokenizerWrapper, stop_strings: Sequence[str] = ()):
        self._detok = tokenizer.detokenizer
        self._stops = [s for s in stop_strings if s]
        self._emitted = 0  # chars of the final text already handed out
        self.stopped = False
        self._finished = False
        self.text = ""  # final text so far (stop string excluded)

    def add(self, token: int) -> str:
        """Add one token; return the newly safe text. Sets ``stopped`` when a
        stop string completes (the stop string itself is never returned)."""
        self._detok.add_token(token)
        return self._advance(self._detok.text, final=False)

    def finish(self) -> str:
        """Flush held-back text; idempotent."""
        if self.stopped or self._finished:
            return ""
        self._finished = True
        self._detok.finalize()
        return self._advance(self._detok.text, final=True)

    def _advance(self, full: str, final: bool) -> str:
        if self.stopped:
            return ""
        cut = len(full)
        if self._stops:
            longest = max(len(s) for s in self._stops)
            start = max(0, self._emitted - longest)
            hits = [full.find(s, start) for s in self._stops]
            hits = [h for h in hits if h >= 0]
            if hits:
                cut = min(hits)
                self.stopped = True
            elif not final:
                cut = len(full) - _partial_stop(full, self._stops)
        self.text = full[:cut] if self.stopped else full[:max(cut, self._emitted)]
        out = full[self._emitted:max(cut, self._emitted)]
        self._emitted = max(cut, self._emitted)
        return out


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
