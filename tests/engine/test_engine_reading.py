"""What a draft model reads of a long prompt (issue 48): at most a window
of its end, kept across a conversation's turns, and only once the reply
has run long enough to pay for the reading (suffix drafts run meanwhile).
An agent's request is a long prompt with a short reply: reading it all
into the draft model made speculation slower than plain decoding. None of
it may change greedy output."""

from __future__ import annotations

import pytest
from specchat.engine import draft_model
from specchat.engine.costs import CostModel
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine

LONG = tuple((11 * i + 7) % 300 + 40 for i in range(400))


def _gen(engine: Engine, prompt, mode="draft", k=None, max_tokens=40):
    return engine.generate(GenerateRequest(prompt_ids=tuple(prompt), max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)))


@pytest.fixture
def small_window(monkeypatch):
    monkeypatch.setattr(draft_model, "WINDOW", 128)
    monkeypatch.setattr(draft_model, "WINDOW_KEPT", 64)


def test_the_draft_reads_at_most_a_window_of_the_prompt(small_window, tiny_target, tiny_draft):
    """A 400-id prompt: the draft's cache starts 64 ids before its end, and
    the reply is plain decoding's; the next turn extends the window (read
    once), until it runs past WINDOW and moves."""
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    plain = Engine()
    plain.load(tiny_target)
    first = _gen(engine, LONG, k=3)  # a fixed K reads at once: the window alone bounds it
    drafter = engine.model_drafter
    assert drafter.offset == len(LONG) - 64
    assert drafter.slot.length <= 64 + len(first.token_ids)
    assert first.token_ids == _gen(plain, LONG, "plain").token_ids
    assert first.summary.drafted > 0
    turn = (*LONG, *first.token_ids, 5, 6, 7)
    second = _gen(engine, turn, k=3)
    assert drafter.offset == len(LONG) - 64  # the same window, extended
    assert second.token_ids == _gen(plain, turn, "plain").token_ids
    longer = (*turn, *second.token_ids, *LONG[:80])
    third = _gen(engine, longer, k=3)
    assert drafter.offset == len(longer) - 64  # past WINDOW: moved to the end
    assert third.token_ids == _gen(plain, longer, "plain").token_ids


def test_reading_waits_until_the_reply_pays_for_it():
    """Rent or buy: with replies lately short, a long unread prompt is not
    read at once; once the reply has run as many tokens as reading costs
    over what each token gains, it is; a short one is read at once."""
    policy = DraftPolicy(cost=CostModel(draft=0.3, slope=0.11), expected_reply=12)
    # 1,000 ids cost 0.3 * (1 + 0.11 * 999) = 33.3 forwards; each token gains
    # 1 - 1 / rate at the prior acceptance 0.7 (rate 1.20 at K = 2: 0.17), so
    # reading pays from the 200th token on.
    assert not policy.worth_reading("draft", 1000, 0, 500)
    assert not policy.worth_reading("draft", 1000, 60, 500)
    produced = next(t for t in range(1, 500) if policy.worth_reading("draft", 1000, t, 500))
    assert 190 < produced < 210
    assert not policy.worth_reading("draft", 1000, 300, 20)  # the budget ends first
    assert policy.worth_reading("draft", 30, 0, 500)  # 1.2 forwards: read at once
    assert DraftPolicy(cost=CostModel(draft=0.3, slope=0.11),
                       expected_reply=400).worth_reading("draft", 1000, 0, 500)
    assert DraftPolicy(3, CostModel(draft=0.3, slope=0.11),
                       expected_reply=1).worth_reading("draft", 1000, 0, 500)  # fixed K


def test_a_short_reply_to_a_long_prompt_leaves_the_draft_unread(tiny_target, tiny_draft):
    """Short replies lately (an agent's): a long prompt is not read into the
    draft model for a reply of a few tokens; in hybrid mode the suffix
    drafts meanwhile; the ids are plain decoding's."""
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    plain = Engine()
    plain.load(tiny_target)
    prompts = [(*LONG[i:], *LONG[:i]) for i in (0, 50, 100, 150)]
    for prompt in prompts[:3]:  # replies of 8 tokens: the engine learns they are short
        _gen(engine, prompt, "hybrid", max_tokens=8)
    r = _gen(engine, prompts[3], "hybrid", max_tokens=8)
    assert r.token_ids == _gen(plain, prompts[3], "plain", max_tokens=8).token_ids
    assert engine.model_drafter.slot.length < 64  # the 400 ids were not read
    assert not r.summary.drafted_by.get("draft")  # nothing drafted by the draft model
