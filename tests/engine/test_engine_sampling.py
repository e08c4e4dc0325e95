"""With sampling, speculative output must follow the target's processed
distribution exactly (Leviathan et al. rejection sampling), and acceptance
must beat mlx-lm's token-equality rule.

Every expected distribution here is computed independently of the engine:
numpy from raw logits, in the documented order (top-p on the model's
log-probabilities, then top-k, then temperature: mlx-lm's sampler), and the
target's raw logits come from mlx-lm's own model call, not from the engine's
runner.

False failures. Each statistical check (tests/sampling_checks.py) is a
chi-square goodness-of-fit test at significance ALPHA = 1e-3, or a binomial
bound at 4.5 standard errors (about 7e-6 two-sided): for a correct engine, a
check fails for that fraction of seed choices. The module has 12 chi-square
checks and 2 binomial bounds, so a correct engine fails it for at most 1.2%
of seed choices; seeds are fixed, so on a given machine the outcome is
deterministic.

Each check was run against deliberately broken engines (tests/engine/mutants.py):
the residual replaced by the target's distribution, the bonus token drawn
from the last draft position's row, temperature applied before top-p, a wider
draft's extra ids left in. Each is caught; which tests catch which is listed
in that file's docstring.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from sampling_checks import (
    ALPHA,
    check_distribution,
    chi_square_p,
    exact_joint,
    reference_probs,
    sample_counts,
    within,
)
from specchat.engine import acceptance
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.sampling import processed_logprobs
from specchat.engine.session import Engine

# -- the processed distribution ------------------------------------------------------------

SETTINGS = [SamplingParams(temperature=t, top_p=tp, top_k=tk)
            for t in (0.5, 0.8, 1.0, 1.6) for tp in (1.0, 0.9, 0.6) for tk in (0, 3, 12)]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_processed_distribution_matches_the_reference(params):
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(6, 40)) * 2.5
    got = np.array(mx.exp(processed_logprobs(mx.array(logits, dtype=mx.float32), params)))
    for row, g in zip(logits, got, strict=True):
        want = reference_probs(row, params)
        assert (g > 0).tolist() == (want > 0).tolist()  # the same support
        assert np.allclose(g, want, atol=2e-6, rtol=1e-4)


# -- one verify step, on known distributions ----------------------------------------------

def _dist(rng, v, peak):
    x = rng.gamma(0.5, size=v)
    x[rng.integers(v)] += peak
    return x / x.sum()


def step_outcome_probs(p: np.ndarray, q: np.ndarray | None, drafts=None) -> dict:
    """Exact P(n accepted, next token) of one verify step with K = len(p) - 1
    drafts, each drawn from its q row (or fixed, with q one-hot).

    Position i accepts with probability a_i = sum min(p_i, q_i); after a
    rejection at i the next token follows norm(max(0, p_i - q_i)); after K
    acceptances it follows p_K (the bonus row)."""
    k = len(p) - 1
    if q is None:
        q = np.zeros((k, p.shape[1]))
        q[np.arange(k), drafts] = 1.0
    out = {}
    survive = 1.0
    for i in range(k):
        a = np.minimum(p[i], q[i]).sum()
        resid = np.maximum(p[i] - q[i], 0.0)
        resid = resid / resid.sum() if resid.sum() > 0 else p[i]
        for y, r in enumerate(resid):
            if r > 0:
                out[(i, y)] = survive * (1 - a) * r
        survive *= a
    for y, r in enumerate(p[k]):
        out[(k, y)] = survive * r
    return out


def run_step(p: np.ndarray, q: np.ndarray | None, drafts: np.ndarray, key) -> tuple[int, int]:
    p_lp = mx.log(mx.array(p, dtype=mx.float32))
    q_arg = None if q is None else mx.array(q, dtype=mx.float32)
    n, nxt = acceptance.rejection(p_lp, mx.array(drafts.astype(np.int32)), q_arg, key).tolist()
    return n, nxt


def _pq(k: int, v: int, seed: int):
    """K+1 target rows and K draft rows close to them (per-token acceptance
    around 0.75), so every outcome, the bonus included, is well sampled."""
    rng = np.random.default_rng(seed)
    p = np.stack([_dist(rng, v, 1.5) for _ in range(k + 1)])
    q = np.stack([0.55 * p[i] + 0.45 * _dist(rng, v, 1.5) for i in range(k)])
    return p, q / q.sum(axis=1, keepdims=True), rng


@pytest.mark.parametrize("k", [3, 5])
def test_one_step_with_sampled_drafts_has_the_exact_outcome_distribution(k):
    """(n, next) over every n: the residual after a rejection at each of the
    K positions, and the bonus row when all K are accepted. The first token
    the step emits (the first draft if accepted, else the correction) must
    follow p_0."""
    v, trials = 6, 12_000
    p, q, rng = _pq(k, v, seed=10 + k)
    keys = mx.random.split(mx.random.key(k), trials)
    counts: dict = {}
    first: dict = {}
    for t in range(trials):
        drafts = np.array([rng.choice(v, p=q[i]) for i in range(k)])
        n, nxt = run_step(p, q, drafts, keys[t])
        counts[(n, nxt)] = counts.get((n, nxt), 0) + 1
        tok = int(drafts[0]) if n > 0 else nxt
        first[tok] = first.get(tok, 0) + 1
    expected = step_outcome_probs(p, q)
    assert sum(c for (n, _), c in counts.items() if n == k) > trials / 10  # bonus well sampled
    assert all(sum(c for (n, _), c in counts.items() if n == i) > trials / 40 for i in range(k))
    assert chi_square_p(counts, expected) > ALPHA
    assert chi_square_p(first, {t: float(p[0][t]) for t in range(v)}) > ALPHA


def test_one_step_with_a_fixed_proposal_has_the_exact_outcome_distribution():
    """A prompt-lookup proposal is a draft with one-hot q: accept with p_i(x_i),
    residual p_i without x_i, then the bonus row."""
    k, v, trials = 4, 6, 10_000
    rng = np.random.default_rng(3)
    drafts = rng.integers(v, size=k)
    p = np.stack([_dist(rng, v, 1.0) for _ in range(k + 1)])
    p[np.arange(k), drafts] += 2.5  # the proposal is usually right
    p /= p.sum(axis=1, keepdims=True)
    keys = mx.random.split(mx.random.key(99), trials)
    counts: dict = {}
    for t in range(trials):
        out = run_step(p, None, drafts, keys[t])
        counts[out] = counts.get(out, 0) + 1
    assert sum(c for (n, _), c in counts.items() if n == k) > trials / 10
    assert chi_square_p(counts, step_outcome_probs(p, None, drafts)) > ALPHA


def test_acceptance_rates_of_rejection_and_equality_rules():
    """On the same drafts, min(1, p/q) accepts sum min(p, q) of them and
    mlx-lm's equality rule sum p*q; both measured through the engine's rules."""
    v, trials = 8, 6000
    rng = np.random.default_rng(21)
    p = np.stack([_dist(rng, v, 2.0), _dist(rng, v, 2.0)])
    q = (0.6 * p[0] + 0.4 * _dist(rng, v, 2.0))[None]
    q /= q.sum()
    p_lp = mx.log(mx.array(p, dtype=mx.float32))
    q_mx = mx.array(q, dtype=mx.float32)
    keys = mx.random.split(mx.random.key(4), trials)
    acc = {"rejection": 0, "equality": 0}
    for t in range(trials):
        x = mx.array([int(rng.choice(v, p=q[0]))], dtype=mx.int32)
        acc["rejection"] += acceptance.rejection(p_lp, x, q_mx, keys[t]).tolist()[0]
        acc["equality"] += acceptance.equality(p_lp, x, keys[t]).tolist()[0]
    want_rej = float(np.minimum(p[0], q[0]).sum())
    want_eq = float((p[0] * q[0]).sum())
    assert want_rej - want_eq > 0.2  # a case where the rules differ a lot
    assert within(acc["rejection"] / trials, want_rej, trials), (acc, want_rej)
    assert within(acc["equality"] / trials, want_eq, trials), (acc, want_eq)


# -- end to end on tiny models ------------------------------------------------------------

PROMPT = (45, 120, 33, 250, 91, 45, 120, 33)


@pytest.fixture(scope="module")
def echo_prompt(engine):
    """s + greedy(s) + s: prompt lookup proposes what the target itself
    continued s with, so its proposals are accepted some of the time."""
    s = (45, 120, 33, 250, 91)
    g = engine.generate(GenerateRequest(prompt_ids=s, max_tokens=6,
                                        draft=DraftSettings(mode="plain"))).token_ids
    return (*s, *g, *s)


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_a_whole_block_of_three_and_its_bonus_follow_the_target(engine):
    """K = 3 on the first step: the four tokens it can emit (three drafts and
    the bonus) jointly follow the target, and every outcome of that step
    (rejection at each position, all accepted) occurs."""
    first = check_distribution(engine, PROMPT, "draft", 3, SamplingParams(temperature=1.0, top_k=3),
                               length=4, n=3000)
    assert {k for k, _ in first} == {3}
    outcomes = {n for _, n in first}
    assert outcomes == {0, 1, 2, 3}, outcomes
    assert sum(1 for _, n in first if n == 3) > len(first) / 10


@pytest.mark.parametrize("mode,k,sampling", [
    pytest.param("draft", None, SamplingParams(temperature=0.6, top_p=0.8, top_k=6),
                 marks=pytest.mark.slow),
    pytest.param("suffix", 3, SamplingParams(temperature=1.2, top_k=5), marks=pytest.mark.slow),
    pytest.param("hybrid", 4, SamplingParams(temperature=0.8, top_p=0.7), marks=pytest.mark.slow),
])
def test_speculative_samples_follow_the_target(engine, echo_prompt, mode, k, sampling):
    length = 3 if k else 2
    check_distribution(engine, echo_prompt if mode != "draft" else PROMPT, mode, k, sampling,
                       length=length, n=2000)


@pytest.fixture
def pruned_engine(tiny_engine):
    from tinymodels import prune_draft_head

    prune_draft_head(tiny_engine, keep=64)
    return tiny_engine


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_pruned_draft_head_samples_follow_the_target(pruned_engine):
    """q is the draft's distribution over its pruned rows (the target's top
    tokens may lie outside them): rejection sampling stays exact."""
    check_distribution(pruned_engine, PROMPT, "draft", 3, SamplingParams(temperature=1.0, top_k=8),
                       length=3, n=2000)


def test_plain_sampling_also_follows_the_target(engine):
    sampling = SamplingParams(temperature=0.7, top_p=0.85, top_k=5)
    joint = exact_joint(engine.target.model, sampling, PROMPT, 2)
    counts, *_ = sample_counts(engine, PROMPT, "plain", None, sampling, 2, 1000)
    assert chi_square_p(counts, joint) > ALPHA


def test_seeded_runs_are_reproducible(engine):
    s = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    for mode in ("plain", "draft", "hybrid", "suffix"):
        a = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=30, sampling=s,
                                            draft=DraftSettings(mode=mode)))
        b = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=30, sampling=s,
                                            draft=DraftSettings(mode=mode)))
        assert a.token_ids == b.token_ids


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_rejection_acceptance_beats_token_equality(engine):
    """Same pair, same settings: Leviathan acceptance vs mlx-lm's equality rule."""
    rates = {}
    for rule in ("rejection", "equality"):
        drafted = accepted = 0
        for seed in range(50):
            r = engine.generate(GenerateRequest(
                prompt_ids=PROMPT, max_tokens=24,
                sampling=SamplingParams(temperature=1.0, seed=seed),
                draft=DraftSettings(mode="draft", k=3, acceptance=rule)))
            drafted += r.summary.drafted
            accepted += r.summary.accepted
        rates[rule] = accepted / drafted
    assert rates["rejection"] > rates["equality"] + 0.05, rates


# -- a draft with a wider output layer than the target's ----------------------------------

WIDER_BY = 80


@pytest.fixture(scope="module")
def wide_draft(tiny_dir, tiny_draft):
    """The tiny draft with 80 more vocabulary rows than its target (the same
    tokenizer padded further, as some model families are), and rows that
    outscore everything else: it would propose ids the target does not have."""
    import json
    import shutil

    folder = tiny_dir / "draft-wide"
    if folder.exists():
        return folder
    shutil.copytree(tiny_draft, folder)
    weights = mx.load(str(folder / "model.safetensors"))
    head, emb = weights["lm_head.weight"], weights["model.embed_tokens.weight"]
    extra = mx.broadcast_to(head[:1] * 0, (WIDER_BY, head.shape[1]))
    # Rows along the mean hidden direction score high for most states.
    loud = mx.random.normal((WIDER_BY, head.shape[1]), key=mx.random.key(8)) * 3 * mx.std(head)
    weights["lm_head.weight"] = mx.concatenate([head, extra + loud])
    weights["model.embed_tokens.weight"] = mx.concatenate([emb, mx.zeros((WIDER_BY, emb.shape[1]))])
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] += WIDER_BY
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def wide_engine(tiny_target, wide_draft):
    e = Engine()
    e.load(tiny_target, wide_draft)
    return e


def _recording(engine) -> list[list[int]]:
    """Record the draft model's proposals (the drafter is the engine's own)."""
    drafter = engine.model_drafter
    seen: list[list[int]] = []
    inner = type(drafter).propose

    def propose(context, ctl):
        p = inner(drafter, context, ctl)
        seen.append(list(p.tokens))
        return p

    drafter.propose = propose
    return seen


def test_a_wider_draft_only_proposes_ids_the_target_has(wide_engine):
    vocab = wide_engine.target_runner.head.weight.shape[0]
    assert wide_engine.draft.model.lm_head.weight.shape[0] == vocab + WIDER_BY
    seen = _recording(wide_engine)
    plain = wide_engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                                 draft=DraftSettings(mode="plain")))
    greedy = wide_engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                                  draft=DraftSettings(mode="draft", k=3)))
    assert greedy.token_ids == plain.token_ids
    for seed in range(40):
        r = wide_engine.generate(GenerateRequest(
            prompt_ids=PROMPT, max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=seed),
            draft=DraftSettings(mode="draft", k=3)))
        assert max(r.token_ids) < vocab
    proposed = [t for block in seen for t in block]
    assert len(proposed) > 200
    assert max(proposed) < vocab


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_a_wider_draft_samples_follow_the_target(wide_engine):
    check_distribution(wide_engine, PROMPT, "draft", 2, SamplingParams(temperature=1.0, top_k=6),
                       length=3, n=1500)
