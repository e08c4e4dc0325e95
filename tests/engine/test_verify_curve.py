"""The verify curve timed when a target loads (draft_policy.fit_verify,
CostModel.timed, measure.verify_curve, Engine.cost_for): a second token that
costs half a forward is priced as such, and only requests the clock
may steer are priced with the timing."""

from __future__ import annotations

import pytest
from specchat.engine import measure
from specchat.engine.draft_policy import (
    BreakEven,
    CostModel,
    DraftPolicy,
    ModelledTiming,
    best_k,
    fit_verify,
)
from specchat.engine.drafters import Proposal
from specchat.engine.events import DraftSettings, GenerateRequest, Message, SamplingParams
from specchat.engine.measure import VERIFY_CURVE
from specchat.engine.session import Engine

# The bundled 1.5B target on a 2-core CPU, fastest of five runs each
# (docs/benchmarks.md): a second token costs half a forward, the rest little.
STEPPED = {1: 0.337, 2: 0.508, 3: 0.474, 4: 0.517, 5: 0.542, 9: 0.708}


def test_a_jump_then_a_shallow_slope_is_read_as_such():
    jump, slope = fit_verify(STEPPED)
    # Least squares through (1, 1.507), (2, 1.407), (3, 1.534), (4, 1.608), (8, 2.101).
    assert slope == pytest.approx(0.0958, abs=5e-4)
    assert jump == pytest.approx(0.287, abs=2e-3)
    cost = CostModel(draft=0.25).timed(STEPPED)
    assert cost.verify(1) == 1.0  # plain decoding's step is the unit
    assert cost.verify(2) == pytest.approx(1 + jump + slope)
    assert cost.verify(9) == pytest.approx(1 + jump + 8 * slope)
    assert cost.draft == 0.25  # only the verify curve is timed


def test_a_straight_line_has_no_jump():
    jump, slope = fit_verify({1: 0.4, 3: 0.488, 5: 0.576, 9: 0.752})
    assert jump == pytest.approx(0.0, abs=1e-9)
    assert slope == pytest.approx(0.11)
    assert CostModel(slope=0.11).timed({1: 0.4, 3: 0.488, 9: 0.752}).verify(5) == pytest.approx(1.44)


def test_noisy_or_partial_timings_never_make_verifies_free():
    # Longer verifies timed faster than shorter ones (a busy moment): no negative slope.
    assert fit_verify({1: 0.3, 2: 0.5, 9: 0.45}) == (pytest.approx(0.583, abs=1e-3), 0.0)
    # A forward over several tokens timed faster than one: no negative jump either.
    assert fit_verify({1: 0.5, 2: 0.4, 9: 0.4}) == (0.0, 0.0)
    # Two tokens timed at three forwards' worth (a busy moment): no dearer than two forwards.
    jump, slope = fit_verify({1: 0.3, 2: 0.9, 9: 1.0})
    assert slope == pytest.approx(0.1 / 0.3 / 7)
    assert jump + slope == pytest.approx(1.0)
    untimed = CostModel(draft=0.3, slope=0.11)
    for partial in ({}, {1: 0.3}, {2: 0.4, 9: 0.6}, {1: 0.3, 9: 0.6}, {1: 0.0, 2: 0.4, 9: 0.6}):
        assert fit_verify(partial) is None
        assert untimed.timed(partial) is untimed


def test_the_jump_turns_a_losing_draft_off_that_a_line_would_run():
    """At 60% acceptance a one-token block yields 1.6 tokens. Priced on a
    line (1.11 forwards for two tokens) that pays; at the timed curve's
    1.40 plus the draft's 0.25 it loses to plain decoding, which the timed
    policy keeps to (and probes)."""
    line, timed = CostModel(draft=0.25, slope=0.11), CostModel(draft=0.25).timed(STEPPED)
    assert best_k(0.6, 0.25, line, 12) >= 1
    assert best_k(0.6, 0.25, timed, 12) == 0
    # Good acceptance still drafts long blocks under the timed curve.
    assert best_k(0.9, 0.25, timed, 12) >= best_k(0.9, 0.25, line, 12) >= 4
    policy = DraftPolicy(cost=timed)
    policy.stats("draft").accept = 0.6
    assert policy.declines("draft")


def test_auto_off_guesses_plain_steps_with_the_timed_curve():
    """Before a request has a plain step, auto-off estimates one as a
    speculative verify over the modelled verify(K + 1): with the timed
    curve that guess is the machine's own one-token forward."""
    timed = CostModel(draft=0.25).timed(STEPPED)
    rule = BreakEven(timed, ModelledTiming(timed, plain_s=0.337))
    rule.enabled = True
    proposal = Proposal(tokens=[1, 2, 3, 4], source="draft", forwards=4)
    rule.observe(proposal, 2, 0.0)
    assert rule.plain_step_s == pytest.approx(0.337)
    line = BreakEven(CostModel(draft=0.25, slope=0.11), ModelledTiming(timed, plain_s=0.337))
    line.enabled = True
    line.observe(proposal, 2, 0.0)
    assert line.plain_step_s > 0.337 * 1.1  # a line would think plain decoding slower than it is


@pytest.fixture(scope="module")
def timed_engine(tiny_target, tiny_draft) -> Engine:
    """The tiny pair, its target timed as a real one would be (its forwards
    take a few ms, under MIN_FORWARD_S)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "MIN_FORWARD_S", 0.0)
        engine = Engine()
        engine.load(tiny_target, tiny_draft)
    return engine


def test_a_target_too_fast_to_time_keeps_the_untimed_curve(tiny_target, tiny_draft):
    """A forward of a few ms is dispatch and scheduling: its shape is noise,
    so the tiny models (and the tests' paths) keep the untimed costs."""
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    assert engine.verify_seconds == {}
    assert engine.cost_for(_request()) == engine.cost_model
    runner, ids = engine.target_runner, list(range(20, 40))
    assert measure.verify_curve(runner, ids) == {}
    assert measure.verify_curve(runner, ids, min_forward_s=10.0) == {}
    assert tuple(measure.verify_curve(runner, ids, min_forward_s=0.0)) == VERIFY_CURVE
    assert measure.verify_curve(runner, ids[:9], min_forward_s=0.0) == {}  # too short to time


def _request(**kw) -> GenerateRequest:
    sampling = kw.pop("sampling", SamplingParams())
    return GenerateRequest(messages=(Message("user", "Hello"),), sampling=sampling,
                           draft=DraftSettings(**kw))


def test_loading_times_the_curve_and_only_steerable_requests_use_it(timed_engine):
    seconds = timed_engine.verify_seconds
    assert tuple(seconds) == VERIFY_CURVE
    assert all(s > 0 for s in seconds.values())
    untimed = timed_engine.cost_model
    timed = untimed.timed(seconds)
    assert timed_engine.cost_for(_request()) == timed
    assert timed_engine.cost_for(_request(sampling=SamplingParams(temperature=0.7))) == timed
    # The clock must not steer what promises the same path every run.
    seeded = SamplingParams(temperature=0.7, seed=3)
    assert timed_engine.cost_for(_request(sampling=seeded)) is untimed
    assert timed_engine.cost_for(_request(auto_off=False)) is untimed
    assert timed_engine.cost_for(_request(k=3)) is untimed


def test_a_seeded_reply_does_not_depend_on_the_load_time_timing(timed_engine, tiny_target,
                                                                   tiny_draft):
    """Two loads time different curves; a seeded sampled reply is the same
    from both, and a greedy one is plain decoding's in both."""
    seeded = GenerateRequest(messages=(Message("user", "Tell me a story."),), max_tokens=40,
                             sampling=SamplingParams(temperature=0.9, seed=11),
                             draft=DraftSettings(mode="draft"))
    first = timed_engine.generate(seeded).token_ids
    other = Engine()
    other.load(tiny_target, tiny_draft)
    other._timed_cost = CostModel(draft=0.0, jump=5.0, slope=1.0)  # a very different machine
    assert other.generate(seeded).token_ids == first
    # Greedy, priced as if verifies were free: long blocks, still plain decoding's ids.
    other._timed_cost = CostModel(draft=0.0, jump=0.0, slope=0.0)
    greedy = GenerateRequest(messages=seeded.messages, max_tokens=40,
                             draft=DraftSettings(mode="draft"))
    plain = GenerateRequest(messages=seeded.messages, max_tokens=40,
                            draft=DraftSettings(mode="plain"))
    events = []
    assert other.generate(greedy, on_step=events.append).token_ids == \
        other.generate(plain).token_ids
    assert max(e.drafted for e in events) > 2


def _drafting_steps(engine: Engine, auto_off: bool) -> tuple[int, int]:
    events = []
    engine.generate(GenerateRequest(messages=(Message("user", "Tell me a story."),),
                                    max_tokens=64, draft=DraftSettings(mode="draft",
                                                                       auto_off=auto_off)),
                    on_step=events.append)
    return sum(1 for e in events if e.drafted), len(events)


def test_generate_prices_with_the_timed_curve_where_the_clock_may_steer(tiny_target, tiny_draft):
    """A machine where a second verified token costs five forwards: a
    steerable request drafts only on the policy's probes (one step in
    eight); with auto-off off the same request keeps the untimed costs
    and drafts most steps."""
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    engine._timed_cost = CostModel(draft=engine.cost_model.draft, jump=5.0, slope=0.1)
    drafting, steps = _drafting_steps(engine, auto_off=True)
    assert drafting <= steps // DraftPolicy.PROBE_EVERY + 1
    drafting, steps = _drafting_steps(engine, auto_off=False)
    assert drafting > steps // 2


def test_a_target_is_timed_once_and_again_when_it_changes(tiny_target, tiny_draft,
                                                          tiny_qwen_target, monkeypatch):
    monkeypatch.setattr(measure, "MIN_FORWARD_S", 0.0)
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    timed = engine._verify_s
    engine.load(tiny_target, None)  # only the draft changed
    assert engine._verify_s is timed
    assert engine.cost_for(_request()) == engine.cost_model.timed(timed)
    engine.load(tiny_qwen_target, None)
    assert engine._verify_s is not timed and tuple(engine.verify_seconds) == VERIFY_CURVE
