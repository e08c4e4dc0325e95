"""A reply's summary as the history keeps it.

The engine's Summary is a frozen record of one run; what is saved with a
reply must also read back from history files written by older versions,
which lack some of today's fields or carry ones since dropped. So the store
keeps its own small record: the numbers the window shows by name, and every
other key exactly as it came, so saving a summary again loses nothing. The
JSON is the same object older versions wrote (the engine Summary as a dict).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
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


def shares_text(tokens_by_origin: dict[str, int]) -> str:
    """ "draft 41% · conversation 22% · history 9%" (the rest: the target)."""
    return " · ".join(f"{origins.get(o).short} {share:.0%}"
                      for o, share in origin_shares(tokens_by_origin))


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

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        out.update((k, v) for k, v in asdict(self).items() if k != "extra")
        return out

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
