"""With sampling, speculative output must follow the target's processed
distribution exactly (Leviathan et al. rejection sampling), and acceptance
must be at least what mlx-lm's token-equality rule achieves.

Statistical tests use fixed seeds and a chi-square goodness-of-fit test at
significance ALPHA: if the implementation is right, each such test would
fail for a fraction ALPHA of seed choices (so 0.1% false-failure rate per
test); since seeds are fixed, a given machine's result is deterministic.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from scipy import stats
from specchat.engine import acceptance
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.sampling import processed_logprobs
from specchat.engine.session import Engine

ALPHA = 1e-3


def chi_square_p(counts: dict, probs: dict, n: int) -> float:
    """p-value of observed counts against exact probabilities; cells with an
    expected count under 5 are pooled into one."""
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
    unexpected = sum(c for key, c in counts.items() if key not in probs)
    pool_o += unexpected
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-9))
    return float(stats.chisquare(obs, np.array(exp) * (sum(obs) / sum(exp))).pvalue)


# -- the acceptance rule on known distributions ------------------------------------------

def _dist(rng, v, peak):
    x = rng.gamma(0.5, size=v)
    x[rng.integers(v)] += peak
    return x / x.sum()


@pytest.mark.parametrize("deterministic", [False, True])
def test_rejection_rule_outputs_the_target_distribution(deterministic):
    """Single position: draw x ~ q (or a fixed proposal), apply the rule, and
    the emitted token must be distributed as p."""
    rng = np.random.default_rng(7)
    v = 8
    p = _dist(rng, v, 1.0)
    q = _dist(rng, v, 2.0)
    p_lp = mx.log(mx.array(np.stack([p, p]), dtype=mx.float32))
    n_samples = 6000
    key = mx.random.key(11)
    keys = mx.random.split(key, n_samples * 2)
    xs = rng.choice(v, size=n_samples, p=q)
    counts: dict[int, int] = {}
    accepted = 0
    for i in range(n_samples):
        x = 3 if deterministic else int(xs[i])
        q_arg = None if deterministic else mx.array(q[None], dtype=mx.float32)
        n, nxt = acceptance.rejection(p_lp, mx.array([x]), q_arg, keys[i]).tolist()
        tok = x if n == 1 else nxt
        accepted += n
        counts[tok] = counts.get(tok, 0) + 1
    probs = {t: float(p[t]) for t in range(v)}
    assert chi_square_p(counts, probs, n_samples) > ALPHA
    # Acceptance rate: sum min(p, q) for a sampled draft, p(x) for a fixed one.
    expected = float(p[3]) if deterministic else float(np.minimum(p, q).sum())
    assert accepted / n_samples == pytest.approx(expected, abs=0.03)


def test_rejection_accepts_more_than_token_equality():
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = _dist(rng, 50, rng.uniform(0, 5))
        q = _dist(rng, 50, rng.uniform(0, 5))
        assert np.minimum(p, q).sum() >= (p * q).sum() - 1e-12


def test_processed_distribution_applies_top_p_top_k_temperature():
    logits = mx.array([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    lp = processed_logprobs(logits, SamplingParams(temperature=0.5, top_k=3))
    probs = np.array(mx.exp(lp))[0]
    assert probs[3:].sum() == 0
    raw = np.exp(np.array([4.0, 3.0, 2.0]) / 0.5)
    assert probs[:3] == pytest.approx(raw / raw.sum(), rel=1e-5)
    lp = processed_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    probs = np.array(mx.exp(lp))[0]
    assert probs[0] == pytest.approx(1.0)


# -- end to end on tiny models ------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft):
    e = Engine()
    e.load(tiny_target, tiny_draft)
    return e


PROMPT = (45, 120, 33, 250, 91, 45, 120, 33)


@pytest.fixture(scope="module")
def echo_prompt(engine):
    """s + greedy(s) + s: prompt lookup proposes what the target itself
    continued s with, so its proposals are accepted some of the time."""
    s = (45, 120, 33, 250, 91)
    g = engine.generate(GenerateRequest(prompt_ids=s, max_tokens=6,
                                        draft=DraftSettings(mode="plain"))).token_ids
    return (*s, *g, *s)


def exact_joint(engine, sampling, prompt=PROMPT):
    """Exact target probabilities of the first two generated tokens."""
    from mlx_lm.models.cache import make_prompt_cache
    from specchat.engine.runner import Runner

    model = engine.target.model
    runner = Runner(model, engine.target.info.model_type)

    def dist(ids):
        logits = runner(list(ids), make_prompt_cache(model), "last").astype(mx.float32)
        return np.array(mx.exp(processed_logprobs(logits, sampling)))[0]

    p1 = dist(prompt)
    joint = {}
    for t1 in np.nonzero(p1 > 0)[0]:
        p2 = dist((*prompt, int(t1)))
        for t2 in np.nonzero(p2 > 0)[0]:
            joint[(int(t1), int(t2))] = float(p1[t1] * p2[t2])
    return joint


@pytest.mark.parametrize("mode,k,sampling", [
    ("draft", 2, SamplingParams(temperature=1.0, top_k=5)),
    ("draft", None, SamplingParams(temperature=0.8, top_p=0.9, top_k=6)),
    ("lookup", 3, SamplingParams(temperature=1.2, top_k=5)),
])
def test_speculative_samples_follow_the_target(engine, echo_prompt, mode, k, sampling):
    check_distribution(engine, echo_prompt if mode == "lookup" else PROMPT, mode, k, sampling)


@pytest.fixture
def pruned_engine(tiny_target, tiny_draft):
    from tinymodels import prune_draft_head

    e = Engine()
    e.load(tiny_target, tiny_draft)
    prune_draft_head(e, keep=64)
    return e


def test_pruned_draft_head_samples_follow_the_target(pruned_engine):
    """q is the draft's distribution over its pruned rows (the target's top
    tokens may lie outside them): rejection sampling stays exact."""
    check_distribution(pruned_engine, PROMPT, "draft", 2,
                       SamplingParams(temperature=1.0, top_k=8))


def check_distribution(engine, prompt, mode, k, sampling):
    joint = exact_joint(engine, sampling, prompt)
    assert abs(sum(joint.values()) - 1) < 1e-4
    n = 1200
    counts: dict = {}
    drafted = accepted = 0
    for seed in range(n):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed)
        r = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=3, sampling=s,
                                            draft=DraftSettings(mode=mode, k=k)))
        key = tuple(r.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        drafted += r.summary.drafted
        accepted += r.summary.accepted
    assert drafted > n / 5  # speculation really ran
    assert 0 < accepted < drafted
    assert chi_square_p(counts, joint, n) > ALPHA


def test_plain_sampling_also_follows_the_target(engine):
    sampling = SamplingParams(temperature=1.0, top_k=5)
    joint = exact_joint(engine, sampling)
    n = 1000
    counts: dict = {}
    for seed in range(n):
        s = SamplingParams(1.0, 1.0, 5, seed)
        r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=2, sampling=s,
                                            draft=DraftSettings(mode="plain")))
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert chi_square_p(counts, joint, n) > ALPHA


def test_seeded_runs_are_reproducible(engine):
    s = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    for mode in ("plain", "draft", "hybrid", "lookup"):
        a = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=30, sampling=s,
                                            draft=DraftSettings(mode=mode)))
        b = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=30, sampling=s,
                                            draft=DraftSettings(mode=mode)))
        assert a.token_ids == b.token_ids


def test_rejection_acceptance_beats_token_equality(engine):
    """Same pair, same settings: Leviathan acceptance vs mlx-lm's equality rule."""
    sampling_rates = {}
    for rule in ("rejection", "equality"):
        drafted = accepted = 0
        for seed in range(50):
            r = engine.generate(GenerateRequest(
                prompt_ids=PROMPT, max_tokens=24,
                sampling=SamplingParams(temperature=1.0, seed=seed),
                draft=DraftSettings(mode="draft", k=3, acceptance=rule)))
            drafted += r.summary.drafted
            accepted += r.summary.accepted
        sampling_rates[rule] = accepted / drafted
    assert sampling_rates["rejection"] > sampling_rates["equality"] + 0.05, sampling_rates
