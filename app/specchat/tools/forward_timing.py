"""Timing forward passes of a loaded pair the way decoding runs them, for
the bench's cost table and theoretical speedups (and
benchmarks/forward_costs.py)."""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specchat.engine import costs
from specchat.engine.head_drafter import HeadDrafter
from specchat.engine.measure import prefill, step_time
from specchat.engine.session import Engine

__all__ = ["leviathan", "measure_costs", "prefill", "relative_costs", "step_time"]


def measure_costs(engine: Engine, ids: list[int], reps: int = 3) -> dict:
    """Seconds per target forward over m tokens and per draft forward, on a
    real context, for Leviathan's formula. Each is timed as decoding runs it:
    the target with logits for every position, the draft with logits for the
    last position over its (pruned) head."""

    def timed(model, forward, m: int) -> float:
        cache = make_prompt_cache(model)
        prefill(model, cache, ids)
        return step_time(forward, ids, m, cache, reps)

    target = engine.target_runner
    costs = {"target": {m: timed(target.model, lambda x, c: target(x, c, "all"), m)
                        for m in (1, 3, 5, 9)}}
    drafter = engine.model_drafter
    if isinstance(drafter, HeadDrafter):
        costs["draft"] = head_step_time(engine, drafter, ids, reps)
    elif drafter is not None:
        costs["draft"] = timed(drafter.runner.model, drafter.forward_last, 1)
    return costs


def head_step_time(engine: Engine, drafter: HeadDrafter, ids: list[int], reps: int) -> float:
    """Seconds per token a head drafts: one chained forward of its layers and
    its logits, after its cache holds the prompt's rows fed the target's
    real features (the target run once with its tap on). The head is reset
    afterwards: the next request feeds it again from the target's cache."""
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
