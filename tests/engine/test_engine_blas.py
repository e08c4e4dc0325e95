"""The BLAS half of the compute policy: which library MLX's CPU backend ends
up with, in a fresh process (the preload, ``specchat.startup.prepare()``, only
works before MLX is imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from specchat.engine import blas

PROBE = textwrap.dedent("""
    import json, os
    import numpy as np
    from specchat import startup
    startup.prepare()
    from specchat.engine import blas
    import mlx.core as mx
    a = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(64, 48)).astype(np.float32)
    got = np.array(mx.array(a) @ mx.array(b))
    st = blas.status()
    print(json.dumps({"name": st.name, "path": st.path, "note": st.note,
                      "threads": os.environ.get("BLIS_NUM_THREADS"),
                      "ok": bool(np.allclose(got, a @ b, rtol=1e-4, atol=1e-4))}))
""")


def _probe(**env) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("SPECCHAT_BLAS", "BLIS_NUM_THREADS")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux preload only")


@linux
def test_blis_is_preferred_and_gets_every_core():
    # ./dev test installs libblis4-pthread, so the fast path is what runs here.
    st = _probe()
    assert st["name"] == "blis", st
    assert st["ok"]
    assert st["threads"] == str(len(os.sched_getaffinity(0)))


@linux
def test_an_explicit_thread_count_is_kept():
    assert _probe(BLIS_NUM_THREADS="1")["threads"] == "1"


@linux
def test_mlx_own_blas_can_be_chosen():
    st = _probe(SPECCHAT_BLAS="bundled")
    assert st["name"] == "bundled" and st["ok"], st


@linux
@pytest.mark.skipif(not any(os.path.exists(p) for p in blas.LIBRARIES["openblas"]),
                    reason="OpenBLAS, the fallback, is not installed here")
def test_openblas_can_be_chosen():
    st = _probe(SPECCHAT_BLAS="openblas")
    assert st["name"] == "openblas" and st["ok"], st


@linux
def test_a_missing_library_falls_back_to_mlx_own_blas():
    st = _probe(SPECCHAT_BLAS="/nonexistent/libcblas.so")
    assert st["name"] == "bundled" and st["ok"]
    assert "no system BLAS found" in st["note"]


@linux
def test_a_library_is_named_in_any_case():
    st = _probe(SPECCHAT_BLAS="BLIS")
    assert st["name"] == "blis" and st["ok"], st


def test_an_unknown_library_name_is_refused_not_ignored():
    """``blsi`` is no library and no path: start-up refuses it in one line
    (a SpecChatError the CLI prints), where it used to run on MLX's slow
    BLAS without a word; asked again, it is refused again."""
    code = textwrap.dedent("""
        from specchat import startup
        from specchat.engine import blas
        from specchat.errors import SpecChatError
        for check in (startup.prepare, blas.status):
            try:
                check()
            except SpecChatError as exc:
                print(type(exc).__name__, exc)
    """)
    env = {**os.environ, "SPECCHAT_BLAS": "blsi"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    line = ("BadValue SPECCHAT_BLAS must be blis, openblas, bundled or the path of a CBLAS "
            "library; got blsi")
    assert out == [line, line]
