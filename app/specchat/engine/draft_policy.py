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
drafter kind (drafter_kinds.py); nothing here tests a drafter's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from specchat.engine import drafter_kinds

# Verify-cost slope per extra token, relative to a one-token forward.
VERIFY_SLOPE = {"cpu": 0.11, "gpu": 0.04}


@dataclass(frozen=True)
class CostModel:
    """Forward costs in units of one single-token target forward."""

    draft: float = 0.3  # one draft forward
    slope: float = 0.11  # each extra verified token
    # Per drafted token of kinds built for the pair (the MTP head), by kind name.
    kinds: dict = field(default_factory=dict)

    def verify(self, m: int) -> float:
        return 1.0 + self.slope * (m - 1)

    def token(self, kind: drafter_kinds.DrafterKind) -> float:
        """One drafted token of ``kind``, in one-token target forwards: the
        pair's measured ratio for the draft model and the MTP head, otherwise
        what the kind declares."""
        if kind.name in self.kinds:
            return self.kinds[kind.name]
        return self.draft if kind.uses_draft_model else kind.cost

    @classmethod
    def for_pair(cls, target_bytes: int, draft_bytes: int | None, device: str,
                 kind_bytes: dict | None = None) -> CostModel:
        """From the bytes one forward reads: the target's, the draft model's,
        and those of kinds built for the pair (the MTP head: its layer and
        the target's output layer), by kind name."""
        slope = VERIFY_SLOPE.get(device, 0.11)
        kinds = {k: b / target_bytes for k, b in (kind_bytes or {}).items() if target_bytes > 0}
        if not draft_bytes or target_bytes <= 0:
            return cls(draft=0.0, slope=slope, kinds=kinds)
        return cls(draft=draft_bytes / target_bytes, slope=slope, kinds=kinds)


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

    def __init__(self, fixed_k: int | None = None, cost: CostModel | None = None,
                 timing: StepTiming | None = None):
        self.fixed_k = fixed_k
        self.cost = cost or CostModel()
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

    def _formula_k(self, kind: str, key: str | None) -> int:
        spec = drafter_kinds.get(kind)
        return best_k(self.stats(kind, key).accept, self.cost.token(spec), self.cost, spec.cap)

    def declines(self, kind: str) -> bool:
        """Whether the next ``cap(kind)`` will be 0, without counting it:
        nothing a step that drafts nothing observes changes the answer."""
        if self.fixed_k is not None:
            return self.fixed_k <= 0
        return (self._formula_k(kind, None) == 0
                and (self._idle_steps + 1) % self.PROBE_EVERY != 0)

    def cap(self, kind: str, key: str | None = None) -> int:
        """Upper bound on this step's draft length for a drafter kind (its
        statistics kept under ``key``)."""
        if self.fixed_k is not None:
            return self.fixed_k
        spec = drafter_kinds.get(kind)
        k = self._formula_k(kind, key)
        if k == 0:
            self._idle_steps += 1
            if self._idle_steps % self.PROBE_EVERY == 0:
                return 1  # probe, so a recovering drafter is noticed
            return 0
        # For a calibrated drafter the formula only says whether drafting pays
        # at all; how far to draft is the early stop's call, token by token.
        return spec.cap if spec.calibrated else k

    def keep_going(self, confidences: list[float], survive: float = 1.0) -> bool:
        """After drafting len(confidences) tokens, draft one more? (``survive``:
        the chance that what the block holds before them is accepted: a
        suffix draft's tokens, when this drafter chains after them.)

        The next token is accepted only if every token so far is; its own
        chance is estimated by the last token's calibrated confidence (a
        wrong token now makes everything after it waste). An accepted token
        saves what a token costs in this request so far; drafting it costs
        one draft forward plus the extra verify position.
        """
        if self.fixed_k is not None:
            return True
        for c in confidences:
            survive *= self.calibration(c)
        worth = survive * self.calibration(confidences[-1]) * self.rate
        return worth >= self.cost.draft + self.cost.slope

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


# -- break-even auto-off -------------------------------------------------------------

SPECULATE, PAUSED, PROBE = "speculate", "paused", "probe"


class StepTiming(Protocol):
    """Where the break-even rule gets a step's seconds from."""

    def measure(self, proposal, verify_s: float, other_s: float) -> tuple[float, float, float]:
        """(draft, verify, other) seconds of one step of a drafters.Proposal,
        given the clock's: ``other_s`` is the loop's own work around the
        forwards (proposing, streaming text, the step's event)."""
        ...


class MeasuredTiming:
    """The clock: what the step took (Proposal.draft_s, the timed verify,
    the rest of the step's wall time)."""

    def measure(self, proposal, verify_s: float, other_s: float) -> tuple[float, float, float]:
        return proposal.draft_s, verify_s, other_s


@dataclass(frozen=True)
class ModelledTiming:
    """Seconds from a cost model instead of the clock: ``plain_s`` per
    one-token target forward, ``cost.draft`` of that per draft forward,
    ``cost.verify(m)`` of it per verify over m tokens, ``other_s`` per
    step around them. Deterministic, for tests and offline replays of the
    rule."""

    cost: CostModel
    plain_s: float = 0.01
    other_s: float = 0.0

    def measure(self, proposal, verify_s: float, other_s: float) -> tuple[float, float, float]:
        return (proposal.forwards * self.cost.draft * self.plain_s,
                self.cost.verify(proposal.k + 1) * self.plain_s, self.other_s)


def auto_off_applies(request, speculative: bool) -> bool:
    """Whether break-even auto-off may pause a request (an
    events.GenerateRequest): it must ask for it, speculate, let the policy
    choose K (a fixed K is drafted as asked), and not be a seeded sampled
    request (a seed promises the same tokens every run, and a timed rule
    would take different paths on a busy and an idle machine; greedy output
    is the target's own whatever the path)."""
    s = request.sampling
    return (speculative and request.draft.auto_off and request.draft.k is None
            and (s.greedy or s.seed is None))


def ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class BreakEven:
    """Break-even auto-off: decode plainly while speculating is measured
    slower than plain decoding, probing now and then whether it pays again.

    The draft-length policy prices drafts in modelled units (bytes read),
    which is what keeps it deterministic. What it cannot see is the machine
    of the moment: under CPU load a draft forward becomes dearer relative to
    the target's than its bytes say, and a verify over many tokens dearer
    than the device's slope. This rule watches the clock instead, per
    request:

    - speculative throughput, predicted from what the request measured on
      its speculative steps: E[tokens per step] (the running acceptance)
      over E[draft seconds per step] (draft forwards times the measured
      seconds per draft forward, Proposal.draft_s / forwards) plus
      E[verify seconds per step], each an exponentially weighted average;
    - plain throughput, one over the measured time of a K = 0 step (a
      one-token verify); until the request has one, a speculative step's
      verify time over the modelled verify(K + 1);
    - both plus E[other seconds per step]: the loop's own work around the
      forwards (proposing, streaming the text, the step's event), which a
      step costs whatever its K, so speculation pays it once per block.
      It is small beside a real model's forward, not beside a tiny one's.

    Hysteresis, so it does not flap: nothing is judged before ``WARMUP``
    speculative steps; speculation pauses after ``PAUSE_AFTER`` speculative
    steps in a row whose prediction is below plain; it resumes only when a
    probe brings the prediction above plain by ``RESUME_MARGIN``. While
    paused, after ``PROBE_FIRST`` plain steps one step speculates (a probe,
    weighted more than an ordinary step so the average can move); a probe
    that loses (or that the policy declines) doubles the wait, up to
    ``PROBE_MAX``, and so does a pause soon after a resume, so a pair that
    is only ever slower pays for a probe every 64 steps at most; ``SETTLED``
    speculative steps after a resume reset it. The draft model (or a head)
    catches up on the paused tokens before the probe, outside the probe's
    timing: that is the pause's price, not speculation's.

    A paused step is a K = 0 step: the drafter is not asked, the verifier
    draws the one random key a K = 0 step draws, and the output is exactly
    what it would be (greedy: the target's own tokens; sampled: its
    distribution). What changes with the clock is the path (which steps
    draft), so a seeded sampled request never runs this rule
    (``auto_off_applies``): it stays reproducible, and so does every
    request with auto-off turned off.
    """

    WARMUP = 4
    PAUSE_AFTER = 3
    RESUME_MARGIN = 0.05
    PROBE_FIRST = 8
    PROBE_MAX = 64
    ALPHA = 0.2  # weight of the newest speculative step
    PROBE_ALPHA = 0.5  # ... of a probe
    SETTLED = 32  # speculative steps after a resume before the probe interval resets

    def __init__(self, cost: CostModel | None = None, timing: StepTiming | None = None):
        self.enabled = False
        self.cost = cost or CostModel()
        self.timing = timing or MeasuredTiming()
        self.paused = False
        # Measured, as exponentially weighted averages over speculative steps.
        self.tokens: float | None = None  # tokens per step (accepted drafts + 1)
        self.draft_s: float | None = None  # draft seconds per step
        self.verify_s: float | None = None  # verify seconds per step
        self.draft_forward_s: float | None = None  # seconds per draft forward
        self.other_s: float | None = None  # the loop's own seconds per step, any step
        self.plain_s: float | None = None  # a K = 0 step, measured
        self._plain_guess: float | None = None  # ... estimated from speculative verifies
        self.pauses = self.probes = 0
        self._spec_steps = 0
        self._losing = 0
        self._since_probe = 0
        self._probe_every = self.PROBE_FIRST
        self._since_resume: int | None = None
        self._step = SPECULATE

    def next_step(self) -> str:
        """What the coming step does: SPECULATE, PAUSED (decode plainly) or
        PROBE (speculate once while paused). Asked once per step that a
        drafter would draft in."""
        if not (self.enabled and self.paused):
            self._step = SPECULATE
        elif self._since_probe >= self._probe_every:
            self._since_probe = 0
            self.probes += 1
            self._step = PROBE
        else:
            self._since_probe += 1
            self._step = PAUSED
        return self._step

    def upcoming(self) -> str:
        """What ``next_step`` will say next, without moving on. A paused
        step's own observation changes none of what decides it, so while
        this says PAUSED the loop may queue the next plain forward before
        reading this one back (verifier.py), as plain decoding does."""
        if not (self.enabled and self.paused):
            return SPECULATE
        return PROBE if self._since_probe >= self._probe_every else PAUSED

    @property
    def plain_step_s(self) -> float | None:
        return self.plain_s if self.plain_s is not None else self._plain_guess

    @property
    def ratio(self) -> float | None:
        """Predicted speculative throughput over plain throughput (None
        until both are measured)."""
        plain = self.plain_step_s
        if self.tokens is None or plain is None:
            return None
        other = self.other_s or 0.0
        return self.tokens * (plain + other) / max(self.draft_s + self.verify_s + other, 1e-12)

    def observe(self, proposal, n: int, verify_s: float, other_s: float = 0.0) -> None:
        """One verify step of a drafters.Proposal (``n`` drafts accepted):
        ``verify_s`` its timed verify, ``other_s`` the rest of its wall time
        outside forward passes."""
        step, self._step = self._step, SPECULATE
        if not self.enabled:
            return
        draft_s, verify_s, other_s = self.timing.measure(proposal, verify_s, other_s)
        self.other_s = ewma(self.other_s, max(0.0, other_s), self.ALPHA)
        if proposal.k == 0:
            self.plain_s = ewma(self.plain_s, verify_s, self.ALPHA)
            if step == PROBE:  # the drafter (or the policy's K) declined: no better than paused
                self._probe_every = min(self.PROBE_MAX, 2 * self._probe_every)
            return
        a = self.PROBE_ALPHA if step == PROBE else self.ALPHA
        self.tokens = ewma(self.tokens, n + 1.0, a)
        self.draft_s = ewma(self.draft_s, draft_s, a)
        self.verify_s = ewma(self.verify_s, verify_s, a)
        if proposal.forwards:
            self.draft_forward_s = ewma(self.draft_forward_s, draft_s / proposal.forwards, a)
        self._plain_guess = ewma(self._plain_guess, verify_s / self.cost.verify(proposal.k + 1),
                                  self.ALPHA)
        self._spec_steps += 1
        self._judge(step)

    def _judge(self, step: str) -> None:
        ratio = self.ratio
        if self.paused:
            if step != PROBE:
                return
            if ratio > 1.0 + self.RESUME_MARGIN:
                self.paused, self._losing, self._since_resume = False, 0, 0
            else:
                self._probe_every = min(self.PROBE_MAX, 2 * self._probe_every)
            return
        if self._since_resume is not None:
            self._since_resume += 1
            if self._since_resume >= self.SETTLED:
                self._since_resume, self._probe_every = None, self.PROBE_FIRST
        if self._spec_steps < self.WARMUP:
            return
        self._losing = self._losing + 1 if ratio < 1.0 else 0
        if self._losing >= self.PAUSE_AFTER:
            if self._since_resume is not None:  # speculation lost again soon after a resume
                self._probe_every = min(self.PROBE_MAX, 2 * self._probe_every)
            self.paused, self._losing, self._since_probe = True, 0, 0
            self.pauses += 1

    def report(self) -> dict:
        """What the rule measured, for the Summary (empty when it was off)."""
        if not self.enabled:
            return {}
        return {"pauses": self.pauses, "probes": self.probes, "paused_at_end": self.paused,
                "tokens_per_step": self.tokens, "draft_forward_s": self.draft_forward_s,
                "draft_s_per_step": self.draft_s, "verify_s_per_step": self.verify_s,
                "other_s_per_step": self.other_s,
                "plain_step_s": self.plain_step_s, "ratio": self.ratio}
