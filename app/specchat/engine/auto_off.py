"""Break-even auto-off: decode plainly while speculating is measured slower.

The draft-length policy (draft_policy.py) prices drafts in modelled units
(bytes read), which keeps it deterministic; this rule reads the clock, per
request, and pauses speculation while it loses (``BreakEven``'s docstring
says how). A paused step is a K = 0 step, so output is exact either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specchat.engine.costs import CostModel

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
