"""How the library's long work (downloads, imports, conversions) reports
how far it is. Its own small module, below ``hub`` and ``sources``, so both
(and the sources that convert rather than download) share one type without
importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specchat.library.units import size_text

# (message, fraction or None): how imports, conversions and resolving report.
Progress = Callable[[str, float | None], None]


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report: bytes done of the total (None if unknown), the
    recent rate in bytes per second, and what is happening in words."""

    done_bytes: int
    total_bytes: int | None
    rate_bps: float
    message: str
    file: str | None = None
    step_fraction: float | None = None  # for work that is not counted in bytes

    @property
    def fraction(self) -> float | None:
        if not self.total_bytes:
            return self.step_fraction
        return min(1.0, self.done_bytes / self.total_bytes)

    def describe(self) -> str:
        """The message with bytes and rate, e.g. "model.safetensors - 1.2 GB of 3.1 GB, 24.0 MB/s"."""
        text = self.message
        if self.total_bytes and self.file:
            text += f" - {size_text(self.done_bytes)} of {size_text(self.total_bytes)}"
            if self.rate_bps > 0:
                text += f", {size_text(self.rate_bps)}/s"
        return text
