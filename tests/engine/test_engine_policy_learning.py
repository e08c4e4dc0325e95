"""The policy learns each bucket (a suffix match length, the draft model, a
head) from the running request: a wrong prior costs a few blocks, not a
reply. The costs are the bundled pair's on the CPU (draft model c = 0.3, a
head c = 0.02 as measured, verify slope 0.11). The blocks are counted as
the loop runs them, through the policy's public calls (``cap`` before a
block, ``observe_proposal`` after it), and the numbers are docs/engine.md's."""

from __future__ import annotations

import pytest
from specchat.engine import drafter_kinds
from specchat.engine.costs import CostModel
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafters import DraftControl, Proposal
from specchat.engine.events import SamplingParams
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.sampling import KeyStream
from specchat.engine.suffix import stats_key


def _policy() -> DraftPolicy:
    return DraftPolicy(cost=CostModel(draft=0.3, slope=0.11, kinds={"eagle3": 0.02}))


class Fixed:
    """A drafter that proposes the same thing every time."""

    def __init__(self, name: str, proposal: Proposal | None = None):
        self.name, self.proposal = name, proposal

    def propose(self, context, ctl):
        return self.proposal


def _blocks_until(stop, observe, limit: int = 50) -> int:
    n = 0
    while not stop() and n < limit:
        observe()
        n += 1
    return n


@pytest.mark.parametrize("kind, blocks", [("draft", 3), ("eagle3", 8)])
def test_a_drafter_that_is_never_right_stops_drafting_within_a_few_blocks(kind, blocks):
    """From its prior of 0.7, a drafter whose first draft is rejected every
    time is asked for nothing (K = 0, probed every PROBE_EVERY steps) after
    three blocks, a head after eight: it costs a fifteenth of a draft model's
    forward, so by the cost model it pays down to about 0.12."""
    policy = _policy()
    caps: list[int] = []

    def block() -> None:  # a block of the cap's length, rejected at its first token
        policy.observe_proposal(Proposal(tokens=[0] * caps[-1], source=kind), 0)

    n = _blocks_until(lambda: caps.append(policy.cap(kind)) or caps[-1] == 0, block)
    assert n == blocks  # as docs/engine.md says
    assert caps[:-1] == [drafter_kinds.get(kind).cap] * blocks  # calibrated: the early stop's
    assert policy.declines(kind)  # and asked for nothing until the next probe


def test_a_drafter_whose_prior_is_too_low_drafts_long_after_two_blocks():
    policy = _policy()
    assert policy.formula_k("draft") <= 1
    for _ in range(2):
        policy.observe_proposal(Proposal(tokens=[0] * 4, source="draft"), 4)
    assert policy.formula_k("draft") >= 6


def test_a_copy_that_keeps_diverging_is_left_to_the_model_after_three_blocks():
    """A conversation match of 16+ tokens starts trusted (prior 0.97, drafted
    outright). If its blocks fail at their first token, the model drafts
    instead from the fourth."""
    policy = _policy()
    policy.stats("draft").accept = 0.99
    s = Proposal(tokens=list(range(16)), source="suffix", key=stats_key("conversation", 16),
                 origins=["conversation"] * 16)
    hybrid = HybridDrafter(Fixed("suffix", s), Fixed("draft"))
    assert hybrid.choose(policy, s)[0] == "suffix"
    n = _blocks_until(lambda: hybrid.choose(policy, s)[0] != "suffix",
                      lambda: policy.observe_proposal(s, 0))
    assert n == 3


def test_a_bucket_the_model_overrules_is_tried_again_within_a_few_steps():
    """A history match whose prior is too low (0.25) loses to the model, but
    drafts every EXPLORE-th time, so a request whose history matches are in
    fact right measures it within that many steps."""
    policy = _policy()
    policy.stats("draft").accept = 0.87
    s = Proposal(tokens=list(range(8)), source="suffix", key=stats_key("history", 8),
                 origins=["history"] * 8)
    model = Proposal(tokens=[9], source="draft")
    hybrid = HybridDrafter(Fixed("suffix", s), Fixed("draft", model))
    ctl = DraftControl(sampling=SamplingParams(), keys=KeyStream(0), vocab=16,
                       cap=policy.cap, policy=policy)
    picked = [hybrid.propose([1, 2, 3], ctl) is s for _ in range(HybridDrafter.EXPLORE)]
    assert picked == [False] * (HybridDrafter.EXPLORE - 1) + [True]


def test_the_early_stop_prices_each_drafter_by_its_own_kind():
    """One more drafted token is worth (chance the block survives) x (its
    own chance) x (what a token costs so far); it costs a token of the
    drafter's own kind plus a verify position. Priced at the draft model's
    cost whatever the drafter, a head beside a draft model (c = 0.02) stopped
    as if it cost 0.3, and an MTP head with no draft model cost nothing."""
    policy = _policy()
    confs = [0.5]  # worth 0.55 * 0.55 * 0.7 = 0.21 before anything is measured
    assert policy.keep_going("eagle3", confs)  # 0.21 >= 0.02 + 0.11: it pays
    assert not policy.keep_going("draft", confs)  # 0.21 < 0.3 + 0.11
    assert policy.keep_going("suffix", confs)  # 0.21 >= 0 + 0.11: a free draft
    alone = DraftPolicy(cost=CostModel(draft=0.0, slope=0.11, kinds={"mtp": 0.35}))
    assert not alone.keep_going("mtp", confs)  # 0.21 < 0.35 + 0.11, not 0 + 0.11
    chained = _policy()
    assert chained.keep_going("eagle3", confs, survive=0.9)
    assert not chained.keep_going("eagle3", confs, survive=0.5)  # 0.106 < 0.13

