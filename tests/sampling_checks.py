"""Statistical checks of sampled output against a target's exact
distribution, for the engine's sampling tests (test_engine_sampling.py)
and every drafter's (a draft model, suffix matching, SSD, a head): the
expected distributions are computed independently of the engine, with numpy
from mlx-lm's raw logits, in the documented order (top-p on the model's
log-probabilities, then top-k, then temperature: mlx-lm's sampler).

A chi-square check fails at significance ALPHA for a correct engine, a
binomial bound (``within``) at SIGMAS standard errors (about 7e-6
two-sided); seeds are fixed, so on a given machine the outcome is
deterministic."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from scipy import stats
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams

ALPHA = 1e-3
SIGMAS = 4.5


def reference_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution of one row of raw logits, in float64:
    softmax; top-p keeps each token whose strictly more probable tokens hold
    less than top_p of the mass; top-k keeps the k most probable of those;
    temperature divides the kept log-probabilities; renormalise."""
    x = np.asarray(logits, dtype=np.float64)
    lp = x - x.max()
    lp = lp - np.log(np.exp(lp).sum())
    p = np.exp(lp)
    keep = np.ones_like(p, dtype=bool)
    if 0.0 < params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep[order[before >= params.top_p]] = False
    if 0 < params.top_k < len(p):
        ranked = np.argsort(-np.where(keep, p, -1.0), kind="stable")
        keep[ranked[params.top_k:]] = False
    t = params.temperature if params.temperature > 0 else 1.0
    z = np.where(keep, lp / t, -np.inf)
    z = z - z[keep].max()
    out = np.where(keep, np.exp(z), 0.0)
    return out / out.sum()


def chi_square_p(counts: dict, probs: dict) -> float:
    """p-value of observed counts against exact probabilities; cells with an
    expected count under 5 are pooled into one (with any unexpected key)."""
    n = sum(counts.values())
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key, p in probs.items():
        e = p * n
        o = counts.get(key, 0)
        if e < 5:
            pool_o += o
            pool_e += e
        else:
            obs.append(o)
            exp.append(e)
    pool_o += sum(c for key, c in counts.items() if key not in probs)
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-9))
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return float(stats.chisquare(obs, exp).pvalue)


def within(observed: float, expected: float, n: int) -> bool:
    sd = max(np.sqrt(expected * (1 - expected) / n), 1e-12)
    return abs(observed - expected) <= SIGMAS * sd


def exact_joint(model, sampling: SamplingParams, prompt, length: int) -> dict:
    """Exact probabilities of the first ``length`` generated tokens: the
    reference distribution of mlx-lm's raw logits at every prefix."""
    def dist(ids):
        logits = model(mx.array(list(ids))[None])[0, -1].astype(mx.float32)
        return reference_probs(np.array(logits), sampling)

    joint = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, pr in joint.items():
            d = dist((*prompt, *seq))
            for t in np.nonzero(d > 0)[0]:
                nxt[(*seq, int(t))] = pr * float(d[t])
        joint = nxt
    return joint


def sample_counts(engine, prompt, mode, k, sampling, length, n) -> tuple[dict, int, int, list]:
    counts: dict = {}
    drafted = accepted = 0
    first_steps = []
    for seed in range(n):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed)
        steps = []
        r = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=length, sampling=s,
                                            draft=DraftSettings(mode=mode, k=k)),
                            on_step=steps.append)
        key = tuple(r.token_ids[:length])
        counts[key] = counts.get(key, 0) + 1
        drafted += r.summary.drafted
        accepted += r.summary.accepted
        if steps:
            first_steps.append((steps[0].drafted, steps[0].accepted))
    return counts, drafted, accepted, first_steps


def check_distribution(engine, prompt, mode, k, sampling, length=2, n=1200):
    joint = exact_joint(engine.target.model, sampling, prompt, length)
    assert abs(sum(joint.values()) - 1) < 1e-6
    counts, drafted, accepted, first = sample_counts(engine, prompt, mode, k, sampling, length, n)
    assert drafted > n / 5  # speculation really ran
    assert 0 < accepted < drafted
    assert chi_square_p(counts, joint) > ALPHA
    return first
