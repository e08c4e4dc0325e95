"""How many tokens to draft, step by step.

Fixed K drafts exactly K tokens every step (capped by the token budget).

Adaptive K (the default) has two parts, both driven by measurements made
during generation rather than constants:

1. A cap per step from Leviathan et al.'s formula. With per-token
   acceptance a (measured, an exponential moving average per draft source),
   drafting K tokens yields E(K) = (1 - a^(K+1)) / (1 - a) tokens per step
   and costs K * t_draft + t_verify(K+1) seconds, where t_draft (one draft
   forward) and t_verify(m) = t1 + b * (m - 1) (target forward over m
   tokens) are fitted online from the step timings. The cap is the K that
   maximises E(K) / cost(K). On CPU, verifying 9 tokens costs ~1.9x one
   token, so good drafts earn long blocks; on a GPU the verify curve is
   flatter still. If no K beats plain decoding, the cap is 0 (with an
   occasional 1-token probe so a drafter can earn its way back).

2. An early stop inside the block, from the draft's own confidence (as
   llama.cpp's --draft-p-min, but calibrated and cost-aware). Each draft
   token's confidence c is mapped to a measured acceptance probability
   A(c) (binned, with a prior A(c) = c). After drafting token i, the
   chance that the whole block so far survives is P = prod A(c_j). One
   more draft token is worth t1 * P * a expected seconds of target time
   and costs t_draft + b; drafting stops when the gain falls below the
   cost. Confident, easy stretches get long blocks; uncertain ones stop
   after a token or two instead of paying for drafts that will be thrown
   away.

Prompt lookup costs nothing to draft, so only part 1 applies to it (with
t_draft = 0); its blocks are as long as the verify cost curve justifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

K_CAP = 12
LOOKUP_CAP = 16


@dataclass
class SourceStats:
    """Acceptance of one draft source ("draft" or "lookup")."""

    accept: float = 0.7  # prior per-token acceptance
    weight: float = 0.0  # observations seen (saturating)
    proposed: int = 0
    accepted: int = 0

    def observe(self, k: int, n: int, decay: float = 0.9) -> None:
        if k <= 0:
            return
        self.proposed += k
        self.accepted += n
        # n successes, then one failure unless all k passed.
        trials = n + (1 if n < k else 0)
        rate = n / trials
        w = min(1.0, trials / 4)
        self.accept = decay ** w * self.accept + (1 - decay ** w) * rate
        self.weight += trials


@dataclass
class CostModel:
    """t_verify(m) = t1 + b * (m - 1), and t_draft per draft forward, fitted
    with exponential forgetting. Priors describe a CPU run until measured."""

    t1: float = 0.0
    b: float = 0.0
    t_draft: float = 0.0
    _s: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wm, wmm, wt, wmt
    _draft_w: float = 0.0

    def observe_verify(self, m: int, seconds: float, decay: float = 0.95) -> None:
        s = self._s
        x = m - 1
        for i in range(5):
            s[i] *= decay
        s[0] += 1
        s[1] += x
        s[2] += x * x
        s[3] += seconds
        s[4] += x * seconds
        w, sx, sxx, st, sxt = s
        det = w * sxx - sx * sx
        if det > 1e-9 * max(1.0, w * sxx):
            b = (w * sxt - sx * st) / det
            t1 = (st - b * sx) / w
            if t1 > 0 and b >= 0:
                self.t1, self.b = t1, b
                return
        # Not enough spread in m yet: average time, prior slope 12% of t1.
        mean_x = sx / w
        self.t1 = (st / w) / (1 + 0.12 * mean_x)
        self.b = 0.12 * self.t1

    def observe_draft(self, forwards: int, seconds: float, decay: float = 0.9) -> None:
        if forwards <= 0:
            return
        per = seconds / forwards
        if self._draft_w == 0:
            self.t_draft = per
        else:
            self.t_draft = decay * self.t_draft + (1 - decay) * per
        self._draft_w += 1

    @property
    def known(self) -> bool:
        return self.t1 > 0

    def verify(self, m: int) -> float:
        return self.t1 + self.b * (m - 1)


def expected_tokens(a: float, k: int) -> float:
    """Leviathan et al.: expected tokens per step with K drafts at acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def best_k(a: float, t_draft: float, cost: CostModel, cap: int) -> int:
    """The K in [0, cap] that maximises expected tokens per second."""
    best, best_rate = 0, 1.0 / cost.verify(1)
    for k in range(1, cap + 1):
        rate = expected_tokens(a, k) / (k * t_draft + cost.verify(k + 1))
        if rate > best_rate * 1.0001:
            best, best_rate = k, rate
    return best


class Calibration:
    """Draft confidence -> measured acceptance probability, in 10 bins with
    a prior of A(c) = c worth 4 observations per bin."""

    BINS = 10
    PRIOR = 4.0

    def __init__(self) -> None:
        self.hits = [0.0] * self.BINS
        self.seen = [0.0] * self.BINS

    def _bin(self, c: float) -> int:
        return min(self.BINS - 1, max(0, int(c * self.BINS)))

    def __call__(self, c: float) -> float:
        i = self._bin(c)
        centre = (i + 0.5) / self.BINS
        return (self.hits[i] + self.PRIOR * centre) / (self.seen[i] + self.PRIOR)

    def observe(self, confidences: list[float], n: int) -> None:
        for j, c in enumerate(confidences):
            if j > n:
                break  # not judged: the block was cut before it
            i = self._bin(c)
            self.seen[i] += 1
            self.hits[i] += 1.0 if j < n else 0.0


class DraftPolicy:
    """State that carries across steps (and requests) of one loaded pair."""

    def __init__(self, fixed_k: int | None = None):
        self.fixed_k = fixed_k
        self.cost = CostModel()
        self.sources: dict[str, SourceStats] = {}
        self.calibration = Calibration()
        self._idle_steps = 0

    def stats(self, source: str) -> SourceStats:
        if source not in self.sources:
            self.sources[source] = SourceStats(accept=0.6 if source == "lookup" else 0.7)
        return self.sources[source]

    def cap(self, source: str) -> int:
        """Upper bound on this step's draft length for a source."""
        if self.fixed_k is not None:
            return self.fixed_k
        if not self.cost.known:
            return 4  # first step: a reasonable block to start measuring
        st = self.stats(source)
        t_draft = 0.0 if source == "lookup" else self.cost.t_draft
        limit = LOOKUP_CAP if source == "lookup" else K_CAP
        k = best_k(st.accept, t_draft, self.cost, limit)
        if k == 0:
            self._idle_steps += 1
            if self._idle_steps % 8 == 0:
                return 1  # probe, so a recovering drafter is noticed
        return k

    def keep_going(self, confidences: list[float]) -> bool:
        """After drafting len(confidences) tokens, draft one more?"""
        if self.fixed_k is not None or not self.cost.known or self.cost.t_draft <= 0:
            return True
        survive = 1.0
        for c in confidences:
            survive *= self.calibration(c)
        gain = self.cost.t1 * survive * self.stats("draft").accept
        return gain >= self.cost.t_draft + self.cost.b

    def observe(self, source: str | None, k: int, n: int, confidences: list[float],
                verify_s: float, draft_s: float, draft_forwards: int) -> None:
        self.cost.observe_verify(k + 1, verify_s)
        if source is None or k == 0:
            return
        self.stats(source).observe(k, n)
        if source == "draft":
            self.cost.observe_draft(draft_forwards, draft_s)
            self.calibration.observe(confidences, n)
