"""Which draft is best for a target on this machine: the measured results,
the formula they are checked against, their ranking, and the file that
remembers them.

A draft's worth is not its vocabulary (the compatibility check only says
whether it *can* draft): it is how often the target accepts its tokens on
the prompts this person writes, and what a draft forward costs next to a
target forward on this hardware. Both are measured (engine/measure.py, run
by draft_search.py); this module holds the plain values, so the CLI and
the window show the same numbers. It imports no MLX and no Qt.

Results are remembered in ``<home>/recommendations.json``, one per
(target, draft, machine): speeds measured on one computer say nothing about
another, and the file may travel with a synced home folder.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from specchat import records
from specchat.engine import drafter_kinds
from specchat.engine.costs import CostModel
from specchat.home import home

FILENAME = "recommendations.json"
VERSION = 1
log = logging.getLogger("specchat.library")

# The sample: a few prompts, a short reply each. Enough for acceptance to
# settle (a few hundred judged tokens) in about a minute for a 1.5B target
# on a CPU; the CLI can ask for more.
DEFAULT_PROMPTS = 3
DEFAULT_MAX_TOKENS = 64
# A pasted file as a prompt would make one run of the sample take minutes of
# prefill; its start is as good a sample of the person's writing.
MAX_PROMPT_CHARS = 1500

# When the history is empty: one prompt of each kind people bring to a
# local coding model (write code, explain, edit given text).
BUILT_IN_PROMPTS = (
    "Write a Python function `is_palindrome(text)` that ignores case, spaces and "
    "punctuation. Include a docstring and two examples.",
    "Explain what a hash map is and when a sorted list is the better choice, in a short "
    "paragraph.",
    "Rewrite this function with a list comprehension:\n\ndef squares(n):\n    out = []\n"
    "    for i in range(n):\n        out.append(i * i)\n    return out",
)


# -- the sample -------------------------------------------------------------------


def recent_prompts(conversations: Iterable[Sequence[tuple[str, str]]],
                   n: int = DEFAULT_PROMPTS) -> list[str]:
    """The person's ``n`` most recent prompts: user messages, newest first,
    from conversations given newest first as (role, content) pairs. Repeats
    and empty messages are skipped; long ones are cut to their start."""
    out: list[str] = []
    for messages in conversations:
        for role, content in reversed(list(messages)):
            text = content.strip()[:MAX_PROMPT_CHARS].strip()
            if role != "user" or not text or text in out:
                continue
            out.append(text)
            if len(out) >= n:
                return out
    return out


@dataclass(frozen=True)
class Sample:
    """The prompts a search runs, and where they came from."""

    prompts: tuple[str, ...]
    from_history: bool

    @classmethod
    def choose(cls, history: Sequence[str], n: int = DEFAULT_PROMPTS) -> Sample:
        """The person's own prompts when there are any, else the built-in ones."""
        if history:
            return cls(tuple(history[:n]), True)
        return cls(BUILT_IN_PROMPTS[:max(1, n)], False)

    def describe(self) -> str:
        n = len(self.prompts)
        return (f"{n} recent prompt{'s' if n != 1 else ''} from your history" if self.from_history
                else f"{n} built-in prompt{'s' if n != 1 else ''} (your history is empty)")


# -- the formula ------------------------------------------------------------------------


def predicted_speedup(acceptance: float | None, draft_cost: float, verify_slope: float,
                      cap: int | None = None) -> tuple[float, int] | None:
    """Leviathan et al.'s speedup over plain decoding, and the draft length
    K that gives it: the best over K of E(K) tokens per step over the step's
    cost, K draft forwards of ``draft_cost`` plus one target forward over K+1
    tokens (``CostModel.verify``), for per-token ``acceptance``. None when
    nothing was judged. Below 1 means this draft slows decoding down."""
    if acceptance is None:
        return None
    cap = cap or drafter_kinds.DRAFT_MODEL.cap
    cost = CostModel(draft=max(0.0, draft_cost), slope=max(0.0, verify_slope))
    best = max(((cost.rate(acceptance, k, cost.draft), k) for k in range(1, cap + 1)),
               key=lambda pair: pair[0])
    return best


def per_token_acceptance(accepted: int, judged: int) -> float | None:
    """The chance the target accepts one draft token: accepted tokens over
    the tokens it judged (a block's tokens after its first rejection are
    never judged). This, not accepted over drafted, is the formula's a."""
    return accepted / judged if judged > 0 else None


# -- one result -------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftResult:
    """One draft measured for one target on one machine."""

    target: str  # references, as the picker and the CLI name them
    draft: str
    name: str  # the draft as people read it
    machine: str
    compute: str  # "cpu/float32": how it ran
    acceptance: float | None  # per token (the formula's a)
    acceptance_rate: float  # accepted / drafted, as the gauges show it
    draft_cost: float  # one draft forward, in one-token target forwards
    verify_slope: float  # each extra verified token, likewise
    predicted_speedup: float | None
    best_k: int | None
    measured_speedup: float  # draft tokens/s over plain tokens/s, same prompts
    tokens_per_s: float
    plain_tokens_per_s: float
    prompts: int
    tokens: int
    measured_at: str
    remembered: bool = field(default=False, compare=False)  # read back, not measured now

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("remembered")
        return data

    @classmethod
    def from_json(cls, data: object) -> DraftResult:
        """A stored result, each field checked against its type
        (``records.fields_of``); ``records.BadRecord`` says which is not."""
        return cls(**{**records.fields_of(cls, data), "remembered": True})

    @property
    def key(self) -> tuple[str, str, str]:
        return self.target, self.draft, self.machine

    def summary(self) -> str:
        """One line: "1.62× measured (predicted 1.80×, acceptance 72%)"."""
        parts = [f"acceptance {self.acceptance:.0%}" if self.acceptance is not None
                 else "nothing drafted"]
        if self.predicted_speedup is not None:
            parts.insert(0, f"predicted {self.predicted_speedup:.2f}×")
        return f"{self.measured_speedup:.2f}× measured ({', '.join(parts)})"


def make_result(target: str, draft: str, name: str, machine: str, compute: str,
                drafted: int, accepted: int, judged: int, draft_cost: float,
                verify_slope: float, tokens: int, tokens_per_s: float,
                plain_tokens_per_s: float, prompts: int) -> DraftResult:
    """A result from what was measured: the acceptance, the prediction from
    it, and the measured speedup over the plain run."""
    acceptance = per_token_acceptance(accepted, judged)
    predicted = predicted_speedup(acceptance, draft_cost, verify_slope)
    return DraftResult(
        target=target, draft=draft, name=name, machine=machine, compute=compute,
        acceptance=acceptance, acceptance_rate=accepted / drafted if drafted else 0.0,
        draft_cost=draft_cost, verify_slope=verify_slope,
        predicted_speedup=predicted[0] if predicted else None,
        best_k=predicted[1] if predicted else None,
        measured_speedup=tokens_per_s / plain_tokens_per_s if plain_tokens_per_s > 0 else 0.0,
        tokens_per_s=tokens_per_s, plain_tokens_per_s=plain_tokens_per_s, prompts=prompts,
        tokens=tokens, measured_at=time.strftime("%Y-%m-%d %H:%M"))


def rank(results: Iterable[DraftResult]) -> list[DraftResult]:
    """Fastest first: by the speedup measured here, then by the predicted one."""
    return sorted(results, key=lambda r: (-r.measured_speedup, -(r.predicted_speedup or 0.0),
                                          r.name))


@dataclass(frozen=True)
class Refused:
    """A draft that was not measured, and why (incompatible, or the engine
    would not load it)."""

    draft: str
    name: str
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Recommendation:
    """A search's outcome: the measured drafts fastest first, the refused
    ones with their reasons, and whether it was cancelled part way."""

    target: str
    machine: str
    sample: Sample
    ranked: tuple[DraftResult, ...]
    refused: tuple[Refused, ...]
    cancelled: bool = False
    not_measured: tuple[str, ...] = ()  # compatible drafts a cancel left out

    @property
    def best(self) -> DraftResult | None:
        """The draft to use, if any speeds decoding up."""
        return self.ranked[0] if self.ranked and self.ranked[0].measured_speedup > 1.0 else None

    def to_json(self) -> dict:
        return {"target": self.target, "machine": self.machine,
                "prompts": list(self.sample.prompts), "from_history": self.sample.from_history,
                "ranked": [r.to_json() | {"remembered": r.remembered} for r in self.ranked],
                "incompatible": [r.to_json() for r in self.refused],
                "cancelled": self.cancelled, "not_measured": list(self.not_measured),
                "best": self.best.draft if self.best else None}


# -- this machine -------------------------------------------------------------------------


def cpu_name() -> str:
    """The processor's name as the system reports it ("" when it does not)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if not cpu and platform.system() == "Darwin":
        try:
            cpu = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return cpu


@functools.cache
def machine() -> str:
    """This computer as results are filed under it: the processor, its
    architecture and core count (a host name changes with the network on a
    laptop; the hardware does not)."""
    cpu = cpu_name() or platform.processor() or "unknown processor"
    return f"{cpu} ({platform.machine()}, {os.cpu_count()} cores)"


# -- the file ---------------------------------------------------------------------------


def results_file() -> Path:
    return home() / FILENAME


def _read() -> list[DraftResult]:
    """The remembered results; one that is not a result (an older or
    damaged entry) is named in the log and not remembered."""
    path = results_file()
    data = records.read_record(path)
    entries = data.get("results") if data.get("version") == VERSION else None
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            out.append(DraftResult.from_json(entry))
        except records.BadRecord as exc:
            records.report(log, f"{path}: a remembered measurement was skipped: {exc}.")
    return out


def remembered(target: str, machine_name: str | None = None) -> dict[str, DraftResult]:
    """The results kept for ``target`` on this machine, by draft reference."""
    where = machine_name or machine()
    return {r.draft: r for r in _read() if r.target == target and r.machine == where}


def remember(result: DraftResult) -> None:
    """Keep ``result``, replacing the one for the same (target, draft,
    machine). The file is replaced whole (records.write_json), so a kill never
    leaves half of it, under its lock (records.locked), so the app and a
    terminal measuring at once keep each other's results."""
    path = results_file()
    with records.locked(records.lock_beside(path)):
        kept = [r for r in _read() if r.key != result.key]
        kept.append(replace(result, remembered=True))
        records.write_json(path, {"version": VERSION, "results": [r.to_json() for r in kept]},
                           indent=2, sort_keys=True)
