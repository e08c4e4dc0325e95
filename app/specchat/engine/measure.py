"""Measuring the loaded pair on a few prompts, for the draft recommendation
(library/draft_search.py): how fast plain decoding is, how often the target
accepts the draft's tokens, and what a draft forward costs next to a target
forward. Each function runs on the engine thread (submit it with
``EngineClient.call``) and returns plain frozen values.

The runs are the engine's own ``generate``, greedy, in the draft-only mode,
so acceptance is the draft model's alone (no suffix matches mixed in) and
the speed is what a reply gets. The forward costs are timed the way
decoding runs them, as the bench does (tools/forward_timing.py).

Importing this module loads no MLX (it does so when a measurement runs), so
the library and the window may name its functions and values.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, Message, StepEvent

if TYPE_CHECKING:
    from specchat.engine.session import Engine

# (prompts done, prompts in all): called on the engine thread after each run.
OnPrompt = Callable[[int, int], None]
WARM_UP_TOKENS = 4
TIMING_REPS = 3
VERIFY_TOKENS = 9  # the target forward timed for the verify slope


class MeasureCancelled(EngineError):
    """The person cancelled: the runs so far are discarded."""

    def __init__(self) -> None:
        super().__init__("Measuring cancelled.")


@dataclass(frozen=True)
class Tally:
    """Runs over the sample, added up. ``judged`` counts the draft tokens
    the target judged: accepted ones, plus the first rejected one of each
    block (the tokens after it are never looked at)."""

    runs: int
    new_tokens: int
    decode_s: float
    steps: int
    drafted: int
    accepted: int
    judged: int

    @property
    def tokens_per_s(self) -> float:
        """Decoding speed over the sample (prefill left out, as the bench does)."""
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds per forward pass on the sample's first prompt."""

    target_s: float  # the target over one token
    target_verify_s: float  # the target over VERIFY_TOKENS tokens
    draft_s: float  # the draft over one token (last-position logits)

    @property
    def draft_cost(self) -> float:
        """One draft forward in one-token target forwards (the formula's c)."""
        return self.draft_s / self.target_s if self.target_s > 0 else 0.0

    @property
    def verify_slope(self) -> float:
        """Each extra verified token, in one-token target forwards."""
        if self.target_s <= 0:
            return 0.0
        return max(0.0, (self.target_verify_s - self.target_s) / (VERIFY_TOKENS - 1)
                   / self.target_s)


@dataclass(frozen=True)
class DraftRun:
    """The loaded draft measured: its runs and its forward costs."""

    draft: str  # the draft's name
    tally: Tally
    costs: ForwardCosts


def _request(prompt: str, mode: modes.Mode, max_tokens: int) -> GenerateRequest:
    """One prompt, greedy, K adaptive. Break-even auto-off is off: it would
    pause a poor draft and so hide how poor it is, which is what is measured."""
    return GenerateRequest(messages=(Message("user", prompt),), max_tokens=max_tokens,
                           draft=DraftSettings(mode=mode.name, auto_off=False))


def run_prompts(engine: Engine, prompts: Sequence[str], mode: modes.Mode, max_tokens: int,
                cancelled: threading.Event | None = None,
                on_prompt: OnPrompt | None = None) -> Tally:
    """Each prompt once in ``mode``, from an empty cache, after one short
    uncounted run (the first call after a load allocates). Greedy, so the
    plain and the speculative runs produce the same tokens."""
    cancelled = cancelled or threading.Event()
    if not prompts:
        raise EngineError("There are no prompts to measure with.")
    engine.reset_cache()
    engine.generate(_request(prompts[0], mode, WARM_UP_TOKENS), cancelled)
    runs = []  # per prompt, Tally's fields after ``runs``
    for i, prompt in enumerate(prompts):
        if cancelled.is_set():
            raise MeasureCancelled()
        engine.reset_cache()
        events: list[StepEvent] = []
        result = engine.generate(_request(prompt, mode, max_tokens), cancelled, events.append)
        if cancelled.is_set():
            raise MeasureCancelled()
        s = result.summary
        judged = sum(e.accepted + (1 if e.accepted < e.drafted else 0) for e in events if e.drafted)
        runs.append((s.new_tokens, max(0.0, s.wall_s - s.prefill_s), s.steps, s.drafted,
                     s.accepted, judged))
        if on_prompt is not None:
            on_prompt(i + 1, len(prompts))
    return Tally(len(prompts), *(sum(field) for field in zip(*runs, strict=True)))


def measure_plain(engine: Engine, prompts: Sequence[str], max_tokens: int,
                  cancelled: threading.Event | None = None,
                  on_prompt: OnPrompt | None = None) -> Tally:
    """The target alone on the sample: the speed every draft is compared with."""
    if engine.target is None:
        raise EngineError("No model is loaded.")
    return run_prompts(engine, prompts, modes.PLAIN, max_tokens, cancelled, on_prompt)


def measure_draft(engine: Engine, prompts: Sequence[str], max_tokens: int,
                  cancelled: threading.Event | None = None,
                  on_prompt: OnPrompt | None = None) -> DraftRun:
    """The loaded draft on the sample, and its forward costs."""
    if engine.model_drafter is None:
        raise EngineError("No draft model is loaded.")
    tally = run_prompts(engine, prompts, modes.DRAFT, max_tokens, cancelled, on_prompt)
    if cancelled is not None and cancelled.is_set():
        raise MeasureCancelled()
    ids = engine.prompt_ids(_request(prompts[0], modes.DRAFT, max_tokens))
    return DraftRun(engine.draft.info.name, tally, forward_costs(engine, ids))


# -- forward passes ---------------------------------------------------------------


def prefill(model, cache, ids: list[int]) -> None:
    """Fill ``cache`` with ``ids`` in the engine's prefill chunks."""
    import mlx.core as mx

    from specchat.engine.kv import PREFILL_CHUNK

    for i in range(0, len(ids), PREFILL_CHUNK):
        model(mx.array(ids[i:i + PREFILL_CHUNK])[None], cache=cache)
        mx.eval([c.state for c in cache])


def step_time(forward, ids: list[int], m: int, cache, reps: int) -> float:
    """Median seconds for ``forward(last m ids, cache)``, the cache rewound
    after each run so every repetition sees the same context."""
    import mlx.core as mx

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(forward(ids[-m:], cache))
        times.append(time.perf_counter() - t0)
        for c in cache:
            c.trim(m)
    return statistics.median(times)


def forward_times(engine: Engine, ids: list[int], tokens: Sequence[int],
                  reps: int = TIMING_REPS) -> dict:
    """Seconds per forward on the context ``ids``, each timed as decoding
    runs it: the target's over each of ``tokens`` tokens with logits for
    every position (``"target"``, by token count), and one drafted token of
    the pair's draft (``"draft"``, when one is loaded): a draft model's
    forward with the last position's logits over its (pruned) head, a
    head's chained forward and logits, or what a drafter that times itself
    says (``Drafter.step_seconds``)."""
    from mlx_lm.models.cache import make_prompt_cache

    from specchat.engine.head_drafter import HeadDrafter

    def timed(model, forward, m: int) -> float:
        cache = make_prompt_cache(model)  # a fresh one holding ids, in the engine's chunks
        prefill(model, cache, ids)
        return step_time(forward, ids, m, cache, reps)

    target, drafter = engine.target_runner, engine.model_drafter
    if target is None:
        raise EngineError("No model is loaded.")
    out = {"target": {m: timed(target.model, lambda x, c: target(x, c, "all"), m)
                      for m in tokens}}
    own = drafter.step_seconds(target, ids, reps) if drafter is not None else None
    if own is not None:
        out["draft"] = own
    elif isinstance(drafter, HeadDrafter):
        out["draft"] = _head_step_time(engine, drafter, ids, reps)
    elif drafter is not None:
        out["draft"] = timed(drafter.runner.model, drafter.forward_last, 1)
    return out


def _head_step_time(engine: Engine, drafter, ids: list[int], reps: int) -> float:
    """Seconds per token a head drafts: one chained forward of its layers and
    its logits, after its cache holds the prompt's rows fed the target's
    real features (the target run once with its tap on). The head is reset
    afterwards: the next request feeds it again from the target's cache."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    runner = engine.target_runner
    out, tapped = runner.tapped_forward(ids, make_prompt_cache(runner.model), "none",
                                        drafter.tap_layers)
    mx.eval(out)
    feats = drafter.features(tapped)
    drafter.reset()
    out = drafter.forward(mx.array(ids[1:], dtype=mx.uint32), feats[:-1], fed=True)
    mx.eval(out)
    h, last = out[-1:], mx.array(ids[-1:], dtype=mx.uint32)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(drafter.logits(drafter.forward(last, h, fed=False)))
        times.append(time.perf_counter() - t0)
        for c in drafter.cache:
            c.trim(1)
    drafter.reset()
    return statistics.median(times)


def forward_costs(engine: Engine, ids: list[int], reps: int = TIMING_REPS) -> ForwardCosts:
    """The target over 1 and VERIFY_TOKENS tokens and one drafted token of
    the draft (forward_times)."""
    times = forward_times(engine, ids, (1, VERIFY_TOKENS), reps)
    return ForwardCosts(target_s=times["target"][1],
                        target_verify_s=times["target"][VERIFY_TOKENS], draft_s=times["draft"])
