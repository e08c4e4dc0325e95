"""Load the system OpenBLAS before MLX on Linux.

MLX's CPU wheel ships a reference BLAS (about 2 GFLOP/s for float32 matmul on
the development machine); the system OpenBLAS, loaded RTLD_GLOBAL before the
first ``import mlx``, takes over its symbols and ran the same matmul at about
230 GFLOP/s. That also makes verifying K draft tokens cost ~2x one token
instead of ~Kx, which is what makes speculative decoding pay off on CPU.

This module must not import MLX: it only works if it runs first.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

# Debian/Ubuntu paths first (libopenblas0-pthread), then other common layouts.
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


@dataclass(frozen=True)
class BlasStatus:
    name: str  # "openblas", "accelerate", "bundled"
    path: str | None
    note: str


_status: BlasStatus | None = None


def preload() -> BlasStatus:
    """Load OpenBLAS once, if we are on Linux and MLX is not imported yet.

    SPECCHAT_BLAS=bundled turns the preload off (to measure the difference);
    SPECCHAT_BLAS=/path/to/libopenblas.so picks a library explicitly.
    """
    global _status
    if _status is not None:
        return _status
    choice = os.environ.get("SPECCHAT_BLAS", "")
    if sys.platform == "darwin":
        _status = BlasStatus("accelerate", None, "MLX uses Accelerate/Metal on macOS")
    elif not sys.platform.startswith("linux") or choice == "bundled":
        _status = BlasStatus("bundled", None, "MLX's bundled reference BLAS")
    elif "mlx.core" in sys.modules:
        _status = BlasStatus("bundled", None, "MLX was imported before OpenBLAS could be loaded")
    else:
        paths = [choice] if choice else list(_CANDIDATES)
        _status = BlasStatus(
            "bundled", None, "system OpenBLAS not found (apt install libopenblas0-pthread)"
        )
        for path in paths:
            if not os.path.exists(path):
                continue
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                _status = BlasStatus("bundled", None, f"could not load {path}: {exc}")
                continue
            _status = BlasStatus("openblas", path, "system OpenBLAS preloaded")
            break
    return _status


def status() -> BlasStatus:
    return preload()
