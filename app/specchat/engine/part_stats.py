"""How each part of a reply (its reasoning, its answer, its tool calls) was
decoded: tokens, seconds, drafted and accepted tokens, and where its
tokens came from.

One rule, counted from the reply's StepEvents (their ``parts``, one label
per token, and ``origins``), so that every reader counts alike: the
decoding loop feeds each event it emits and puts ``record()`` in the
reply's Summary (``Summary.by_part``: the command line and the history
read it there), and the window's live gauges feed the same events as they
arrive. Pure Python, no MLX.

A step may cross from one part into the next. Its accepted drafts belong
to the part of the token each became; the drafts it refused, and any it
accepted past the reply's end, to the part of its last token (where the
verify stopped). Its time is shared out by its tokens: a step's seconds
are the time since the step before it ended (the first step's, its own),
so the parts' seconds add up to the reply's decoding time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specchat.engine.events import ANSWER, PARTS, StepEvent
from specchat.origins import TARGET


@dataclass
class PartTally:
    """One part's counts so far."""

    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    first_s: float | None = None  # the request's elapsed seconds when the part's text began
    by_origin: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict:
        """As ``Summary.by_part`` holds it (JSON: the history saves it)."""
        return {"tokens": self.tokens, "seconds": self.seconds, "drafted": self.drafted,
                "accepted": self.accepted, "first_s": self.first_s or 0.0,
                "tokens_by_origin": dict(self.by_origin)}


class PartCounter:
    """The parts' tallies over a reply's StepEvents, fed in order."""

    def __init__(self):
        self.parts: dict[str, PartTally] = {}
        self._last_s: float | None = None  # the previous step's end (elapsed_s)
        self._part = ANSWER  # the part the reply is in: its last token's

    def add(self, ev: StepEvent) -> None:
        labels: Sequence[str] = ev.parts if len(ev.parts) == len(ev.token_ids) \
            else (ANSWER,) * len(ev.token_ids)
        for part, text in ev.segments:
            tally = self._tally(part)
            if text and tally.first_s is None:
                tally.first_s = ev.elapsed_s
        if not ev.token_ids and not ev.drafted:
            return  # the end-of-reply text flush: no step
        seconds = ev.elapsed_s - self._last_s if self._last_s is not None else ev.step_s
        self._last_s = ev.elapsed_s
        counted = 0
        for label, origin in zip(labels, ev.origins, strict=False):
            tally = self._tally(label)
            tally.tokens += 1
            tally.by_origin[origin] = tally.by_origin.get(origin, 0) + 1
            if origin != TARGET:
                tally.drafted += 1
                tally.accepted += 1
                counted += 1
            tally.seconds += seconds / len(labels)
        if labels:
            self._part = labels[-1]
        else:
            self._tally(self._part).seconds += seconds
        last = self._tally(self._part)
        last.drafted += ev.drafted - counted
        last.accepted += ev.accepted - counted

    def _tally(self, part: str) -> PartTally:
        tally = self.parts.get(part)
        if tally is None:
            tally = self.parts[part] = PartTally()
        return tally

    def record(self) -> dict[str, dict]:
        """Every part the reply had a token in, in PARTS' order."""
        return {p: self.parts[p].record() for p in PARTS
                if p in self.parts and (self.parts[p].tokens or self.parts[p].drafted)}
