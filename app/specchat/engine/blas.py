"""Load a fast system BLAS before MLX on Linux.

MLX's CPU wheel ships a reference BLAS (about 2 GFLOP/s for float32 matmul on
the development machine). A system BLAS loaded RTLD_GLOBAL before the first
``import mlx`` takes over its CBLAS symbols. Two are worth having:

- BLIS (Debian ``libblis4-pthread``), preferred. Decoding multiplies one to
  a dozen rows by each weight matrix, and BLIS runs those skinny products
  without packing the weights first: on the development machine a whole
  Qwen2.5-1.5B forward took 269 ms for one token and 408 ms for five,
  against 549 ms and 827 ms with OpenBLAS (docs/benchmarks.md).
- OpenBLAS (``libopenblas0-pthread``), the fallback: about 100x the reference
  BLAS, but it packs the weights on every small product, so a decoding step
  costs about twice what it does with BLIS.

``SPECCHAT_BLAS`` overrides the choice: ``blis``, ``openblas``, ``bundled``
(no preload), or a path to any CBLAS library (``specchat.values.CHOICES``;
anything else is refused in one line, a path that does not exist falls
back to MLX's own BLAS and the status says so).

Threads. Both libraries split a product of several rows over threads that
meet at spin barriers (OpenBLAS threads one-row products too), and a barrier
waits for the slowest thread: when other programs want the cores, one
descheduled thread stalls the others. On the development machine that made
speculation 10x slower with BLIS on small models and made OpenBLAS 4 to 7x
slower, plain decoding included (docs/benchmarks.md). So the count is not
fixed here: the library starts with every usable core and ``threads.py``
changes it between steps through ``set_threads``, from how busy the cores
are. A count the user sets (``BLIS_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``)
is kept and never changed (``BlasStatus.fixed_threads``).

This module must not import MLX: it only works if it runs first.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from specchat import values

# Where each library is looked for: Debian/Ubuntu paths first, then other
# common layouts (public: tests skip a library this machine lacks).
LIBRARIES = {
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


# The environment variable each library reads its thread count from.
_THREAD_ENV = {"blis": "BLIS_NUM_THREADS", "openblas": "OPENBLAS_NUM_THREADS"}


@dataclass(frozen=True)
class BlasStatus:
    name: str  # "blis", "openblas", "custom", "accelerate", "bundled"
    path: str | None
    note: str
    fixed_threads: int | None = None  # set by the user's environment: left alone


_status: BlasStatus | None = None
_lib: ctypes.CDLL | None = None


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's)."""
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
    if choice in LIBRARIES:
        return list(LIBRARIES[choice])
    if choice:
        return [choice]
    return [*LIBRARIES["blis"], *LIBRARIES["openblas"]]


def _fixed_threads(kind: str) -> int | None:
    value = os.environ.get(_THREAD_ENV.get(kind, ""), "").strip()
    try:
        return max(1, int(value)) if value else None
    except ValueError:
        return None


def preload() -> BlasStatus:
    """Load the best system BLAS once, if on Linux and MLX is not imported
    yet. A bad ``SPECCHAT_BLAS`` is a ``BadValue`` (and stays one: nothing
    is remembered until the value is good)."""
    global _status, _lib
    if _status is not None:
        return _status
    choice = values.environment("SPECCHAT_BLAS") or ""
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
            fixed = _fixed_threads(kind)
            if kind == "blis" and fixed is None:
                # Read by BLIS when it initialises (it runs one thread unless
                # told otherwise); threads.py lowers it at run time under load.
                os.environ["BLIS_NUM_THREADS"] = str(cores())
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                _status = BlasStatus("bundled", None, f"could not load {path}: {exc}")
                continue
            _lib = lib
            _status = BlasStatus(kind, path, f"system {kind} preloaded ({path})", fixed)
            break
    return _status


def status() -> BlasStatus:
    return preload()


_thread_fns: tuple | None = None


def _thread_functions() -> tuple | None:
    """(set, get) of the loaded library's run-time thread count, if it has them."""
    global _thread_fns
    if _thread_fns is not None or _lib is None:
        return _thread_fns
    for setter, getter, ctype in (("bli_thread_set_num_threads", "bli_thread_get_num_threads",
                                   ctypes.c_int64),  # BLIS: dim_t
                                  ("openblas_set_num_threads", "openblas_get_num_threads",
                                   ctypes.c_int)):
        try:
            set_fn, get_fn = getattr(_lib, setter), getattr(_lib, getter)
        except AttributeError:
            continue
        set_fn.argtypes, set_fn.restype = [ctype], None
        get_fn.argtypes, get_fn.restype = [], ctype
        _thread_fns = (set_fn, get_fn)
        break
    return _thread_fns


def set_threads(n: int) -> bool:
    """Give the BLAS ``n`` threads for its next products; False if it cannot
    be told (MLX's own BLAS, Accelerate, an unknown library). Both BLIS and
    OpenBLAS read the count at every call, so it takes effect at the next
    product. With BLIS results do not depend on it (it splits rows and
    columns, never the summed dimension); with OpenBLAS the last bits of a
    product can differ between counts."""
    fns = _thread_functions()
    if fns is None:
        return False
    fns[0](max(1, int(n)))
    return True


def get_threads() -> int | None:
    fns = _thread_functions()
    return int(fns[1]()) if fns is not None else None
