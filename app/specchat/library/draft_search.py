"""Finding the best draft for a target by measuring each installed one:
``specchat models recommend`` and the pair picker's "Find the best draft".

The installed drafts (the built-in models and the index's) go through the
compatibility check first; those it refuses are listed with its reason and
never loaded. Each of the others is loaded beside the target and run on the
sample through the engine thread (engine/measure.py, as ``EngineClient``
jobs), after one plain run of the same prompts. Results are remembered per
(target, draft, machine) as each draft finishes (recommendations.py), so a
cancel keeps what was measured, and a later search reuses them unless asked
to measure ``again``.

``search`` blocks until done: the CLI calls it on its main thread, the
window in an executor thread (it must never wait on the GUI thread).
Cancelling is a ``threading.Event``: the engine checks it every step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specchat.engine import measure
from specchat.engine.client import EngineClient
from specchat.engine.errors import EngineError
from specchat.engine.events import LoadProgress
from specchat.library import bundled, index
from specchat.library import recommendations as rec
from specchat.library.compatibility import check, describe
from specchat.library.recommendations import DraftResult, Recommendation, Refused, Sample


@dataclass(frozen=True)
class Candidate:
    ref: str  # as the picker and the CLI name it
    name: str  # as people read it


@dataclass(frozen=True)
class SearchProgress:
    """Where a search is: a line for people and the fraction of the whole."""

    message: str
    fraction: float


Progress = Callable[[SearchProgress], None]


# -- which drafts ------------------------------------------------------------------


def installed_drafts(target: str) -> list[Candidate]:
    """Every draft this computer has: the built-in models whose packages are
    installed, then the index's models, leaving out the target itself."""
    try:
        target_path = describe(target, allow_work=False).path
    except Exception:  # noqa: BLE001 - an unknown target fails at its load, in words
        target_path = None
    taken = {Path(target_path).resolve()} if target_path else set()  # the target's folder
    out: list[Candidate] = []
    seen: set[str] = {target}
    for model in bundled.BUNDLED.values():
        if model.ref in seen or (taken and bundled.folder(model.name).resolve() in taken):
            continue
        if bundled.available(model.name):
            seen.add(model.ref)
            out.append(Candidate(model.ref, model.display_name))
    for m in index.list_installed():
        if m.name in seen or m.source in seen or (taken and Path(m.path).resolve() in taken):
            continue
        seen.add(m.name)
        out.append(Candidate(m.ref, m.name))
    return out


def judge(target: str, candidates: Sequence[Candidate]) -> tuple[list[Candidate], list[Refused]]:
    """(drafts to measure, drafts refused with the check's first reason). The
    check reads files only (no conversion, no download); one it cannot
    decide is measured, and the engine's own check at load has the last word."""
    fit: list[Candidate] = []
    refused: list[Refused] = []
    for c in candidates:
        try:
            report = check(target, c.ref, allow_work=False)
        except Exception:  # noqa: BLE001 - not decidable from the files: the load decides
            fit.append(c)
            continue
        if report.compatible:
            fit.append(c)
        else:
            refused.append(Refused(c.ref, c.name, "; ".join(report.reasons) or "incompatible"))
    return fit, refused


def candidates_for(refs: Sequence[str]) -> list[Candidate]:
    """Drafts a person named (``--draft``), named as the library names them."""
    out = []
    for ref in refs:
        try:
            name = describe(ref, allow_work=False).name
        except Exception:  # noqa: BLE001 - an unknown reference is refused at its load
            name = ref
        out.append(Candidate(ref, name or ref))
    return out


# -- measuring -----------------------------------------------------------------------


class _Steps:
    """Progress over the whole search: one unit for the plain run and one
    per draft to measure, each split over its prompts."""

    def __init__(self, units: int, say: Progress):
        self.units = max(1, units)
        self.unit = 0
        self.say = say

    def report(self, message: str, done: int = 0, total: int = 1) -> None:
        fraction = (self.unit + done / max(1, total)) / self.units
        self.say(SearchProgress(message, min(1.0, fraction)))

    def prompt_reporter(self, what: str) -> Callable[[int, int], None]:
        return lambda done, total: self.report(f"{what}: prompt {done} of {total}", done, total)


def _wait(job, cancelled: threading.Event, on_event: Callable | None = None):
    """A job's result; a cancel is passed on to it at its next event."""

    def event(ev) -> None:
        if cancelled.is_set():
            job.cancel()
        if on_event is not None:
            on_event(ev)

    return job.wait(on_event=event)


def search(client: EngineClient, target: str, sample: Sample, *,
           drafts: Sequence[str] | None = None, again: bool = False,
           max_tokens: int = rec.DEFAULT_MAX_TOKENS, cancelled: threading.Event | None = None,
           progress: Progress | None = None) -> Recommendation:
    """Measure every compatible draft for ``target`` (the installed ones, or
    ``drafts``) on ``sample`` and rank them. Blocks; call it off the GUI
    thread. Raises EngineError/LibraryError when the target cannot be loaded;
    a draft that cannot is listed as refused with the engine's reason."""
    cancelled = cancelled or threading.Event()
    say = progress or (lambda _p: None)
    machine = rec.machine()
    say(SearchProgress("Checking which drafts fit…", 0.0))
    candidates = candidates_for(drafts) if drafts is not None else installed_drafts(target)
    fit, refused = judge(target, candidates)
    known = {} if again else rec.remembered(target, machine)
    results: list[DraftResult] = [known[c.ref] for c in fit if c.ref in known]
    pending = [c for c in fit if c.ref not in known]
    steps = _Steps(len(pending) + 1, say)
    done: set[str] = set()

    def outcome() -> Recommendation:
        left = tuple(c.ref for c in pending if c.ref not in done)
        return Recommendation(target, machine, sample, tuple(rec.rank(results)), tuple(refused),
                              cancelled=cancelled.is_set(), not_measured=left)

    if not pending or cancelled.is_set():
        return outcome()

    def loading(ev) -> None:
        if isinstance(ev, LoadProgress):
            steps.report(f"Loading the {ev.stage}: {ev.message}")

    try:
        steps.report("Loading the target…")
        _wait(client.load(target), cancelled, loading)
    except EngineError:
        if cancelled.is_set():
            return outcome()
        raise
    plain = None  # measured once the first draft loads (none may)

    def measure_one(c: Candidate) -> DraftResult:
        """The draft loaded beside the target and measured; _Refusal when
        the engine will not load or run it."""
        nonlocal plain
        steps.report(f"Loading {c.name}…")
        try:
            pair = _wait(client.load(target, c.ref), cancelled, loading)
        except EngineError as exc:
            raise _Refusal(str(exc)) from exc
        if not pair.speculative_ok:
            raise _Refusal(pair.reason or "it cannot speculate for this target")
        if plain is None:  # an error here is the target's: it ends the search
            on_plain = steps.prompt_reporter("Plain decoding")
            plain = _wait(client.call(lambda eng: measure.measure_plain(
                eng, sample.prompts, max_tokens, cancelled, on_plain)), cancelled)
            steps.unit += 1
        on_draft = steps.prompt_reporter(c.name)
        try:
            run = _wait(client.call(lambda eng: measure.measure_draft(
                eng, sample.prompts, max_tokens, cancelled, on_draft)), cancelled)
        except EngineError as exc:
            raise _Refusal(str(exc)) from exc
        return rec.make_result(
            target=target, draft=c.ref, name=c.name, machine=machine,
            compute=f"{pair.compute.device}/{pair.compute.dtype}",
            drafted=run.tally.drafted, accepted=run.tally.accepted, judged=run.tally.judged,
            draft_cost=run.costs.draft_cost, verify_slope=run.costs.verify_slope,
            tokens=run.tally.new_tokens, tokens_per_s=run.tally.tokens_per_s,
            plain_tokens_per_s=plain.tokens_per_s, prompts=run.tally.runs)

    for c in pending:
        if cancelled.is_set():
            break
        try:
            result = measure_one(c)
        except EngineError as exc:  # a _Refusal, or the target's own error
            if cancelled.is_set():
                break
            if not isinstance(exc, _Refusal):
                raise
            refused.append(Refused(c.ref, c.name, str(exc)))
        else:
            rec.remember(result)  # now: a cancel later keeps it
            results.append(result)
            steps.report(f"{c.name}: {result.summary()}", 1, 1)
        done.add(c.ref)
        steps.unit += 1
    return outcome()


class _Refusal(EngineError):
    """The engine would not load or run one draft: it is listed, the search goes on."""
