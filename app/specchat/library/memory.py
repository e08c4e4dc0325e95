"""Will a pair fit in memory? Estimated before loading, from parameter
counts and config.json, against what the machine has available.

The estimate uses the dtype the engine will compute in (engine/compute.py):
float32 on CPU (MLX's fast CPU path goes through BLAS in float32) and 4-bit
on Apple GPUs, overridable with SPECCHAT_DTYPE. The engine asks MLX for the
device; the library decides with a cheap platform check instead, so nothing
here imports MLX.

    weights = params x bytes per parameter in the compute dtype
    KV      = 2 (keys, values) x layers x KV heads x head dim x context x bytes
    runtime = 5% of the weights + 256 MiB (activations, logits, MLX itself)
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from specchat import values
from specchat.engine.folders import is_cluster_folder
from specchat.library.errors import LibraryError
from specchat.library.facts import read_folder

# 4-bit MLX quantization stores a float16 scale and bias per group of 64
# weights: 4 + 32/64 = 4.5 bits per parameter.
BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "q4": 4.5 / 8, "q8": 8.5 / 8}
RUNTIME_FRACTION = 0.05
RUNTIME_FIXED = 256 * 1024**2


def compute_dtype() -> str:
    """The dtype the engine will use here: SPECCHAT_DTYPE (checked as the
    engine checks it, ``specchat.values``), else q4 on Apple Silicon (Metal)
    and float32 elsewhere (CPU)."""
    try:
        override = values.environment("SPECCHAT_DTYPE")
    except values.BadValue as exc:
        raise LibraryError(str(exc)) from None
    if override:
        return override
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "q4"
    return "float32"


def kv_bytes(kv_elements_per_token: int | None, context_tokens: int, dtype: str) -> int:
    """The KV cache for ``context_tokens``. It holds activations: float32 on
    CPU, float16 with quantized or half-precision weights."""
    return int((kv_elements_per_token or 0) * context_tokens * (4 if dtype == "float32" else 2))


# -- available memory ---------------------------------------------------------


def parse_size(text: str) -> int:
    """'6GB', '6.5 GiB', '512M', '123456' -> bytes (GB = 10^9, GiB = 2^30)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    number, unit, binary = float(m.group(1)), m.group(2), m.group(3)
    power = " KMGT".index(unit or " ")
    return int(number * ((1024 if binary else 1000) ** power))


def _linux_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s+kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def _macos_available() -> int | None:
    """Free + inactive + purgeable + speculative pages (what macOS hands out
    without swapping), capped at the GPU working-set share of RAM that Metal
    allows by default (about 75%)."""
    try:
        total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True,
                                   text=True, timeout=5, check=True).stdout.strip())
        vm = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=5,
                            check=True).stdout
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    page = re.search(r"page size of (\d+) bytes", vm)
    size = int(page.group(1)) if page else 16384
    pages = 0
    for key in ("Pages free", "Pages inactive", "Pages purgeable", "Pages speculative"):
        m = re.search(rf"^{key}:\s+(\d+)", vm, re.M)
        if m:
            pages += int(m.group(1))
    return min(pages * size, int(total * 0.75))


def available_memory() -> int | None:
    """Bytes that can be used without swapping, or None if unknown.

    SPECCHAT_MEMORY_AVAILABLE (e.g. "6GB") overrides the measurement, for
    tests and for people who know better than the OS estimate.
    """
    override = os.environ.get("SPECCHAT_MEMORY_AVAILABLE", "").strip()
    if override:
        try:
            return parse_size(override)
        except ValueError as exc:
            raise LibraryError(f"SPECCHAT_MEMORY_AVAILABLE={override!r}: {exc}") from exc
    if sys.platform.startswith("linux"):
        return _linux_available()
    if sys.platform == "darwin":
        return _macos_available()
    return None


# -- the estimate -------------------------------------------------------------


def gb(n: int | float) -> str:
    """Memory figures always in GB, so numbers in one message compare at a glance."""
    return f"{n / 1e9:.1f} GB"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each part needs, and whether the sum fits what is available."""

    dtype: str
    context_tokens: int
    target_weights: int
    draft_weights: int
    kv_cache: int
    runtime: int
    total: int
    available: int | None

    @property
    def fits(self) -> bool:
        return self.available is None or self.total <= self.available

    def breakdown(self) -> str:
        parts = [f"target weights {gb(self.target_weights)}"]
        if self.draft_weights:
            parts.append(f"draft weights {gb(self.draft_weights)}")
        parts.append(f"KV cache {gb(self.kv_cache)} for {self.context_tokens:,} tokens")
        parts.append(f"runtime {gb(self.runtime)}")
        return " + ".join(parts)

    def summary(self) -> str:
        avail = gb(self.available) if self.available is not None else "unknown"
        return f"needs {gb(self.total)} ({self.dtype}), {avail} available"

    def to_json(self) -> dict:
        out = asdict(self)
        out["fits"] = self.fits
        out["summary"] = self.summary()
        return out


class SizedModel(Protocol):
    """What an estimate needs to know of a model. ModelFacts (files on
    disk), CatalogModel (not downloaded yet) and ModelSide (either) all
    answer it, so one estimate serves every kind of reference."""

    @property
    def params(self) -> int | None: ...

    def kv_elements_per_token(self) -> int | None: ...


def estimate(target: SizedModel, draft: SizedModel | None = None, context_tokens: int = 4096,
             dtype: str | None = None, available: int | None = None,
             measure: bool = True) -> MemoryEstimate:
    """Estimate for a target (and optional draft) given as anything with
    ``params`` and ``kv_elements_per_token()`` (ModelFacts, CatalogModel).

    The draft keeps its own KV cache for the same context.
    """
    dtype = dtype or compute_dtype()
    if dtype not in BYTES_PER_PARAM:
        raise LibraryError(f"Unknown compute dtype {dtype!r}")
    if available is None and measure:
        available = available_memory()
    t_w = int((target.params or 0) * BYTES_PER_PARAM[dtype])
    d_w = int((draft.params or 0) * BYTES_PER_PARAM[dtype]) if draft is not None else 0
    kv = sum(kv_bytes(m.kv_elements_per_token(), context_tokens, dtype)
             for m in (target, draft) if m is not None)
    runtime = int((t_w + d_w) * RUNTIME_FRACTION) + RUNTIME_FIXED
    return MemoryEstimate(dtype=dtype, context_tokens=context_tokens, target_weights=t_w,
                          draft_weights=d_w, kv_cache=kv, runtime=runtime,
                          total=t_w + d_w + kv + runtime, available=available)


def check_pair(target_path: str | os.PathLike, draft_path: str | os.PathLike | None = None,
               context_tokens: int = 4096, *, available: int | None = None,
               dtype: str | None = None) -> MemoryEstimate:
    """Refuse, before loading, a pair that will not fit in memory.

    Raises LibraryError with the numbers ("needs 9.1 GB, 6.0 GB available");
    returns the estimate when it fits (or when available memory is unknown).
    """
    target = read_folder(Path(target_path))
    share = _rank0_share(Path(target_path))
    if share < 1.0:  # a cluster target: this machine holds rank 0's layers only
        target = _Share(target, share)
    draft = read_folder(Path(draft_path)) if draft_path else None
    est = estimate(target, draft, context_tokens, dtype=dtype, available=available)
    if not est.fits:
        names = Path(target_path).name + (f" + {Path(draft_path).name}" if draft_path else "")
        advice = ("close other apps, pick a smaller model" if draft_path is None
                  else "close other apps, pick a smaller pair or load without the draft")
        raise LibraryError(
            f"Not enough memory for {names}: needs {gb(est.total)}, {gb(est.available)} "
            f"available ({est.breakdown()}, in {est.dtype}); {advice}, or use a shorter context.")
    return est


@dataclass(frozen=True)
class _Share:
    """The part of a model that one rank of a cluster holds."""

    model: SizedModel
    share: float

    @property
    def params(self) -> int:
        return int((self.model.params or 0) * self.share)

    def kv_elements_per_token(self) -> int | None:
        kv = self.model.kv_elements_per_token()
        return int(kv * self.share) if kv is not None else None


def _rank0_share(target_path: Path) -> float:
    """The share of a cluster target's layers on rank 0 (1.0 for a local
    folder): the rest is in the other machines' memory."""
    if not is_cluster_folder(target_path):
        return 1.0
    from specchat.engine.distributed import hostfile  # optional: only for a cluster

    try:
        spec = hostfile.read(target_path)
    except Exception:  # noqa: BLE001 - the load itself reports a bad cluster file
        return 1.0
    if spec.layers:
        return spec.layers[0] / max(1, sum(spec.layers))
    return 1.0 / spec.size


def preflight(target_path: Path, draft_path: Path | None, reclaimable: int = 0) -> MemoryEstimate:
    """The engine's check before a load: like check_pair, counting the memory
    of models the engine holds now (and would free or reuse) as available."""
    avail = available_memory()
    if avail is not None:
        avail += reclaimable
    return check_pair(target_path, draft_path, available=avail)
