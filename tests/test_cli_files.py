"""Where the ``specchat`` command writes: only under its home (SPECCHAT_HOME,
or the user data folder), temporary files included, so removing that one
folder removes everything SpecChat ever wrote (library/paths.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="MLX compiles CPU kernels only where a C++ compiler is on PATH")
def test_generate_keeps_mlx_s_compiled_kernels_and_every_temporary_file_at_home(
        tmp_path, tiny_target, tiny_draft):
    """Issue 33: the installed app wrote MLX's compiled CPU kernels (and the
    compiler's own temporary files) to the system's temporary folder,
    $TMPDIR/mlx/<version>/cpu/, outside its home. Its temporary folder is
    now <home>/tmp, where the kernels are kept between runs."""
    home, system_tmp, user = tmp_path / "home", tmp_path / "tmp", tmp_path / "user"
    system_tmp.mkdir()
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "SPECCHAT_"))}
    env.update(HOME=str(user), TMPDIR=str(system_tmp), SPECCHAT_HOME=str(home))
    out = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target",
                          str(tiny_target), "--draft", str(tiny_draft), "--prompt",
                          "def fibonacci(n):", "--max-tokens", "16", "--json"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in system_tmp.rglob("*")) == []
    assert sorted(p.name for p in user.rglob("*")) == []
    kernels = list((home / "tmp" / "mlx").rglob("*.so"))
    assert kernels, sorted(str(p) for p in home.rglob("*"))


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_log_file_that_is_no_file_hangs_nothing_and_prints_no_traceback(tmp_path, kind):
    """``<home>/specchat.log`` as a FIFO hung every command that logged
    (here ``models list`` with one damaged index entry) forever; as a
    folder, Python's "--- Logging error ---" and a traceback came with each
    line. The log file is opened only if it is a regular file; one that is
    not is said once, and what was logged still reaches stderr."""
    import json

    home = tmp_path / "home"
    home.mkdir()
    (home / "index.json").write_text(json.dumps({"version": 1, "models": {
        "broken": {"name": "broken", "params": "lots"}}}))
    if kind == "fifo":
        os.mkfifo(home / "specchat.log")
    else:
        (home / "specchat.log").mkdir()
    env = {**os.environ, "SPECCHAT_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "specchat", "models", "list"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "Logging error" not in out.stderr, out.stderr
    assert "the entry 'broken' was skipped" in out.stderr
    assert out.stderr.count(f"the log file {home / 'specchat.log'} cannot be written") == 1
