"""A head chained after a suffix draft (head_drafter.propose_after,
hybrid.py): it reads the suffix's unverified tokens from its own output,
exactly as it reads its own drafts, and the reply stays plain decoding's."""

from __future__ import annotations

import pytest
from specchat.engine import drafter_kinds
from specchat.engine.draft_policy import CostModel, DraftPolicy
from specchat.engine.drafters import Proposal
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.session import Engine
from tinymodels import build_eagle3

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3


@pytest.fixture(scope="module")
def engine(tiny_dir, tiny_target):
    e = Engine()
    e.load(tiny_target, build_eagle3(tiny_dir / "eagle3-chain", tiny_target))
    return e


def _gen(engine, mode, k=None, max_tokens=40):
    return engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)))


def test_drafting_on_past_given_tokens_is_drafting_on_past_its_own(engine):
    """Given its own first draft as another drafter's token, the head drafts
    what it drafted after it: the given token is read from the head's own
    output, as each of its drafts is; and the head's cache is back to its
    committed rows once the block is judged."""
    drafter = engine._model_drafter
    propose, checked = drafter.propose, []

    def watch(ctx, ctl):
        own = propose(ctx, ctl)
        if len(own.tokens) >= 3 and not checked:
            rows = drafter.rows
            drafter.kept(len(ctx))
            assert all(c.offset == rows for c in drafter.cache)  # the chained rows went
            after = drafter.propose_after(ctx, own.tokens[:1], ctl)
            checked.append((own, after))
            drafter.kept(len(ctx))
            own = propose(ctx, ctl)
        return own

    drafter.propose = watch
    try:
        engine.reset_cache()
        plain = _gen(engine, "plain").token_ids
        assert _gen(engine, "draft", 3).token_ids == plain
    finally:
        del drafter.propose
    own, after = checked[0]
    assert after.tokens[:2] == own.tokens[1:3]
    assert after.key == drafter_kinds.after_key("eagle3")
    assert after.forwards == len(after.tokens) + 1  # the given token's forward too


def test_a_reply_that_always_chains_the_head_after_the_suffix_is_plain_decoding(
        engine, monkeypatch):
    """Every step with a suffix match chains the head after it, up to 3
    drafts (the tiny head's cost would price it out, and its blocks would
    have no room after a long match): the reply is plain
    decoding's, and the head's chained drafts are counted under their own
    key, accepted or not."""
    plain = _gen(engine, "plain").token_ids
    after = drafter_kinds.after_key("eagle3")
    cap = DraftPolicy.cap
    monkeypatch.setattr(HybridDrafter, "choose", lambda self, policy, s: ("chained", 3))
    monkeypatch.setattr(DraftPolicy, "cap", lambda self, kind, key=None:
                        (3 if key == after else 24) if kind == "eagle3" else cap(self, kind, key))
    r = _gen(engine, "hybrid")
    assert r.token_ids == plain
    chained = r.summary.drafted_by["eagle3"]["by_key"][after]
    assert chained["drafted"] > 0
    assert r.summary.drafted_by["suffix"]["accepted"] > 0


def test_the_hybrid_prices_a_chained_head_by_its_own_acceptance_after_a_suffix():
    """With a head that costs 3% of a target forward, a reliable 4-token
    suffix draft (below the copy-trust length) chains the head while its
    chained drafts are accepted, and stops chaining once the request has
    measured them failing."""
    hybrid = HybridDrafter.__new__(HybridDrafter)
    hybrid.kind = drafter_kinds.get("eagle3")
    policy = DraftPolicy(cost=CostModel(draft=0.3, slope=0.11, kinds={"eagle3": 0.03}))
    s = Proposal(tokens=[1, 2, 3, 4], source="suffix", key="suffix:conversation:3")
    after = drafter_kinds.after_key("eagle3")
    policy.stats("suffix", s.key).accept = 0.97
    policy.stats("eagle3").accept = 0.9
    policy.stats("eagle3", after).accept = 0.9
    assert hybrid.choose(policy, s)[0] == "chained"
    for _ in range(6):  # the chained drafts keep failing at their first token
        policy.stats("eagle3", after).observe(3, 0)
    assert hybrid.choose(policy, s)[0] != "chained"
    assert drafter_kinds.get("eagle3").prior_for(after) < drafter_kinds.get("eagle3").prior
