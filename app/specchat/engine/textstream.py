"""Streaming text out of token ids, in its parts, with stop strings.

mlx-lm's streaming detokenizers already hold back incomplete UTF-8 bytes;
what they release goes through the reply's splitter
(``reply_parts.ReplySplitter``), which splits it into reasoning, answer
and tool calls (a reply with no markers is all answer) and finds the stop
strings in the answer, holding back any tail that could still become one
(with the text around it), so the text a caller has seen never has to be
taken back. The stop strings are found by one automaton built per request
(``stops.StopMatcher``): each new character is read once, so a token costs
the same however many stop strings the request has.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

from specchat.engine.reply_parts import Released, ReplySplitter


class TextStream:
    """``parts``: the reply's splitter (its own stop strings); none: a
    reply that is all answer, with ``stop_strings``."""

    def __init__(self, tokenizer: TokenizerWrapper, stop_strings: Sequence[str] = (),
                 parts: ReplySplitter | None = None):
        self._detok = tokenizer.detokenizer
        self.parts = parts if parts is not None else ReplySplitter(stops=stop_strings)
        self._read = 0  # chars of the detokenizer's text the splitter has read
        self._emitted = 0  # chars of the final text already handed out
        self._finished = False

    @property
    def stopped(self) -> bool:
        """A stop string ended the reply (it is never handed out)."""
        return self.parts.stopped

    @property
    def text(self) -> str:
        """The final text so far (the stop string excluded): what was handed out."""
        return self._detok.text[:self._emitted]

    def step(self, token: int) -> Released:
        """Add one token: the text it made safe to hand out, and its parts."""
        self._detok.add_token(token)
        return self._advance()

    def add(self, token: int) -> str:
        """Add one token; return the newly safe text."""
        return self.step(token).raw

    def end(self) -> Released:
        """Flush what was held back, and end the reply's parts; idempotent."""
        if self._finished:
            return Released()
        self._finished = True
        self._detok.finalize()
        out = self._advance()
        rest = self.parts.finish()
        self._emitted += len(rest.raw)
        out.add(rest)
        return out

    def finish(self) -> str:
        """Flush held-back text; idempotent."""
        return self.end().raw

    def _advance(self) -> Released:
        full = self._detok.text
        out = self.parts.feed(full[self._read:])
        self._read = len(full)
        self._emitted += len(out.raw)
        return out
