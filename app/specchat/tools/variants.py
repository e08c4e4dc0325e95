"""What the bench can run: SpecChat's decoding modes (modes.py), some with a
fixed draft length, and mlx-lm's own generators as the baseline.

One registry, so ``specchat bench --modes`` offers exactly what the bench
runs, and the bench asks a variant what it is instead of parsing its name.
Imports no MLX: the command line reads it before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specchat.engine import modes
from specchat.engine.events import DraftSettings, LoadedPair


@dataclass(frozen=True)
class Variant:
    name: str
    mode: modes.Mode | None  # SpecChat's mode; None: mlx-lm's generators
    k: int | None = None  # fixed draft length (None: adaptive; mlx-lm: 0 is plain)
    history: bool = True  # drafts may come from the history index (False: its cold run)
    # Break-even auto-off (engine/auto_off.py); ``specchat bench --auto-off on|off``.
    auto_off: bool = True

    @property
    def mlx_lm(self) -> bool:
        return self.mode is None

    @property
    def speculative(self) -> bool:
        return bool(self.k) if self.mlx_lm else self.mode.speculative

    @property
    def needs_draft_model(self) -> bool:
        return bool(self.k) if self.mlx_lm else self.mode.needs_draft_model

    def cannot_run(self, pair: LoadedPair) -> str | None:
        """Why this variant cannot run on the loaded pair, or None: what it
        needs is not loaded, or it needs a draft model and the draft is a
        head (mlx-lm's generators and ssd run a draft model's forward)."""
        needs = ({"draft"} if self.k else set()) if self.mlx_lm else self.mode.needs
        if not needs <= pair.loaded():
            return f"needs {' and '.join(sorted(needs - pair.loaded()))}"
        if pair.draft_is_head and self.needs_draft_model and (
                self.mlx_lm or "draft" not in self.mode.drafters):
            return "needs a draft model, and the draft is a head"
        return None

    def draft_cost(self, draft_forward: float) -> float:
        """One drafted token in target forwards, given one draft forward's."""
        return draft_forward if self.needs_draft_model else 0.0

    @property
    def uses_history(self) -> bool:
        """Whether the history index can change this variant's drafts."""
        return not self.mlx_lm and "suffix" in self.mode.drafters

    def cold(self) -> Variant:
        """The same variant with an empty history (the bench's cold run)."""
        return replace(self, name=f"{self.name}-cold", history=False)

    def settings(self) -> DraftSettings:
        """SpecChat's settings for this variant."""
        return DraftSettings(mode=self.mode.name, k=self.k, auto_off=self.auto_off)


PLAIN = Variant("plain", modes.PLAIN)
MLX_LM_PLAIN = Variant("mlx-lm-plain", None, 0)

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    PLAIN,
    Variant("spec", modes.HYBRID),
    Variant("suffix", modes.SUFFIX),
    Variant("spec-k2", modes.DRAFT, 2),
    Variant("spec-k4", modes.DRAFT, 4),
    Variant("ssd", modes.SSD),  # the draft drafts ahead while the target verifies (engine/ssd/)
    # A draft head (``specchat bench --head``, or a head as the --draft).
    Variant("head", modes.HEAD),
    Variant("head+suffix", modes.HEAD_HYBRID),
    MLX_LM_PLAIN,
    *(Variant(f"mlx-lm-spec-k{k}", None, k) for k in (2, 3, 4, 6)),
)}
