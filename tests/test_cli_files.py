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
