"""The verify cost a request fits from its own steps (engine/verify_cost.py),
and the draft policy pricing verifies by it on a busy machine
(draft_policy.DraftPolicy.cost, BreakEven.load_slope).

Seconds come from ModelledTiming (a cost model instead of the clock), so
every assertion holds on any machine; the end-to-end tests run the real
tiny models through the real loop."""

from __future__ import annotations

import pytest
from specchat.engine.draft_policy import CostModel, DraftPolicy, ModelledTiming, best_k
from specchat.engine.drafters import Proposal
from specchat.engine.events import SamplingParams
from specchat.engine.verify_cost import VerifyFit
from test_engine_auto_off import _plain, _request, _run

# The bundled pair's modelled costs (bytes: c = 0.25; the CPU's slope 0.11),
# and what two spinning processes beside the bench made of the verify slope
# (docs/benchmarks.md: 0.36 per extra token).
MODELLED = CostModel(draft=0.25, slope=0.11)
IDLE = ModelledTiming(CostModel(draft=0.25, slope=0.11), plain_s=0.28)
LOADED = ModelledTiming(CostModel(draft=0.36, slope=0.36), plain_s=0.62)


def _fed(pairs) -> VerifyFit:
    fit = VerifyFit()
    for m, seconds in pairs:
        fit.observe(m, seconds)
    return fit


def test_the_fit_reads_the_one_token_forward_and_the_slope_off_varied_verifies():
    t1, s = 0.5, 0.3
    fit = _fed((m, t1 * (1 + s * (m - 1))) for m in [2, 5, 3, 9, 4, 2, 7, 3])
    assert fit.estimate.one_token_s == pytest.approx(t1)
    assert fit.estimate.slope == pytest.approx(s)


def test_no_slope_before_enough_steps_of_different_lengths():
    assert _fed([(2, 0.6), (5, 0.9), (3, 0.7)]).estimate is None  # too few
    assert _fed([(5, 0.9)] * 20).estimate is None  # one length says nothing of the slope
    # Once read, an estimate stays while the lengths stop varying (a policy
    # that priced blocks down to one draft token must not lose the reason).
    fit = _fed([(2, 0.6), (6, 1.0), (3, 0.7), (5, 0.9), (4, 0.8), (2, 0.6)])
    assert fit.estimate.slope == pytest.approx(0.2)
    for _ in range(60):
        fit.observe(2, 0.6)
    assert fit._fit() is None
    assert fit.estimate.slope == pytest.approx(0.2)


def test_the_fit_follows_a_load_that_comes_mid_reply():
    lengths = [2, 4, 3, 6, 2, 5]
    fit = _fed((m, 0.28 * (1 + 0.11 * (m - 1))) for m in lengths * 3)
    assert fit.estimate.slope == pytest.approx(0.11)
    for m in lengths * 3:  # 18 steps on a machine that got busy
        fit.observe(m, 0.62 * (1 + 0.36 * (m - 1)))
    assert fit.estimate.slope > 0.3 and fit.estimate.one_token_s > 0.55


def _policy(timing: ModelledTiming, enabled: bool = True, steps: int = 12) -> DraftPolicy:
    """A policy with the modelled costs whose break-even rule has seen
    ``steps`` speculative steps of varied length timed by ``timing``."""
    policy = DraftPolicy(cost=MODELLED, timing=timing)
    policy.break_even.enabled = enabled
    for i in range(steps):
        k = 1 + i % 4
        proposal = Proposal(tokens=list(range(k)), source="draft", forwards=k)
        policy.observe_proposal(proposal, k)
        policy.break_even.observe(proposal, k, 0.0)
    return policy


def test_a_busy_machine_prices_verifies_at_its_own_slope_and_drafts_shorter():
    busy, idle = _policy(LOADED), _policy(IDLE)
    assert busy.cost.slope == pytest.approx(0.36) and busy.cost.draft == MODELLED.draft
    assert busy.break_even.report()["loaded_steps"] > 0
    # The draft model's K at the same acceptance: shorter under load.
    a = 0.87
    assert best_k(a, 0.25, busy.cost, 12) < best_k(a, 0.25, idle.cost, 12)
    # ...and the early stop asks more of the next token.
    confident = [0.95] * 3
    assert idle.keep_going(confident) and not busy.keep_going(confident)


def test_an_idle_machine_keeps_the_modelled_costs():
    """Below LOAD_MARGIN the policy's costs are the modelled ones, so on an
    idle machine it decides exactly as it does without the clock."""
    idle = _policy(IDLE)
    assert idle.break_even.fit.estimate.slope == pytest.approx(0.11)
    assert idle.cost is idle.modelled
    near = ModelledTiming(CostModel(draft=0.25, slope=0.15), plain_s=0.28)
    assert _policy(near).cost is _policy(near).modelled  # 0.15 < 1.5 * 0.11
    assert _policy(IDLE).break_even.report()["loaded_steps"] == 0


def test_without_auto_off_the_clock_prices_nothing():
    """A request the timed rules may not touch (a seeded sampled one, or
    auto-off turned off: the loop leaves the rule disarmed) keeps the
    modelled costs however busy the machine."""
    policy = _policy(LOADED, enabled=False)
    assert policy.cost is policy.modelled and policy.break_even.fit.estimate is None


def test_before_a_plain_step_plain_is_read_off_the_fit():
    """Under load a speculative verify over the modelled verify(K + 1)
    says plain decoding is slower than it is; the fit does not."""
    rule = _policy(LOADED).break_even
    assert rule.plain_s is None
    assert rule.plain_step_s == pytest.approx(0.62)
    assert rule._plain_guess > 0.8  # what it would have used


def test_on_the_tiny_pair_a_busy_machine_shortens_blocks_and_ids_stay_plain(tiny_engine):
    """The real loop and models: verifies timed as on a busy machine make
    the policy draft shorter blocks than the same request timed as idle;
    timed as idle it drafts exactly as with auto-off off. Greedy ids are
    plain decoding's in every case."""
    # The tiny draft is priced cheap (c = 0.1, not its bytes' 0.4), so that
    # its blocks grow past one token on an idle machine.
    cheap = CostModel(draft=0.1, slope=0.11)
    plain = _plain(tiny_engine, 64)
    busy_ids, busy, busy_summary = _run(tiny_engine, _request("draft", 64), LOADED, cost=cheap)
    idle_ids, idle, idle_summary = _run(tiny_engine, _request("draft", 64), IDLE, cost=cheap)
    off_ids, off, _ = _run(tiny_engine, _request("draft", 64, auto_off=False), IDLE, cost=cheap)
    assert busy_ids == idle_ids == off_ids == plain

    def mean_block(events) -> float:
        blocks = [e.drafted for e in events if e.drafted and not e.probe]
        return sum(blocks) / len(blocks)

    assert busy_summary.auto_off["loaded_steps"] > 0
    assert busy_summary.auto_off["verify_slope"] == pytest.approx(0.36)
    assert mean_block(busy) < mean_block(idle)
    assert idle_summary.auto_off["loaded_steps"] == 0 and idle_summary.paused_steps == 0
    assert [e.drafted for e in idle] == [e.drafted for e in off]


def test_a_seeded_sampled_reply_is_the_same_on_a_busy_and_an_idle_machine(tiny_engine):
    seeded = _request("draft", 48, sampling=SamplingParams(temperature=0.8, seed=3))
    cheap = CostModel(draft=0.1, slope=0.11)
    busy_ids, busy, _ = _run(tiny_engine, seeded, LOADED, cost=cheap)
    idle_ids, idle, _ = _run(tiny_engine, seeded, IDLE, cost=cheap)
    assert busy_ids == idle_ids and [e.drafted for e in busy] == [e.drafted for e in idle]
