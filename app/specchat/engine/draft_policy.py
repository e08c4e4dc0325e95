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

Prompt lookup costs nothing to draft (c = 0), so only part 1 applies to it;
its blocks are as long as the verify cost curve justifies.

What differs between drafters (cost per drafted token, prior acceptance,
longest block, whether confidences are calibrated) is declared by each
drafter kind (drafter_kinds.py); nothing here tests a drafter's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine import drafter_kinds

# Verify-cost slope per extra token, relative to a one-token forward.
VERIFY_SLOPE = {"cpu": 0.11, "gpu": 0.04}


@dataclass(frozen=True)
class CostModel:
    """Forward costs in units of one single-token target forward."""

    draft: float = 0.3  # one draft forward
    slope: float = 0.11  # each extra verified token

    def verify(self, m: int) -> float:
        return 1.0 + self.slope * (m - 1)

    @classmethod
    def for_pair(cls, target_bytes: int, draft_bytes: int | None, device: str) -> CostModel:
        slope = VERIFY_SLOPE.get(device, 0.11)
        if not draft_bytes or target_bytes <= 0:
            return cls(draft=0.0, slope=slope)
        return cls(draft=draft_bytes / target_bytes, slope=slope)


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


def expected_tokens(a: float, k: int) -> float:
    """Leviathan et al.: expected tokens per step with K drafts at acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def best_k(a: float, draft_cost: float, cost: CostModel, cap: int) -> int:
    """The K in [0, cap] that maximises expected tokens per unit of cost."""
    best, best_rate = 0, 1.0 / cost.verify(1)
    for k in range(1, cap + 1):
        rate = expected_tokens(a, k) / (k * draft_cost + cost.verify(k + 1))
        if rate > best_rate * 1.0001:
            best, best_rate = k, rate
    return best


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


class DraftPolicy:
    """Draft-length decisions for one request."""

    PROBE_EVERY = 8
    PRIOR_RATE = 0.7  # cost per token before anything is measured (target-forward units)

    def __init__(self, fixed_k: int | None = None, cost: CostModel | None = None):
        self.fixed_k = fixed_k
        self.cost = cost or CostModel()
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
            self.sources[key] = SourceStats(accept=drafter_kinds.get(kind).prior)
        return self.sources[key]

    @property
    def rate(self) -> float:
        """Cost per token in this request so far (prior worth 4 tokens): what
        one more accepted draft token saves."""
        return (self._units + 4 * self.PRIOR_RATE) / (self._tokens + 4)

    def cap(self, kind: str, key: str | None = None) -> int:
        """Upper bound on this step's draft length for a drafter kind (its
        statistics kept under ``key``)."""
        if self.fixed_k is not None:
            return self.fixed_k
        spec = drafter_kinds.get(kind)
        k = best_k(self.stats(kind, key).accept, spec.token_cost(self.cost), self.cost, spec.cap)
        if k == 0:
            self._idle_steps += 1
            if self._idle_steps % self.PROBE_EVERY == 0:
                return 1  # probe, so a recovering drafter is noticed
            return 0
        # For a calibrated drafter the formula only says whether drafting pays
        # at all; how far to draft is the early stop's call, token by token.
        return spec.cap if spec.calibrated else k

    def keep_going(self, confidences: list[float]) -> bool:
        """After drafting len(confidences) tokens, draft one more?

        The next token is accepted only if every token so far is; its own
        chance is estimated by the last token's calibrated confidence (a
        wrong token now makes everything after it waste). An accepted token
        saves what a token costs in this request so far; drafting it costs
        one draft forward plus the extra verify position.
        """
        if self.fixed_k is not None:
            return True
        survive = 1.0
        for c in confidences:
            survive *= self.calibration(c)
        worth = survive * self.calibration(confidences[-1]) * self.rate
        return worth >= self.cost.draft + self.cost.slope

    def observe(self, kind: str | None, key: str | None, k: int, n: int,
                confidences: list[float]) -> None:
        """One verify step: ``k`` tokens drafted by ``kind`` (None: nothing
        drafted), ``n`` accepted."""
        spec = drafter_kinds.get(kind) if kind else None
        drafting = k * spec.token_cost(self.cost) if spec is not None else 0.0
        self._units += drafting + self.cost.verify(k + 1)
        self._tokens += n + 1
        if spec is None or k == 0:
            return
        self.stats(kind, key).observe(k, n)
        if spec.calibrated:
            self.calibration.observe(confidences, n)
