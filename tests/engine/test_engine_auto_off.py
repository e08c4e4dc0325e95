"""Break-even auto-off (engine/auto_off.py, BreakEven): speculation pauses
while it is measured slower than plain decoding, probes now and then, and the
output is exactly plain decoding's either way.

The rule reads the clock; these tests give it a ``ModelledTiming`` instead
(seconds from a cost model), so what it decides is the same on every
machine and no assertion depends on how fast this one is. The models,
drafts and verification are real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from specchat.engine import modes
from specchat.engine.auto_off import (
    PAUSED,
    PROBE,
    SPECULATE,
    BreakEven,
    ModelledTiming,
    auto_off_applies,
)
from specchat.engine.costs import CostModel
from specchat.engine.decoding import Decoding, decode
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafters import Proposal
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    Message,
    SamplingParams,
    StepEvent,
)
from specchat.engine.kv import CacheSlot
from specchat.engine.session import Engine
from tinymodels import build_model

ROOT = Path(__file__).resolve().parents[2]
ASK = (Message("user", "Explain speculative decoding."),)  # a reply longer than 96 tokens
# A one-token target forward is 10 ms (ModelledTiming's default), a verify over
# m tokens 1 + 0.11 (m - 1) of it, a draft forward 30% of it: the bundled
# pair's costs on an idle CPU (docs/benchmarks.md).
IDLE = ModelledTiming(CostModel(draft=0.3, slope=0.11))
# The same pair on a busy machine, where a draft forward costs 90% of a target's.
BUSY = ModelledTiming(CostModel(draft=0.9, slope=0.11))


@pytest.fixture(scope="module")
def poor_draft(tiny_dir, tiny_tokenizer) -> Path:
    """A random one-layer draft: the target's tokenizer, none of its knowledge."""
    folder = tiny_dir / "draft-random-auto-off"
    if (folder / "model.safetensors").exists():
        return folder
    return build_model(folder, tiny_tokenizer, seed=77, layers=1)


@pytest.fixture
def poor_engine(tiny_target, poor_draft) -> Engine:
    engine = Engine()
    engine.load(tiny_target, poor_draft)
    return engine


def _request(mode: str, max_tokens: int = 96, auto_off: bool = True,
             sampling: SamplingParams | None = None, k: int | None = None) -> GenerateRequest:
    return GenerateRequest(messages=ASK, max_tokens=max_tokens,
                           sampling=sampling or SamplingParams(),
                           draft=DraftSettings(mode=mode, k=k, auto_off=auto_off))


def _run(engine: Engine, request: GenerateRequest, timing,
         end_ids: set[int] | None = None, slot: CacheSlot | None = None,
         on_step=None) -> tuple[tuple[int, ...], list, object]:
    """``request`` through the engine's loop, with its drafter and a policy
    whose break-even rule reads ``timing`` instead of the clock: (token ids,
    step events, summary). ``end_ids``: the tokens that end the reply
    (default: the model's); ``slot``: the target's cache (default: a new
    one); ``on_step``: also called with each step's event."""
    ids = engine.prompt_ids(request)
    drafter, mode = engine.drafter_for(modes.get(request.draft.mode))
    policy = DraftPolicy(request.draft.k, engine.cost_model, timing=timing)
    runner = engine.target_runner
    events: list[StepEvent] = []
    ends = engine.end_ids if end_ids is None else end_ids

    def step(event: StepEvent) -> None:
        if on_step is not None:
            on_step(event)
        events.append(event)

    result = decode(Decoding(slot or CacheSlot(runner), engine.target.tokenizer, ends, ids,
                             request, drafter, policy, mode.name,
                             engine.vocab), step)
    return result.token_ids, events, result.summary


def _plain(engine: Engine, max_tokens: int = 96) -> tuple[int, ...]:
    return engine.generate(_request("plain", max_tokens)).token_ids


def test_a_poor_draft_pauses_and_greedy_output_is_plain(poor_engine):
    ids, events, summary = _run(poor_engine, _request("draft"), IDLE)
    assert ids == _plain(poor_engine)
    assert summary.paused_steps > 0
    paused = [e for e in events if e.paused]
    assert len(paused) == summary.paused_steps
    assert all(e.drafted == 0 and e.k == 0 and len(e.token_ids) <= 1 for e in paused)
    assert summary.auto_off["pauses"] == 1 and summary.auto_off["paused_at_end"]
    assert summary.auto_off["ratio"] < 1.0
    # Probes try speculation now and then while paused, further apart as they lose.
    probes = [e.index for e in events if e.probe]
    assert len(probes) >= 3 and summary.auto_off["probes"] == len(probes)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[0] > BreakEven.PROBE_FIRST
    assert gaps[-1] <= BreakEven.PROBE_MAX + 1


def _run_watching_the_queue(engine: Engine, request: GenerateRequest):
    """``request`` through the loop as ``_run`` does, noting for each step
    whether, when its event went out, the target's cache already held the
    token just committed: the next forward was queued on it."""
    ids = engine.prompt_ids(request)
    slot = CacheSlot(engine.target_runner)
    ahead: list[bool] = []

    def on_step(event: StepEvent) -> None:
        context = len(ids) + event.total_tokens
        assert slot.length in (context - 1, context)
        ahead.append(slot.length == context)

    tokens, events, summary = _run(engine, request, IDLE, slot=slot, on_step=on_step)
    # What was queued past the reply's end is dropped: the cache holds a prefix of it.
    assert slot.length <= len(ids) + len(tokens)
    assert not ahead[-1]  # the step that spends the budget queues nothing
    return tokens, summary, list(zip(events, events[1:], ahead, strict=False))


def _queued_only_before_plain_steps(pairs) -> bool:
    return all(e.drafted == 0 and after.drafted == 0 and not after.probe
               for e, after, queued in pairs if queued)


def test_a_paused_request_queues_each_plain_forward_early(poor_engine):
    """While auto-off has paused the request and no probe is due next, a
    step runs one ahead as plain decoding does: the next forward is queued
    before this one is read back. The step before a probe is read back
    first, since the drafter needs its token. The ids stay plain decoding's."""
    tokens, summary, pairs = _run_watching_the_queue(poor_engine, _request("draft"))
    assert tokens == _plain(poor_engine)
    assert summary.paused_steps > 0 and summary.auto_off["probes"] >= 2
    assert _queued_only_before_plain_steps(pairs)
    assert all(queued for e, after, queued in pairs if e.paused and after.paused)
    assert any(e.paused and after.probe and not queued for e, after, queued in pairs)


def test_a_draft_the_policy_keeps_at_zero_queues_each_plain_forward_early(poor_engine):
    """Auto-off off, so only the draft policy stands between the poor draft
    and the target: while its cap is 0, a step runs one ahead unless the
    next is the policy's idle probe (a one-token draft)."""
    tokens, summary, pairs = _run_watching_the_queue(poor_engine,
                                                     _request("draft", auto_off=False))
    assert tokens == _plain(poor_engine)
    assert summary.paused_steps == 0 and summary.drafted > 0
    assert _queued_only_before_plain_steps(pairs)
    queued = [e.index for e, _after, q in pairs if q]
    before_drafts = [e.index for e, after, _q in pairs if after.drafted]
    assert len(queued) > len(pairs) // 2 and len(before_drafts) >= 4
    # Every step that drafted nothing and is followed by one that drafts
    # nothing either ran ahead, after the first (the draft reads the prompt).
    assert all(q for e, after, q in pairs[1:] if not e.drafted and not after.drafted)


def test_running_ahead_changes_no_token_of_a_seeded_sampled_reply(poor_engine, monkeypatch):
    """A seed promises the same tokens, so a step queued early must draw its
    key where it would have: the same reply with running ahead turned off."""
    from specchat.engine import decoding

    seeded = _request("draft", 64, sampling=SamplingParams(temperature=0.9, seed=11))
    early, _summary, pairs = _run_watching_the_queue(poor_engine, seeded)
    assert any(q for *_, q in pairs)
    monkeypatch.setattr(decoding, "_next_is_plain", lambda *_a: False)
    late, _summary, pairs = _run_watching_the_queue(poor_engine, seeded)
    assert not any(q for *_, q in pairs)
    assert early == late and len(early) > 16


def test_a_probe_that_pays_resumes(poor_engine):
    """Hybrid with the poor draft: it pauses while only the draft model
    drafts, and resumes when a probe finds suffix matches (free, and
    accepted) in the reply."""
    ids, events, summary = _run(poor_engine, _request("hybrid", 160), IDLE)
    assert ids == _plain(poor_engine, 160)
    assert summary.paused_steps > 0 and summary.auto_off["pauses"] >= 1
    assert not summary.auto_off["paused_at_end"] and summary.auto_off["ratio"] > 1.0
    last_paused = max(e.index for e in events if e.paused)
    after = [e for e in events if e.index > last_paused]
    assert sum(e.accepted for e in after) > 0 and not any(e.paused for e in after)


def test_a_good_draft_does_not_pause(tiny_engine):
    ids, events, summary = _run(tiny_engine, _request("draft"), IDLE)
    assert ids == _plain(tiny_engine)
    assert summary.drafted > 0 and summary.accepted > 0
    assert summary.paused_steps == 0 and not any(e.paused or e.probe for e in events)
    assert summary.auto_off["pauses"] == 0 and summary.auto_off["ratio"] > 1.0


def test_a_good_draft_made_dear_by_a_busy_machine_pauses(tiny_engine):
    """The case auto-off is for: the same draft, its forward three times as
    dear relative to the target's as its bytes say."""
    ids, _events, summary = _run(tiny_engine, _request("draft"), BUSY)
    assert ids == _plain(tiny_engine)
    assert summary.paused_steps > 0


def test_turned_off_it_never_pauses(poor_engine):
    ids, events, summary = _run(poor_engine, _request("draft", auto_off=False), IDLE)
    assert ids == _plain(poor_engine)
    assert summary.paused_steps == 0 and summary.auto_off == {}
    assert not any(e.paused or e.probe for e in events)


def test_seeded_sampling_stays_reproducible_and_unseeded_may_pause(poor_engine):
    """A seed promises the same tokens every run, so the timed rule stands
    aside for it; an unseeded sampled request pauses like a greedy one."""
    seeded = SamplingParams(temperature=0.8, seed=5)
    a, _, sa = _run(poor_engine, _request("draft", 64, sampling=seeded), BUSY)
    b, _, sb = _run(poor_engine, _request("draft", 64, sampling=seeded), IDLE)
    assert a == b and sa.paused_steps == sb.paused_steps == 0 and sa.auto_off == {}
    # Unseeded, so random: no end token may cut the reply before the rule has judged.
    ids, events, s = _run(poor_engine, _request("draft", 96, sampling=SamplingParams(0.8)), IDLE,
                          end_ids=set())
    assert s.paused_steps > 0 and len(ids) == 96
    assert sum(len(e.token_ids) for e in events) == len(ids)


def test_who_may_pause():
    greedy = _request("hybrid")
    assert auto_off_applies(greedy, speculative=True)
    assert not auto_off_applies(greedy, speculative=False)  # plain decoding
    assert not auto_off_applies(_request("hybrid", auto_off=False), True)
    assert not auto_off_applies(_request("draft", k=3), True)  # a fixed K is drafted as asked
    assert not auto_off_applies(_request("hybrid", sampling=SamplingParams(0.7, seed=1)), True)
    assert auto_off_applies(_request("hybrid", sampling=SamplingParams(0.7)), True)
    assert DraftSettings().auto_off and GenerateRequest().draft.auto_off  # on by default


# -- the rule itself, step by step ---------------------------------------------


def _spec(k: int, forwards: int | None = None) -> Proposal:
    return Proposal(tokens=list(range(k)), source="draft",
                    forwards=k if forwards is None else forwards)


PLAIN_STEP = Proposal(tokens=[], source="")


def _armed(timing=IDLE) -> BreakEven:
    rule = BreakEven(timing.cost, timing)
    rule.enabled = True
    return rule


def _step(rule: BreakEven, accepted_of_4: int) -> str:
    """One step as the loop takes it: ask, then observe (4 drafts when it
    speculates, ``accepted_of_4`` of them accepted)."""
    what = rule.next_step()
    rule.observe(PLAIN_STEP if what == PAUSED else _spec(4), accepted_of_4, 0.0)
    return what


def test_it_needs_a_sustained_loss_to_pause():
    # IDLE, K = 4: a step costs 4 * 0.3 + 1.33 = 2.53 plain steps, so it pays
    # from 3 tokens a step (2 accepted) and loses at 1 or 2.
    rule = _armed()
    assert [_step(rule, 3) for _ in range(6)] == [SPECULATE] * 6
    assert rule.ratio > 1.0
    # One bad step, or two, among good ones: no pause.
    for _ in range(3):
        _step(rule, 0)
        _step(rule, 4)
        _step(rule, 4)
    assert not rule.paused and rule.pauses == 0
    # A sustained loss pauses after PAUSE_AFTER losing verdicts.
    steps = 0
    while not rule.paused:
        _step(rule, 0)
        steps += 1
    assert rule.PAUSE_AFTER <= steps <= rule.PAUSE_AFTER + 3
    assert rule.next_step() == PAUSED


def test_nothing_is_judged_before_the_warm_up():
    rule = _armed()
    steps = 0
    while not rule.paused:
        _step(rule, 0)
        steps += 1
    # WARMUP steps before the first verdict, then PAUSE_AFTER losing verdicts.
    assert steps == rule.WARMUP + rule.PAUSE_AFTER - 1


def _pause(rule: BreakEven) -> None:
    while not rule.paused:
        _step(rule, 0)


def _wait_for_probe(rule: BreakEven) -> int:
    """Paused steps until the next probe (which is then the coming step)."""
    n = 0
    while rule.next_step() != PROBE:
        rule.observe(PLAIN_STEP, 0, 0.0)
        n += 1
    return n


def test_probes_back_off_while_speculation_loses():
    rule = _armed()
    _pause(rule)
    plan = [_step(rule, 0) for _ in range(300)]
    probes = [i for i, what in enumerate(plan) if what == PROBE]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert probes[0] == rule.PROBE_FIRST
    assert gaps[:4] == [17, 33, 65, 65]  # 16, 32, 64 paused steps between probes, then 64
    assert plan.count(PAUSED) == 300 - len(probes) and rule.paused


def test_it_resumes_when_a_probe_pays_and_backs_off_if_that_was_a_fluke():
    rule = _armed()
    _pause(rule)
    assert _wait_for_probe(rule) == rule.PROBE_FIRST
    rule.observe(_spec(4), 4, 0.0)  # the probe: all 4 drafts accepted
    assert not rule.paused and rule.next_step() == SPECULATE
    # Losing again soon after: paused again, and the next probe waits twice as long.
    _pause(rule)
    assert _wait_for_probe(rule) == 2 * rule.PROBE_FIRST
    # Speculation that holds up for a while resets the wait.
    rule.observe(_spec(4), 4, 0.0)
    for _ in range(rule.SETTLED):
        _step(rule, 4)
    _pause(rule)
    assert _wait_for_probe(rule) == rule.PROBE_FIRST


def test_a_probe_the_policy_declines_counts_as_lost():
    rule = _armed()
    _pause(rule)
    first = _wait_for_probe(rule)
    rule.observe(PLAIN_STEP, 0, 0.0)  # asked, the drafter proposed nothing
    assert rule.paused and _wait_for_probe(rule) == 2 * first


def test_plain_is_measured_on_plain_steps_and_guessed_before():
    timing = ModelledTiming(CostModel(draft=0.3, slope=0.11), plain_s=0.02)
    rule = _armed(timing)
    rule.observe(_spec(4), 2, 0.0)
    # No K = 0 step yet: plain is the verify over 5 tokens divided by the modelled verify(5).
    assert rule.plain_step_s == pytest.approx(0.02)
    assert rule.draft_forward_s == pytest.approx(0.006)
    assert rule.ratio == pytest.approx(3 * 0.02 / (4 * 0.006 + 1.44 * 0.02))
    rule.observe(PLAIN_STEP, 0, 0.0)
    assert rule.plain_s == pytest.approx(0.02)


def test_the_loops_own_work_per_step_counts_for_both_sides():
    """A step costs its forwards plus the loop's own work (proposing,
    streaming, the event), which speculation pays once per block: beside
    tiny forwards that work decides, beside a real model's it does not."""

    def pauses(timing: ModelledTiming) -> bool:
        rule = _armed(timing)
        for _ in range(20):
            _step(rule, 1)  # 2 tokens per step for 4 drafts
        return rule.paused

    assert pauses(IDLE)  # 2 / (4 * 0.3 + 1.33) = 0.79 of plain
    assert not pauses(ModelledTiming(IDLE.cost, other_s=0.03))  # (2 * 4) / (2.53 + 3) = 1.45


def test_off_it_measures_nothing_and_never_pauses():
    rule = BreakEven(IDLE.cost, IDLE)
    for _ in range(50):
        assert _step(rule, 0) == SPECULATE
    assert rule.tokens is None and rule.report() == {}


def test_the_bench_can_force_it_on_or_off():
    from dataclasses import replace

    from specchat.tools.variants import VARIANTS

    spec = VARIANTS["spec"]
    assert spec.auto_off and spec.settings().auto_off  # on by default, as in the app
    off = replace(spec, auto_off=False)
    assert off.settings().auto_off is False and off.cold().settings().auto_off is False


def test_poor_draft_script_writes_a_draft_the_target_accepts_as_a_pair(tmp_path,
                                                                       tiny_qwen_target):
    """benchmarks/poor_draft.py: a random qwen2 draft with the target's
    tokenizer files, which loads as a pair and decodes exactly plain."""
    import subprocess

    out = tmp_path / "poor"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "poor_draft.py"),
                        "--target", str(tiny_qwen_target), "--out", str(out), "--layers", "1"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "wrote a random 1-layer qwen2 draft" in p.stdout
    engine = Engine()
    pair = engine.load(tiny_qwen_target, out)
    assert pair.speculative_ok and pair.draft.model_type == "qwen2"
    ids, _events, summary = _run(engine, _request("draft", 48), IDLE)
    assert ids == _plain(engine, 48) and summary.drafted > 0
    missing = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "poor_draft.py"),
                              "--target", str(tmp_path / "nowhere"), "--out", str(out)],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ")
