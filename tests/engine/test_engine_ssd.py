"""The `ssd` mode (engine/ssd/): the draft drafts the next block on its own
thread while the target verifies. Hits change where the time goes, never
the tokens: greedy output is plain decoding's, sampled output follows the
target's distribution, and a speculated block is the very block the engine
would have drafted itself.

Whether a guess is ready in time depends on the clock; the tests that count
hits use ``Settings(settle=True, keys=N)``: a fixed number of keys per
block, all drafted before the outcome is looked up, so the counts are the
same on every run and every machine."""

from __future__ import annotations

import pytest
from sampling_checks import ALPHA, chi_square_p, exact_joint
from specchat.engine import blas, drafter_kinds, modes, threads
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.session import Engine
from specchat.engine.ssd import drafter as ssd
from specchat.engine.ssd import plan, worker

PROMPTS = [
    (45, 120, 33, 250, 91, 45, 120, 33),
    (5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7),  # repetitive: long accepted runs
    tuple(range(20, 60)),
]
SETTLED = ssd.Settings(settle=True, keys=4)


@pytest.fixture
def settled(monkeypatch):
    monkeypatch.setattr(ssd, "DEFAULTS", SETTLED)


GREEDY = SamplingParams()


def _run(engine, prompt, mode="ssd", k=None, max_tokens=40, sampling=GREEDY):
    return engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=max_tokens,
                                           sampling=sampling, draft=DraftSettings(mode=mode, k=k)))


def _stats(engine) -> ssd.Stats:
    return engine.drafter("ssd").counts


@pytest.mark.parametrize("settings", [ssd.Settings(), SETTLED], ids=["timed", "settled"])
def test_greedy_ssd_is_plain_decoding(engine, monkeypatch, settings):
    monkeypatch.setattr(ssd, "DEFAULTS", settings)
    for prompt in PROMPTS:
        plain = _run(engine, prompt, "plain")
        assert len(plain.token_ids) == 40
        for k in (None, 3):
            r = _run(engine, prompt, "ssd", k)
            assert r.token_ids == plain.token_ids, (prompt[:3], k)
            assert r.summary.mode == "ssd"


def test_the_next_block_is_ready_on_a_repetitive_prompt(engine, settled):
    """Every step that drafted is a hit, a miss or a fallback (the first step
    has nothing speculated); on a repetitive prompt most are hits, the same
    number every run."""
    counts = []
    for _ in range(2):
        r = _run(engine, PROMPTS[1], k=3)
        s = _stats(engine)
        assert s.hits + s.misses + s.fallbacks == r.summary.steps
        assert s.fallbacks >= 1 and s.hits > s.misses
        assert s.spec_s > 0 and s.draft_s > 0
        counts.append((s.hits, s.misses, s.fallbacks))
    assert counts[0] == counts[1]


def test_a_speculated_block_is_the_block_drafting_makes(engine, monkeypatch):
    """Seeded sampling: never speculating, speculating with every guess
    ready, and speculating on the clock give the same tokens."""
    hits = 0
    for prompt in PROMPTS[:2]:
        for seed in range(3):
            s = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
            outs = []
            for settings in (ssd.Settings(keys=0), SETTLED, ssd.Settings()):
                monkeypatch.setattr(ssd, "DEFAULTS", settings)
                outs.append(_run(engine, prompt, max_tokens=30, sampling=s).token_ids)
                if settings is SETTLED:
                    hits += _stats(engine).hits
            assert outs[0] == outs[1] == outs[2], (prompt[:3], seed)
    assert hits > 0


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_ssd_samples_follow_the_target(engine, settled):
    """The first four tokens with K = 1: the first step emits one or two of
    them, so a later step takes its block from the speculation cache
    whenever the guess was right, and the joint distribution of the four is
    still the target's (chi-square, as in test_engine_sampling)."""
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt, length, n = PROMPTS[0], 4, 800
    joint = exact_joint(engine.target.model, sampling, prompt, length)
    counts: dict = {}
    hits = drafted = 0
    for seed in range(n):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed)
        r = _run(engine, prompt, k=1, max_tokens=length, sampling=s)
        key = tuple(r.token_ids)
        counts[key] = counts.get(key, 0) + 1
        hits += _stats(engine).hits
        drafted += r.summary.drafted
    assert hits > n / 2  # blocks really came from the cache
    assert drafted > n
    assert chi_square_p(counts, joint) > ALPHA


def test_the_mode_is_registered_and_explained(engine):
    mode = modes.get("ssd")
    assert mode.needs_draft_model and mode.drafters == ("ssd",)
    assert "Apple Silicon" in mode.description and "CPU" in mode.description
    kind = drafter_kinds.get("ssd")
    assert kind.uses_draft_model and kind.calibrated
    # The engine keeps the one its kind made around its draft model, so its
    # timings carry over from one request to the next.
    made = engine.drafter("ssd")
    assert isinstance(made, ssd.SpeculativeDrafter) and made.model is engine.model_drafter
    assert engine.drafter("ssd") is made


def test_ssd_needs_a_draft_model(tiny_target):
    e = Engine()
    e.load(tiny_target)
    with pytest.raises(EngineError, match="needs a draft model, which is not loaded"):
        _run(e, PROMPTS[0])


def test_the_worker_parks_and_gives_the_cores_back(engine):
    """Once a request's last speculation is over, the worker is out of MLX
    and the BLAS has the governor's thread count again."""
    _run(engine, PROMPTS[1], k=3)
    worker.worker().park()
    gov = threads.governor()
    if blas.get_threads() is not None:
        assert blas.get_threads() == gov.threads


def test_fan_out_follows_the_ending_probabilities():
    """At a constant acceptance a, P(n) = a^n (1 - a) and a^K: keys per
    position fall geometrically, the bonus position gets its boost, the
    budget is spent exactly and no position exceeds its cap."""
    a, k = 0.8, 5
    p = plan.ending_probs([a] * k)
    assert sum(p) == pytest.approx(1.0)
    assert p[0] == pytest.approx(1 - a) and p[-1] == pytest.approx(a ** k)
    f = plan.fan_out(p, 12, [plan.F_MAX] * (k + 1))
    assert sum(f) == 12 and max(f) <= plan.F_MAX
    assert f[:k] == sorted(f[:k], reverse=True) and f[0] > f[k - 1]
    assert f[k] >= f[k - 1]  # a^K is (1 - a)^-1 times a^K (1 - a)
    assert plan.fan_out(p, 40, [2] * (k + 1)) == [2] * (k + 1)  # capped, not over-spent


def test_the_summary_reports_hits_and_overlap(engine, settled):
    r = _run(engine, PROMPTS[1], k=3)
    s = _stats(engine)
    got = r.summary.drafter_stats["ssd"]
    assert (got["hits"], got["misses"], got["fallbacks"]) == (
        s.hits, s.misses, s.fallbacks)
    assert got["hits"] > 0 and 0 <= got["overlap"] <= 1
