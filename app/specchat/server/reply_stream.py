"""A reply's parts in the order a stream sends them, whatever the API.

Every API face (OpenAI's chunks in protocol.py, the Responses API's events,
Anthropic's content blocks) streams a reply through one ``ReplyStream``:
answer text, reasoning text, and each tool call once it is complete, with
``end`` adding what the steps did not carry, so what a client assembles is
what the whole answer carries. ``sse`` frames one event.
"""

from __future__ import annotations

import json

from specchat.engine.events import ANSWER, REASONING, TOOL, GenerationResult, StepEvent, ToolCall

Part = tuple[str, str | ToolCall]  # (ANSWER or REASONING, text) or (TOOL, a complete call)


class ReplyStream:
    """A reply's parts in the order a stream sends them, from the engine's
    steps: answer text, reasoning text, and each tool call once it is
    complete. Answer text that is only whitespace waits for more: a reply
    that only calls tools has no answer, streamed or not (``content``).
    ``end`` adds what the steps did not carry, so what a client assembles
    is what the whole answer carries. ``split=False``: a completion's text,
    as it comes. Every API face streams through this (``Chunks`` here, the
    Responses API's events in ``responses.py``)."""

    def __init__(self, split: bool = True):
        self.split = split
        # The text streamed so far, in its pieces: joined once, at the end
        # (adding each piece to one string copied all of it every step).
        self._sent: list[str] = []
        self._reasoning: list[str] = []
        self._held: list[str] = []  # whitespace answer text not sent yet
        self._calls = 0  # tool calls streamed

    def answer(self, text: str) -> list[Part]:
        if not text:
            return []
        if self.split and not self._sent and not text.strip():
            self._held.append(text)
            return []
        if self._held:
            text = "".join(self._held) + text
            self._held.clear()
        self._sent.append(text)
        return [(ANSWER, text)]

    def reasoning(self, text: str) -> list[Part]:
        if not text:
            return []
        self._reasoning.append(text)
        return [(REASONING, text)]

    def call(self, call: ToolCall) -> list[Part]:
        self._calls += 1
        return [(TOOL, call)]

    def step(self, ev: StepEvent) -> list[Part]:
        """One engine step: a chat reply's parts, a completion's text."""
        if not self.split:
            return self.answer(ev.text)
        out = []
        for part, text in ev.segments:
            if part == ANSWER:
                out += self.answer(text)
            elif part == REASONING:
                out += self.reasoning(text)
        for call in ev.tool_calls:
            out += self.call(call)
        return out

    def end(self, result: GenerationResult) -> list[Part]:
        """Anything the steps did not carry."""
        if not self.split:
            return self.answer(rest(result.text, self._sent))
        out = self.reasoning(rest(result.reasoning, self._reasoning))
        out += self.answer(rest(result.answer, self._sent + self._held))
        for call in result.tool_calls[self._calls:]:
            out += self.call(call)
        if self._held and not result.tool_calls:  # an answer of whitespace is still one
            self._sent.append("".join(self._held))
            self._held.clear()
            out.append((ANSWER, self._sent[-1]))
        return out


def rest(whole: str, sent: list[str]) -> str:
    """What of ``whole`` the stream has not carried (nothing if what it
    carried is not where ``whole`` starts)."""
    have = "".join(sent)
    return whole[len(have):] if whole.startswith(have) else ""


def sse(obj: dict, named: bool = False) -> str:
    """One server-sent event: its JSON, after its name (the object's
    ``type``, as Anthropic's and the Responses API's events are named) if
    ``named``."""
    data = f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
    return f"event: {obj['type']}\n{data}" if named else data
