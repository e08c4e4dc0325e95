"""Timing forward passes of a loaded pair the way decoding runs them, for
the bench's cost table and theoretical speedups (and
benchmarks/forward_costs.py): engine/measure.py times them, for the draft
recommendation too."""

from __future__ import annotations

from specchat.engine import costs
from specchat.engine.measure import forward_times, prefill, step_time
from specchat.engine.session import Engine

__all__ = ["leviathan", "measure_costs", "prefill", "relative_costs", "step_time"]


def measure_costs(engine: Engine, ids: list[int], reps: int = 3) -> dict:
    """Seconds per target forward over 1, 3, 5 and 9 tokens and per drafted
    token (measure.forward_times), for Leviathan's formula."""
    return forward_times(engine, ids, (1, 3, 5, 9), reps)


def relative_costs(engine: Engine, ids: list[int]) -> dict:
    """The measured costs, and in one-token target forwards the draft
    forward (c) and each extra verified token (the verify slope)."""
    costs = measure_costs(engine, ids)
    t1 = costs["target"][1]
    return {"target_forward_s": costs["target"], "draft_forward_s": costs.get("draft"),
            "draft_over_target": costs.get("draft", 0.0) / t1,
            "verify_slope": (costs["target"][9] - t1) / 8 / t1}


def leviathan(alpha: float, k: int, c: float, verify) -> float:
    """Leviathan et al.'s speedup over plain decoding: expected tokens per
    step over the step's cost, with K drafts at per-token acceptance alpha."""
    return costs.rate(alpha, k, c, verify)
