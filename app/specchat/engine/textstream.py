"""Streaming text out of token ids, with stop strings.

mlx-lm's streaming detokenizers already hold back incomplete UTF-8 bytes;
on top of that this holds back any tail that could still become a stop
string, so the text a caller has seen never has to be taken back. The
stop strings are found by one automaton built per request
(``stops.StopMatcher``): each new character is read once, so a token costs
the same however many stop strings the request has.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

from specchat.engine.stops import StopMatcher


class TextStream:
    def __init__(self, tokenizer: TokenizerWrapper, stop_strings: Sequence[str] = ()):
        self._detok = tokenizer.detokenizer
        stops = [s for s in stop_strings if s]
        self._stops = StopMatcher(stops) if stops else None
        self._read = 0  # chars of the detokenizer's text the automaton has read
        self._emitted = 0  # chars of the final text already handed out
        self.stopped = False
        self._finished = False

    @property
    def text(self) -> str:
        """The final text so far (the stop string excluded): what was handed out."""
        return self._detok.text[:self._emitted]

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
        """The text of ``full`` that is now safe to hand out: up to where a
        stop string begins (then ``stopped``), else all but the tail that
        may still become one (nothing held back once ``final``)."""
        if self.stopped:
            return ""
        cut = len(full)
        if self._stops is not None:
            found = self._stops.feed(full, self._read)
            self._read = len(full)
            if found is not None:
                end, length = found
                cut = end - length
                self.stopped = True
            elif not final:
                cut = len(full) - self._stops.held
        out = full[self._emitted:max(cut, self._emitted)]
        self._emitted = max(cut, self._emitted)
        return out
