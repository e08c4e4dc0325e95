"""What drafting costs and what it yields: Leviathan et al.'s formula, once.

Costs are in units of one single-token target forward. A step that drafts
K tokens at per-token acceptance a yields E(K) = (1 - a^(K+1)) / (1 - a)
tokens and costs K * c + v(K + 1), where c is one drafted token and
v(m) = 1 + s * (m - 1) is one target forward over m tokens; its rate, E
over the cost, is ``CostModel.rate``. Everything that weighs a draft length
or predicts a speedup (the draft-length policy, the hybrid's choice, the
library's draft ranking, the timing tools) calls it, so they cannot
disagree in the formula. No MLX: the library imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specchat.engine.drafter_kinds import DrafterKind

# Verify-cost slope per extra token, relative to a one-token forward.
VERIFY_SLOPE = {"cpu": 0.11, "gpu": 0.04}


def expected_tokens(a: float, k: int) -> float:
    """Leviathan et al.: expected tokens per step with K drafts at acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def rate(a: float, k: int, c: float, verify: Callable[[int], float]) -> float:
    """Tokens per unit of cost of a step drafting ``k`` tokens of cost ``c``
    each at acceptance ``a``, verified at ``verify(m)`` for m tokens (a
    cost model's line, or a measured curve)."""
    return expected_tokens(a, k) / (k * c + verify(k + 1))


@dataclass(frozen=True)
class CostModel:
    """Forward costs in units of one single-token target forward."""

    draft: float = 0.3  # one draft-model forward
    slope: float = 0.11  # each extra verified token
    # Per drafted token of kinds built for the pair (the MTP head, an
    # EAGLE-3 head), by kind name.
    kinds: dict = field(default_factory=dict)

    def verify(self, m: int) -> float:
        return 1.0 + self.slope * (m - 1)

    def token(self, kind: DrafterKind) -> float:
        """One drafted token of ``kind``, in one-token target forwards: the
        pair's measured ratio for the draft model and the heads, otherwise
        what the kind declares."""
        if kind.name in self.kinds:
            return self.kinds[kind.name]
        return self.draft if kind.uses_draft_model else kind.cost

    def rate(self, a: float, k: int, c: float) -> float:
        """``rate`` on this model's verify line."""
        return rate(a, k, c, self.verify)

    def best_k(self, a: float, c: float, cap: int) -> int:
        """The K in [0, cap] that maximises tokens per unit of cost (0:
        plain decoding, rate 1 / v(1), is best)."""
        best, best_rate = 0, 1.0 / self.verify(1)
        for k in range(1, cap + 1):
            r = self.rate(a, k, c)
            if r > best_rate * 1.0001:
                best, best_rate = k, r
        return best

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
