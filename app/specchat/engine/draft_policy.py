"""How many tokens to draft, step by step.

Fixed K drafts exactly K tokens every step (capped by the token budget).

Adaptive K (the default) has two parts:

1. A cap per step from Leviathan et al.'s formula. With per-token
   acceptance a, measured during the request (a moving average per draft
   source, starting from a prior), drafting K tokens yields
   E(K) = (1 - a^(K+1)) / (1 - a) tokens per step and costs
   K * c + v(K + 1) target-forward units, where c is one draft forward and
   v(m) = 1 + s * (m - 1) is one target forward over m tokens. The cap is
   the K that maximises E(K) / cost(K); if no K beats plain decoding, the
   cap is 0, with a 1-token probe every few steps so a drafter can earn its
   way back.

2. An early stop inside the block, from the draft's own confidence (like
   llama.cpp's --draft-p-min, but calibrated and cost-aware). Each draft
   token's confidence (its probability under the draft) is mapped to a
   measured acceptance probability A(conf) (binned, prior A(conf) = conf).
   After i draft tokens the whole block survives with P = prod A(conf_j).
   One more draft token is worth P * a expected target tokens and costs
   c + s; drafting stops when the worth falls below the cost. Easy, confident
   stretches get long blocks; uncertain ones stop after a token or two instead
   of paying for drafts that will be thrown away.

The costs are not timed: single-sequence decoding is bound by memory
bandwidth on Apple GPUs and CPUs alike, so c is the draft's bytes read per
forward over the target's (0.25 for Qwen2.5 0.5B/1.5B in float32 with the
draft's pruned head; timing them on the development machine gave 82 ms /
277 ms = 0.30), and the verify slope s is a property of the device
(CPU with BLIS: 9 tokens cost 1.8x one, 13 tokens 2.4x, so s ~ 0.1; see
docs/benchmarks.md). Timing-free costs and per-request statistics
make the policy deterministic, so a seeded request gives the same tokens
every time even though K adapts.

One rule does read the clock, on top of the two above: break-even auto-off
(``BreakEven``, at the end of this module). Byte ratios are right on an
idle machine; under CPU load a draft forward gets dearer than its bytes
say, and then speculation can be slower than plain decoding however well
K is chosen. Auto-off compares the request's measured speculative
throughput with its measured plain throughput and, while speculating loses
(with hysteresis), decodes plainly, probing now and then. A paused step is
a K = 0 step, so output is exact either way; only the path depends on the
clock, which is why a seeded sampled request never uses it (it stays
reproducible) and the setting can be turned off.

Prompt lookup costs nothing to draft (c = 0), so only part 1 applies to it;
its blocks are as long as the verify cost curve justifies.

What differs between drafters (cost per drafted token, prior acceptance,
longest block, whether confidences are calibrated) is declared by each
drafter kind (drafter_kinds.py); nothing here tests a drafter's name. The
formula's rate is written once, in costs.py (``CostModel.rate``), and
break-even auto-off lives in auto_off.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine import drafter_kinds
from specchat.engine.auto_off import BreakEven, StepTiming
from specchat.engine.costs import CostModel


@dataclass
class SourceStats:
    """Acceptance of one draft source in one request (a drafter kind, or a
    finer key of one, such as lookup's match length)."""

    accept: float = 0.7  # prior per-token acceptance
    proposed: int = 0
    accepted: int = 0

    def observe(self, k: int, n: int, decay: float = 0.8) -> None:
        if k <= 0:
            return
        self.proposed += k
        self.accepted += n
        # n successes, then one failure unless all k passed.
        trials = n + (1 if n < k else 0)
        w = decay ** trials
        self.accept = w * self.accept + (1 - w) * (n / trials)


class Calibration:
    """Draft confidence -> measured acceptance probability, in 10 bins with
    a prior of A(conf) = conf worth 4 observations per bin."""

    BINS = 10
    PRIOR = 4.0

    def __init__(self) -> None:
        self.hits = [0.0] * self.BINS
        self.seen = [0.0] * self.BINS

    def _bin(self, c: float) -> int:
        if not c > 0:  # also NaN, from a draft whose logits overflowed
            return 0
        return min(self.BINS - 1, int(c * self.BINS))

    def __call__(self, c: float) -> float:
        i = self._bin(c)
        centre = (i + 0.5) / self.BINS
        return (self.hits[i] + self.PRIOR * centre) / (self.seen[i] + self.PRIOR)

    def observe(self, confidences: list[float], n: int) -> None:
        for j, c in enumerate(confidences):
            if j > n:
                break  # never judged: the block was cut before it
            i = self._bin(c)
            self.seen[i] += 1
            self.hits[i] += 1.0 if j < n else 0.0


# A reply's expected length in tokens before the engine has seen any.
EXPECTED_REPLY = 128.0
# Unread prompt ids a drafter reads whatever the reply: as cheap as a verify block.
READ_AT_ONCE = 64


class DraftPolicy:
    """Draft-length decisions for one request."""

    PROBE_EVERY = 8
    PRIOR_RATE = 0.7  # cost per token before anything is measured (target-forward units)

    def __init__(self, fixed_k: int | None = None, cost: CostModel | None = None,
                 timing: StepTiming | None = None, expected_reply: float = EXPECTED_REPLY):
        self.fixed_k = fixed_k
        self.cost = cost or CostModel()
        # How long replies have run lately (the engine's average): what
        # reading a long prompt into a draft model is weighed against.
        self.expected_reply = expected_reply
        # Break-even auto-off (off until the loop arms it for a request that
        # may use it: auto_off_applies); ``timing`` replaces the clock in tests.
        self.break_even = BreakEven(self.cost, timing)
        self.sources: dict[str, SourceStats] = {}
        self.calibration = Calibration()
        self._idle_steps = 0
        self._units = 0.0  # cost spent so far, in target-forward units
        self._tokens = 0  # tokens produced so far

    def stats(self, kind: str, key: str | None = None) -> SourceStats:
        """Acceptance statistics under ``key`` (default: the kind's name),
        starting from the kind's prior."""
        key = key or kind
        if key not in self.sources:
            self.sources[key] = SourceStats(accept=drafter_kinds.get(kind).prior_for(key))
        return self.sources[key]

    @property
    def rate(self) -> float:
        """Cost per token in this request so far (prior worth 4 tokens): what
        one more accepted draft token saves."""
        return (self._units + 4 * self.PRIOR_RATE) / (self._tokens + 4)

    def formula_k(self, kind: str, key: str | None = None) -> int:
        """The K that part 1's formula gives a kind now (0: drafting does not
        pay), from what the request has measured under ``key``: the cap of a
        drafter whose confidences are not calibrated; for one whose are, only
        whether it drafts (its early stop sets the length). Public and
        read-only: how fast a wrong prior is unlearnt is stated in these Ks
        (docs/engine.md), and tests read them here."""
        spec = drafter_kinds.get(kind)
        return self.cost.best_k(self.stats(kind, key).accept, self.cost.token(spec), spec.cap)

    def declines(self, kind: str) -> bool:
        """Whether the next ``cap(kind)`` will be 0, without counting it:
        nothing a step that drafts nothing observes changes the answer."""
        if self.fixed_k is not None:
            return self.fixed_k <= 0
        return (self.formula_k(kind) == 0
                and (self._idle_steps + 1) % self.PROBE_EVERY != 0)

    def cap(self, kind: str, key: str | None = None) -> int:
        """Upper bound on this step's draft length for a drafter kind (its
        statistics kept under ``key``)."""
        if self.fixed_k is not None:
            return self.fixed_k
        spec = drafter_kinds.get(kind)
        k = self.formula_k(kind, key)
        if k == 0:
            self._idle_steps += 1
            if self._idle_steps % self.PROBE_EVERY == 0:
                return 1  # probe, so a recovering drafter is noticed
            return 0
        # For a calibrated drafter the formula only says whether drafting pays
        # at all; how far to draft is the early stop's call, token by token.
        return spec.cap if spec.calibrated else k

    def keep_going(self, kind: str, confidences: list[float], survive: float = 1.0) -> bool:
        """After a drafter of ``kind`` drafted len(confidences) tokens, draft
        one more? (``survive``: the chance that what the block holds before
        them is accepted: a suffix draft's tokens, when this drafter chains
        after them.)

        The next token is accepted only if every token so far is; its own
        chance is estimated by the last token's calibrated confidence (a
        wrong token now makes everything after it waste). An accepted token
        saves what a token costs in this request so far; drafting it costs
        one token of this drafter's own kind (a head's is a fraction of a
        draft model's) plus the extra verify position.
        """
        if self.fixed_k is not None:
            return True
        for c in confidences:
            survive *= self.calibration(c)
        worth = survive * self.calibration(confidences[-1]) * self.rate
        return worth >= self.cost.token(drafter_kinds.get(kind)) + self.cost.slope

    def worth_reading(self, kind: str, unread: int, produced: int, remaining: int) -> bool:
        """Whether a drafter of ``kind`` should read the ``unread`` ids of
        the prompt it has not read, ``produced`` tokens into a reply that may
        run ``remaining`` more: reading costs what a forward over them costs
        the drafter; each token after it is that much cheaper than without
        the drafter (1 - 1 / its rate at the best K, in target forwards).
        The reply's remaining length is unknown: a reply runs about as long
        as replies lately did (``expected_reply``), and one that has already
        run ``produced`` tokens about as many again (the rent-or-buy rule:
        once the tokens decoded without it would have paid for the reading,
        read). A request's own fixed K reads at once, as asked; so does a
        short prompt (READ_AT_ONCE ids cost about a verify block), which
        also lets a drafter the prior undervalues be probed and learnt."""
        if unread <= READ_AT_ONCE or self.fixed_k is not None:
            return True
        spec = drafter_kinds.get(kind)
        c = self.cost.token(spec)
        a = self.stats(kind).accept
        k = self.cost.best_k(a, c, spec.cap)
        if k == 0:
            return False
        gain = 1.0 - 1.0 / self.cost.rate(a, k, c)
        ahead = min(max(produced, self.expected_reply - produced), remaining)
        return ahead * gain >= c * self.cost.verify(unread)

    def observe_proposal(self, proposal, n: int) -> None:
        """One verify step of a drafters.Proposal with ``n`` tokens accepted.
        Each part (drafter kind) is observed on its own; a part after the
        first rejection was never judged, so only its cost counts."""
        self._units += self.cost.verify(proposal.k + 1)
        self._tokens += n + 1
        for part in proposal.parts:
            self._units += part.k * self.cost.token(drafter_kinds.get(part.source))
        for part, got in proposal.judged(n):
            if part.k:
                self.stats(part.source, part.key).observe(part.k, got)
                if drafter_kinds.get(part.source).calibrated:
                    self.calibration.observe(list(part.confidences), got)
