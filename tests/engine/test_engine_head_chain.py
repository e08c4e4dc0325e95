"""A head chained after a suffix draft (head_drafter.propose_after,
hybrid.py): it reads the suffix's unverified tokens from its own output,
exactly as it reads its own drafts (a random head, whose output matters),
and with heads right part of the time (tinymodels) its chained drafts are
accepted in part, the caches back to the committed rows after each
rejection (head_checks.py), and the reply stays plain decoding's."""

from __future__ import annotations

import pytest
from head_checks import accepted_in_part, generate_checked
from sampling_checks import ALPHA, chi_square_p, exact_joint, sample_counts
from specchat.engine import drafter_kinds
from specchat.engine.costs import CostModel
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafters import Proposal
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.session import Engine
from specchat.engine.suffix import SuffixDrafter, stats_key
from tinymodels import build_eagle3, build_partial_eagle3, build_partial_mtp_target

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3


@pytest.fixture(scope="module")
def engine(tiny_dir, tiny_target):
    e = Engine()
    e.load(tiny_target, build_eagle3(tiny_dir / "eagle3-chain", tiny_target))
    return e


@pytest.fixture(scope="module")
def partial_engine(tiny_dir, tiny_target):
    e = Engine()
    e.load(tiny_target, build_partial_eagle3(tiny_dir / "eagle3-chain-partial", tiny_target))
    return e


def _request(mode, k=None, max_tokens=40) -> GenerateRequest:
    return GenerateRequest(prompt_ids=PROMPT, max_tokens=max_tokens,
                           draft=DraftSettings(mode=mode, k=k, auto_off=False))


def _gen(engine, mode, k=None, max_tokens=40):
    return engine.generate(_request(mode, k, max_tokens))


def test_drafting_on_past_given_tokens_is_drafting_on_past_its_own(engine):
    """Given its own first draft as another drafter's token, the head drafts
    what it drafted after it: the given token is read from the head's own
    output, as each of its drafts is; and the head's cache is back to its
    committed rows once the block is judged."""
    drafter = engine.model_drafter
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


@pytest.fixture(scope="module")
def mtp_engine(tiny_dir, tiny_tokenizer):
    e = Engine()
    assert e.load(build_partial_mtp_target(tiny_dir / "qwen3_5-mtp-chain", tiny_tokenizer)).mtp
    return e


def _always_chain(monkeypatch, kind: str, reply: tuple[int, ...] = ()) -> None:
    """Every step with a suffix match chains the head after it, up to 3
    drafts (a tiny head's cost would price it out, and its own cap leave it
    no room after a long match). With ``reply`` (greedy's), the suffix
    drafter proposes its next two tokens at every step, as a long copy
    would: a random target repeats nothing."""
    after = drafter_kinds.after_key(kind)
    if reply:
        def copy(self, context, ctl):
            done = len(context) - len(PROMPT)
            tokens = list(reply[done:done + 2])
            return Proposal(tokens=tokens, source="suffix", key=stats_key("conversation", 16),
                            confidences=[0.9] * len(tokens), origins=["conversation"] * len(tokens))

        monkeypatch.setattr(SuffixDrafter, "propose", copy)
    cap = DraftPolicy.cap
    monkeypatch.setattr(HybridDrafter, "choose", lambda self, policy, s: ("chained", 3))
    monkeypatch.setattr(DraftPolicy, "cap", lambda self, k, key=None:
                        (3 if key == after else 24) if k == kind else cap(self, k, key))


@pytest.mark.parametrize("kind, mode", [("eagle3", "hybrid"), ("mtp", "mtp+suffix")])
def test_a_reply_that_always_chains_the_head_after_the_suffix_is_plain_decoding(
        request, monkeypatch, kind, mode):
    """An EAGLE-3 head and the target's own MTP head alike, each right part
    of the time: the reply is plain decoding's, the head's chained drafts
    are counted under their own key and accepted in part, and after every
    step the caches hold the committed rows only, whatever the head read
    past them."""
    engine = request.getfixturevalue("partial_engine" if kind == "eagle3" else "mtp_engine")
    plain = _gen(engine, "plain").token_ids
    _always_chain(monkeypatch, kind, plain)
    r, check = generate_checked(engine, kind, _request(mode))
    assert r.token_ids == plain
    accepted_in_part(r, check, kind)
    chained = r.summary.drafted_by[kind]["by_key"][drafter_kinds.after_key(kind)]
    assert 0 < chained["accepted"] < chained["drafted"]
    assert r.summary.drafter_stats["hybrid"]["chained"] > 0
    assert r.summary.drafted_by["suffix"]["accepted"] > 0


@pytest.mark.slow  # a long chi-square run: CI's slow step
def test_sampled_replies_that_chain_the_head_follow_the_target(partial_engine, monkeypatch):
    """At T > 0 a chained block's q is one-hot rows for the suffix's tokens
    and the head's own rows after them: rejection sampling stays exact,
    with a head whose drafts are accepted in part."""
    engine = partial_engine
    sampling = SamplingParams(temperature=1.0, top_k=3)
    joint = exact_joint(engine.target.model, sampling, PROMPT, 4)
    _always_chain(monkeypatch, "eagle3")
    counts, drafted, accepted, _ = sample_counts(engine, PROMPT, "hybrid", None, sampling, 4,
                                                 1500)
    assert drafted > 1500 and 0 < accepted < drafted
    assert chi_square_p(counts, joint) > ALPHA


def test_the_hybrid_prices_a_chained_head_by_its_own_acceptance_after_a_suffix(engine):
    """With a head that costs 3% of a target forward, a reliable 4-token
    suffix draft (below the copy-trust length) chains the head while its
    chained drafts are accepted, and stops chaining once the request has
    measured them failing."""
    hybrid = HybridDrafter(engine.drafter("suffix"), engine.drafter("eagle3"))
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
