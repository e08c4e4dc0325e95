"""Load a fast system BLAS before MLX on Linux.

MLX's CPU wheel ships a reference BLAS (about 2 GFLOP/s for float32 matmul on
the development machine). A system BLAS loaded RTLD_GLOBAL before the first
``import mlx`` takes over its CBLAS symbols. Two are worth having:

- BLIS (Debian ``libblis4-pthread``), preferred. Decoding multiplies one to
  a dozen rows by each weight matrix, and BLIS runs those skinny products
  without packing the weights first: on the development machine a whole
  Qwen2.5-1.5B forward took 269 ms for one token and 408 ms for five,
  against 549 ms and 827 ms with OpenBLAS (docs/benchmarks.md). Its threads
  are set by BLIS_NUM_THREADS, which is 1 unless set, so we set it to the
  cores this process may use.
- OpenBLAS (``libopenblas0-pthread``), the fallback: about 100x the reference
  BLAS, but it packs the weights on every small product, so a decoding step
  costs about twice what it does with BLIS.

``SPECCHAT_BLAS`` overrides the choice: ``blis``, ``openblas``, ``bundled``
(no preload), or a path to any CBLAS library.

This module must not import MLX: it only works if it runs first.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

# Debian/Ubuntu paths first, then other common layouts.
_LIBRARIES = {
    "blis": (
        "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4",
        "/usr/lib/aarch64-linux-gnu/blis-pthread/libblis.so.4",
        "/usr/lib64/libblis-mt.so.4",
        "/usr/lib/libblis.so.4",
    ),
    "openblas": (
        "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
    ),
}
_INSTALL_HINT = "apt install libblis4-pthread (or libopenblas0-pthread)"


@dataclass(frozen=True)
class BlasStatus:
    name: str  # "blis", "openblas", "custom", "accelerate", "bundled"
    path: str | None
    note: str


_status: BlasStatus | None = None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _kind(path: str) -> str:
    base = os.path.basename(path).lower()
    if "blis" in base:
        return "blis"
    if "openblas" in base:
        return "openblas"
    return "custom"


def _candidates(choice: str) -> list[str]:
    if choice in _LIBRARIES:
        return list(_LIBRARIES[choice])
    if choice:
        return [choice]
    return [*_LIBRARIES["blis"], *_LIBRARIES["openblas"]]


def preload() -> BlasStatus:
    """Load the best system BLAS once, if on Linux and MLX is not imported yet."""
    global _status
    if _status is not None:
        return _status
    choice = os.environ.get("SPECCHAT_BLAS", "").strip()
    if sys.platform == "darwin":
        _status = BlasStatus("accelerate", None, "MLX uses Accelerate/Metal on macOS")
    elif not sys.platform.startswith("linux") or choice == "bundled":
        _status = BlasStatus("bundled", None, "MLX's bundled reference BLAS")
    elif "mlx.core" in sys.modules:
        _status = BlasStatus("bundled", None, "MLX was imported before a system BLAS could be loaded")
    else:
        _status = BlasStatus("bundled", None, f"no system BLAS found ({_INSTALL_HINT}); "
                             "MLX runs on its slow reference BLAS")
        for path in _candidates(choice):
            if not os.path.exists(path):
                continue
            kind = _kind(path)
            if kind == "blis":
                # Read by BLIS when it initialises, at the first BLAS call.
                os.environ.setdefault("BLIS_NUM_THREADS", str(_cores()))
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                _status = BlasStatus("bundled", None, f"could not load {path}: {exc}")
                continue
            _status = BlasStatus(kind, path, f"system {kind} preloaded ({path})")
            break
    return _status


def status() -> BlasStatus:
    return preload()
