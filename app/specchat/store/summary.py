"""A reply's summary as the history keeps it.

The engine's Summary is a frozen record of one run; what is saved with a
reply must also read back from history files written by older versions,
which lack some of today's fields or carry ones since dropped. So the store
keeps its own small record: the numbers the window shows by name, and every
other key exactly as it came, so saving a summary again loses nothing. The
JSON is the same object older versions wrote (the engine Summary as a dict).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from specchat import origins, records


def origin_shares(tokens_by_origin: dict[str, int]) -> list[tuple[str, float]]:
    """(origin, share of all tokens) for every source but the target, in the
    registry's order (specchat/origins.py), then unknown ones by name; empty
    when no token came from a source."""
    total = sum(n for n in tokens_by_origin.values() if n > 0)
    if not total:
        return []
    return [(o, tokens_by_origin[o] / total) for o in origins.drafted(tokens_by_origin)
            if tokens_by_origin[o] > 0]


def shares_text(tokens_by_origin: dict[str, int], sep: str = " · ") -> str:
    """ "draft 41% · conversation 22% · history 9%" (the rest: the target)."""
    return sep.join(f"{origins.get(o).short} {share:.0%}"
                    for o, share in origin_shares(tokens_by_origin))


# The parts of a reply as the engine names them (engine/events.py PARTS, the
# keys of Summary.by_part), and as a person reads them.
REASONING, ANSWER, TOOL = "reasoning", "answer", "tool"
PART_NAMES = {REASONING: "thinking", ANSWER: "answer", TOOL: "tool calls"}


@dataclass(frozen=True)
class PartNumbers:
    """How one part of a reply was decoded (engine/part_stats.py counts it)."""

    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    first_s: float = 0.0
    """When its text began, in seconds from the request's start."""
    tokens_by_origin: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def counts(self) -> str:
        """ "412 tokens · 9.3 s": the Thinking section's title says it."""
        seconds = f"{self.seconds:.1f}" if self.seconds >= 1 else f"{self.seconds:.2f}"
        return f"{self.tokens} token{'s' if self.tokens != 1 else ''} · {seconds} s"

    def text(self, name: str) -> str:
        """ "thinking 412 tokens, 38.2 tok/s, acceptance 58%, draft 41%"."""
        out = [f"{name} {self.tokens} token{'s' if self.tokens != 1 else ''}",
               f"{self.tokens_per_s:.1f} tok/s"]
        if self.acceptance is not None:
            out.append(f"acceptance {self.acceptance:.0%}")
        shares = shares_text(self.tokens_by_origin, ", ")
        if shares:
            out.append(shares)
        return ", ".join(out)


def parts_text(parts: dict[str, PartNumbers]) -> str:
    """Each part's numbers on one line, in the engine's order of parts
    (the summary's second line; the gauges' while a reply streams)."""
    return " · ".join(parts[name].text(label) for name, label in PART_NAMES.items()
                      if name in parts)


@dataclass(frozen=True)
class ReplySummary:
    mode: str = "plain"
    """A name from the engine's mode registry (specchat.engine.modes)."""
    finish_reason: str = ""
    """"stop", "length", "cancelled", ...; empty in a summary that lacks it."""
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by: dict[str, Any] = field(default_factory=dict)
    """Per drafter kind (hybrid modes draft with several), the engine's
    counts for it: ``{"drafted", "accepted", "steps"}`` and, for the suffix
    drafter, ``by_key``; kept as they came."""
    tokens_by_origin: dict[str, int] = field(default_factory=dict)
    """The reply's tokens per origin: "target", "draft" (the draft model),
    "conversation", "history", ... (specchat/origins.py names them)."""
    acceptance_rate: float = 0.0
    tokens_per_step: float = 1.0
    tokens_per_s: float = 0.0
    ttft_s: float = 0.0
    """Seconds to the first token, prefill included."""
    wall_s: float = 0.0
    paused_steps: int = 0
    """Steps decoded plainly because break-even auto-off had paused
    speculation (it was measured slower than plain decoding)."""
    by_part: dict[str, Any] = field(default_factory=dict)
    """How each part of the reply (reasoning, answer, tool calls) was
    decoded, by part: PartNumbers' fields, as the engine counted them."""
    ended_in_reasoning: bool = False
    """The reply ended inside its reasoning: it has no answer after it."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Everything else the engine reported (steps, prefill, BLAS threads, ...),
    kept as it came."""

    @classmethod
    def from_json(cls, data: object) -> ReplySummary:
        """Read a stored summary: missing keys take their defaults, unknown
        ones are kept in ``extra``; a known one of the wrong type (a hand
        edit: ``"tokens_per_s": "fast"``) is ``records.BadRecord``, naming it."""
        if not isinstance(data, dict):
            raise records.BadRecord(f"it is {records.described(data)}, not a summary")
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**records.fields_of(cls, {k: v for k, v in data.items() if k in known}),
                   extra={k: v for k, v in data.items() if k not in known})

    @classmethod
    def of(cls, summary: object) -> ReplySummary:
        """The engine's Summary of a run (a dataclass of its fields), as
        the history keeps it and the window and the command line show it."""
        if not is_dataclass(summary) or isinstance(summary, type):
            raise records.BadRecord(f"it is {records.described(summary)}, not a summary")
        return cls.from_json(asdict(summary))

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        out.update((k, v) for k, v in asdict(self).items() if k != "extra")
        return out

    def part(self, name: str) -> PartNumbers | None:
        """One part's numbers, or None if the reply had none (or they do
        not read as numbers: a hand-edited history)."""
        data = self.by_part.get(name)
        try:
            return PartNumbers(**records.fields_of(PartNumbers, data)) if data else None
        except records.BadRecord:
            return None

    @property
    def reasoned(self) -> bool:
        """The reply had reasoning (its line then says each part's numbers)."""
        return self.part(REASONING) is not None

    def cut_off(self) -> str:
        """Why the reply has no answer after its reasoning, in words; ""
        when it ended outside it."""
        if not self.ended_in_reasoning:
            return ""
        why = {"cancelled": "stopped", "length": "max tokens reached"}.get(
            self.finish_reason, "the model ended it there")
        return f"ended while thinking ({why}), before any answer"

    def parts_line(self) -> str:
        """Each part's numbers, for a reply that reasoned: "thinking 412
        tokens, 38.2 tok/s, acceptance 58% · answer 120 tokens, ..."; empty
        for one that did not (the reply's line says it all)."""
        if not self.reasoned:
            return ""
        return parts_text({name: n for name in PART_NAMES if (n := self.part(name)) is not None})

    def line(self) -> str:
        """The one line shown under a reply (and in exports)."""
        parts = [f"{self.new_tokens} tokens", f"{self.tokens_per_s:.1f} tok/s",
                 f"first token {self.ttft_s:.2f} s"]
        if self.drafted:
            parts.append(f"acceptance {self.acceptance_rate:.0%}")
            parts.append(f"{self.tokens_per_step:.2f} tokens/step")
            shares = shares_text(self.tokens_by_origin)
            if shares:
                parts.append(shares)
        parts.append(self.mode)
        if self.paused_steps:
            parts.append(f"{self.paused_steps} step{'s' if self.paused_steps != 1 else ''} paused")
        if self.finish_reason == "cancelled":
            parts.append("stopped")
        elif self.finish_reason == "length":
            parts.append("max tokens reached")
        return " · ".join(parts)
