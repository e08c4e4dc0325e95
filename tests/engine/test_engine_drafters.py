"""The draft model's pruned output head: frequent ids, special tokens, and
every rarer id the conversation has used, so edits can copy rare tokens."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from specchat import origins
from specchat.engine import draft_model, drafter_kinds, modes
from specchat.engine.costs import CostModel
from specchat.engine.draft_model import PrunedHead
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafter_kinds import DrafterKind
from specchat.engine.drafters import Drafter, Proposal
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.modes import Mode
from specchat.engine.session import Engine
from tinymodels import prune_draft_head


def _weight(v=300, h=16):
    return mx.array(np.random.default_rng(0).normal(size=(v, h)).astype(np.float32))


def test_pruned_head_adds_context_ids_as_they_appear():
    w = _weight()
    head = PrunedHead(w, keep=64, always=[299])
    assert head.rows.tolist() == [*range(64), 299]
    head.cover([5, 100, 200, 100, 63, 299])
    assert head.rows.tolist() == [*range(64), 299, 100, 200]
    h = mx.array(np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32))
    got = np.array(head(h))
    want = np.array(h @ w[head.rows].T)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert head.nbytes == (64 + 3) * 16 * 4
    before = head.rows
    head.cover([100, 7, 400, -1])  # nothing new; out-of-range ids are ignored
    assert head.rows is before


def test_pruned_head_forgets_old_context_rows_past_its_budget(monkeypatch):
    monkeypatch.setattr(draft_model, "CONTEXT_ROWS_MAX", 3)
    head = PrunedHead(_weight(), keep=64)
    head.cover([100, 101])
    head.cover([102, 103])
    assert head.rows.tolist() == [*range(64), 102, 103]
    head.cover([100])
    assert head.rows.tolist() == [*range(64), 102, 103, 100]


def test_the_drafter_covers_the_prompt_before_drafting(tiny_engine):
    engine = tiny_engine
    prune_draft_head(engine, keep=64)
    head = engine.model_drafter.head
    prompt = (5, 300, 301, 7, 300)
    assert 300 not in head.rows.tolist()
    r = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=12,
                                        draft=DraftSettings(mode="draft", k=3)))
    rows = head.rows.tolist()
    assert {300, 301} <= set(rows)
    # Generated ids outside the base rows were added as they were committed
    # (all but the last step's, which no later draft step saw).
    assert {t for t in r.token_ids[:-2] if t >= 64} <= set(rows)
    assert r.summary.drafted > 0


def test_the_draft_head_holds_only_this_requests_context(tiny_engine):
    """Rows added for one request's rare ids are gone at the next: what the
    draft can propose, and so a seeded sampled request's tokens and the
    bench's per-mode drafts, never depend on which request ran before."""
    engine = tiny_engine
    prune_draft_head(engine, keep=64)
    head = engine.model_drafter.head
    from specchat.engine.events import SamplingParams

    def b():
        engine.reset_cache()
        return engine.generate(GenerateRequest(
            prompt_ids=(5, 70, 9, 81, 5, 70), max_tokens=24,
            sampling=SamplingParams(temperature=1.0, seed=3),
            draft=DraftSettings(mode="draft", k=3)))

    first = b()
    engine.reset_cache()
    engine.generate(GenerateRequest(prompt_ids=tuple(range(200, 260)), max_tokens=4,
                                    draft=DraftSettings(mode="draft", k=3)))
    assert {200, 259} <= set(head.rows.tolist())
    again = b()
    rows = set(head.rows.tolist())
    assert not {200, 259} & rows and {70, 81} <= rows
    assert again.token_ids == first.token_ids
    assert (again.summary.drafted, again.summary.accepted) == \
        (first.summary.drafted, first.summary.accepted)

    # The next turn's prompt holds the same rare ids in another order of
    # arrival; it drafts as it would on a fresh head.
    def follow_up():
        engine.reset_cache()
        return engine.generate(GenerateRequest(
            prompt_ids=(5, 70, 9, 81, 5, 70, *again.token_ids, 7), max_tokens=24,
            sampling=SamplingParams(temperature=1.0, seed=4),
            draft=DraftSettings(mode="draft", k=3)))

    after = follow_up()
    prune_draft_head(engine, keep=64)
    fresh = follow_up()
    assert after.token_ids == fresh.token_ids


def test_small_vocabularies_are_not_pruned(tiny_engine):
    engine = tiny_engine
    assert engine.model_drafter.head is None


def test_ids_past_the_draft_vocabulary_are_clamped(tiny_qwen_target, tiny_qwen_draft):
    """The qwen2 target pads its vocabulary to 416 rows, the draft has 400:
    ids 400..415 are valid for the target and must not make the draft read
    past its embedding table (that gave NaN logits, now and then)."""
    engine = Engine()
    engine.load(tiny_qwen_target, tiny_qwen_draft)
    runner = engine.model_drafter.runner
    assert (engine.target_runner.rows, runner.rows) == (416, 400)
    from mlx_lm.models.cache import make_prompt_cache

    def last_logits(ids):
        return np.array(runner(ids, make_prompt_cache(runner.model), "last"))

    np.testing.assert_array_equal(last_logits([5, 410]), last_logits([5, 399]))
    prompt = (5, 410, 415, 7, 410, 415, 7)
    plain = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=24,
                                            draft=DraftSettings(mode="plain")))
    for mode in ("draft", "hybrid"):
        spec = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=24,
                                               draft=DraftSettings(mode=mode)))
        assert spec.token_ids == plain.token_ids


# -- suffix matching through repeats ----------------------------------------------------------

def test_suffix_drafts_long_blocks_on_a_repeating_reply(tiny_target):
    """A reply that repeats itself (this tiny target falls into a loop, as
    greedy decoding of small models does): once the loop is in the context,
    each step drafts well past one period of it, and the reply stays exactly
    plain decoding's."""
    engine = Engine()
    engine.load(tiny_target)
    prompt = (275, 364, 311, 78, 161, 53, 376, 40) * 4
    plain = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=240,
                                            draft=DraftSettings(mode="plain"))).token_ids
    period, start = _loop(plain)
    assert start < 60, "the reference reply should loop early"
    steps = []
    suffix = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=240,
                                             draft=DraftSettings(mode="suffix")),
                             on_step=steps.append)
    assert suffix.token_ids == plain
    # Steps that start after two periods of the loop are in the context.
    done, late = 0, []
    for ev in steps:
        if done >= start + 2 * period:
            late.append(len(ev.token_ids))
        done += len(ev.token_ids)
    assert late and max(late) > period + 1  # more than one period's worth in one step
    assert sum(late) / len(late) > 4


def _loop(ids) -> tuple[int, int]:
    """(period, start) of the cycle the sequence ends in: the smallest period
    that repeats back from the end, and where that repetition begins."""
    ids = list(ids)
    for p in range(1, len(ids) // 3 + 1):
        start = len(ids) - p
        while start > 0 and ids[start - 1] == ids[start - 1 + p]:
            start -= 1
        if len(ids) - start >= 3 * p:
            return p, start
    raise AssertionError(f"the reply does not end in a loop: {ids}")


# -- a drafter of one's own -------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _doc_example() -> tuple[str, list[str]]:
    """docs/architecture.md's drafter example: the module's code, and its
    registration lines (commented there, as they go in other files)."""
    text = DOCS.read_text()
    block = text[text.index("**Drafter**"):].split("```python\n", 1)[1].split("```", 1)[0]
    code = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
    groups: list[list[str]] = []
    for line in block.splitlines():
        if line.startswith("#     "):
            groups[-1].append(line[len("#     "):])
        elif line.startswith("# "):  # says which file the lines after it go in
            groups.append([])
    return code, ["\n".join(g) for g in groups if g]


@pytest.fixture
def registries(monkeypatch):
    """Registrations made in a test end with it."""
    monkeypatch.setattr(drafter_kinds, "KINDS", dict(drafter_kinds.KINDS))
    monkeypatch.setattr(modes, "MODES", dict(modes.MODES))
    monkeypatch.setattr(origins, "ORIGINS", dict(origins.ORIGINS))


class RepeatLast(Drafter):
    name = "repeat"

    def propose(self, context, ctl):
        return Proposal(tokens=[context[-1]] * ctl.cap(self.name), source=self.name)


def test_the_architecture_example_drafter(registries, monkeypatch, tiny_target):
    """The example in docs/architecture.md, run as written: a module and its
    registrations make a drafter whose output is plain decoding's, and whose
    accepted tokens are counted and tinted as its own."""
    code, registrations = _doc_example()
    module = types.ModuleType("specchat.engine.repeat")
    exec(compile(code, "specchat/engine/repeat.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "specchat.engine.repeat", module)
    env = {"register": None, "Origin": origins.Origin, "DrafterKind": DrafterKind,
           "_lazy": drafter_kinds._lazy, "Mode": Mode}
    for line, registry in zip(registrations, (origins, drafter_kinds, modes), strict=True):
        exec(line, {**env, "register": registry.register})
    engine = Engine()
    engine.load(tiny_target)
    prompt = (275, 364, 311, 78, 161, 53, 376, 40) * 4
    plain = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=60,
                                            draft=DraftSettings(mode="plain")))
    for k in (None, 3):
        steps = []
        r = engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=60,
                                            draft=DraftSettings(mode="repeat", k=k)),
                            on_step=steps.append)
        assert r.token_ids == plain.token_ids
        assert r.summary.mode == "repeat"
        assert r.summary.drafted > 0 and set(r.summary.drafted_by) == {"repeat"}
        # Accepted repeats are the drafter's own origin, counted once, in the engine.
        assert set(r.summary.tokens_by_origin) == {"target", "repeat"}
        assert r.summary.tokens_by_origin["repeat"] == r.summary.accepted
        assert {o for ev in steps for o in ev.origins} == {"target", "repeat"}
    assert origins.get("repeat").tint == ("#e8d5f5", "#4b2f63")


def test_a_drafter_kind_needs_a_registered_origin(registries):
    with pytest.raises(ValueError, match="register its origin 'echo'"):
        DrafterKind("echo", RepeatLast, prior=0.5, cap=4)


def test_the_policy_reads_a_drafters_declared_cost(registries):
    """Draft length comes from what a kind declares, not from its name: the
    same prior and cap, at no cost a block is worth drafting; at two target
    forwards per token it never is (only a probe every few steps)."""
    drafter_kinds.register(DrafterKind("free", RepeatLast, prior=0.5, cap=4,
                                       origin=origins.DRAFT_MODEL))
    drafter_kinds.register(DrafterKind("dear", RepeatLast, prior=0.5, cap=4, cost=2.0,
                                       origin=origins.DRAFT_MODEL))
    policy = DraftPolicy(None, CostModel(draft=0.25, slope=0.11))
    assert policy.cap("free") > 0
    assert [policy.cap("dear") for _ in range(DraftPolicy.PROBE_EVERY)] == \
        [0] * (DraftPolicy.PROBE_EVERY - 1) + [1]
    assert policy.stats("dear").accept == 0.5
    # ``declines`` says ahead of each call whether the cap will be 0, and
    # asking it counts nothing (the loop asks once per step, the drafter again).
    said = []
    for _ in range(2 * DraftPolicy.PROBE_EVERY):
        said.append([policy.declines("dear"), policy.declines("dear")])
        said[-1].append(policy.cap("dear") == 0)
    assert [a == b == c for a, b, c in said] == [True] * len(said)
    assert [c for *_, c in said].count(False) == 2  # the two idle probes
    assert not policy.declines("free")
    assert DraftPolicy(0).declines("free") and not DraftPolicy(3).declines("dear")


def test_modes_name_their_drafters():
    assert DraftSettings().mode == modes.HYBRID.name  # events.py names it without importing modes
    assert modes.get("hybrid").without_draft_model() is modes.get("suffix")
    assert modes.get("draft").without_draft_model() is None
    assert modes.get("hybrid").needs_draft_model and not modes.get("suffix").needs_draft_model
    with pytest.raises(EngineError, match="Unknown decoding mode"):
        modes.get("turbo")


def test_an_unknown_mode_is_refused(tiny_target):
    engine = Engine()
    engine.load(tiny_target)
    with pytest.raises(EngineError, match="Unknown decoding mode 'turbo'"):
        engine.generate(GenerateRequest(prompt_ids=(5, 6), draft=DraftSettings(mode="turbo")))
