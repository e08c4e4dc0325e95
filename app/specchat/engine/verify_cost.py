"""What one verify pass costs on this machine now, fitted from a request's
own steps.

The draft-length policy prices a verify over m tokens as
v(m) = 1 + s * (m - 1) one-token forwards, with the device's slope s
(draft_policy.VERIFY_SLOPE: 0.11 on a CPU with BLIS). That slope is an idle
machine's. Under CPU load the extra tokens of a verify get much dearer (a
3-token verify measured 1.87x a 1-token one beside two spinning processes,
against 1.29x idle: s = 0.36 to 0.43; docs/benchmarks.md), and a policy
pricing them at 0.11 drafts blocks that cannot pay. Only the verify's own
seconds show that, so they are fitted here: ordinary least squares of
seconds on m, over the request's recent steps with geometrically decaying
weights, so the fit follows a load that comes or goes mid-reply.

Verify timings are clean measurements (one target forward each; the draft
model's timings are not: they include catching up after suffix runs and
pauses), which is why the load is read from them and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyCost:
    """A fitted verify cost: ``one_token_s`` seconds for a one-token
    forward, each extra token ``slope`` of that."""

    one_token_s: float
    slope: float


class VerifyFit:
    """Seconds of a verify over m tokens, t(m) = t1 * (1 + s * (m - 1)),
    fitted over recent steps.

    No estimate until the steps weigh ``MIN_WEIGHT`` (about five) and their
    lengths vary by ``MIN_SPREAD`` (a variance in tokens squared: steps of
    one and two tokens alternating give 0.25), since a slope cannot be read
    off verifies of one length. Once there is one it is kept while the
    lengths stop varying (a policy that priced blocks down to one token
    would otherwise lose the very estimate that made it do so, and flap).
    """

    DECAY = 0.9  # weight of a step, per step after it
    MIN_WEIGHT = 4.0
    MIN_SPREAD = 0.2

    def __init__(self) -> None:
        self._w = self._m = self._t = self._mm = self._mt = 0.0
        self.estimate: VerifyCost | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        """One verify pass over ``tokens`` tokens that took ``seconds``."""
        d = self.DECAY
        m, t = float(tokens), float(seconds)
        self._w = d * self._w + 1.0
        self._m = d * self._m + m
        self._t = d * self._t + t
        self._mm = d * self._mm + m * m
        self._mt = d * self._mt + m * t
        fitted = self._fit()
        if fitted is not None:
            self.estimate = fitted

    def _fit(self) -> VerifyCost | None:
        if self._w < self.MIN_WEIGHT:
            return None
        mean_m, mean_t = self._m / self._w, self._t / self._w
        spread = self._mm / self._w - mean_m * mean_m
        if spread < self.MIN_SPREAD:
            return None
        per_token = (self._mt / self._w - mean_m * mean_t) / spread
        one = mean_t + per_token * (1.0 - mean_m)
        if one <= 0.0:
            return None  # noise so large the line crosses zero: no reading
        return VerifyCost(one_token_s=one, slope=max(0.0, per_token / one))
