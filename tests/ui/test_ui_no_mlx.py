"""The GUI thread never imports MLX: only the engine thread does, lazily,
when it loads a model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

UI = Path(__file__).resolve().parents[2] / "app" / "specchat" / "ui"
STORE = UI.parent / "store"


def test_ui_sources_do_not_import_mlx():
    pattern = re.compile(r"^\s*(import mlx|from mlx)", re.M)
    assert (UI / "main_window.py").is_file() and (STORE / "db.py").is_file()
    offenders = [p.name for d in (UI, STORE) for p in d.glob("*.py")
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_importing_and_opening_the_window_loads_no_mlx(tmp_path):
    code = """
import sys, importlib, pkgutil
import specchat.ui, specchat.store
for m in pkgutil.iter_modules(specchat.ui.__path__):
    importlib.import_module("specchat.ui." + m.name)
for m in pkgutil.iter_modules(specchat.store.__path__):
    importlib.import_module("specchat.store." + m.name)
from specchat.ui.app import create_app
from specchat.ui.main_window import MainWindow
app = create_app()
w = MainWindow()
w.show()
app.processEvents()
w.open_model_manager()
app.processEvents()
bad = sorted(n for n in sys.modules if n == "mlx" or n.startswith("mlx.") or n.startswith("mlx_lm"))
print("MLX:", bad)
w.close()
sys.exit(1 if bad else 0)
"""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECCHAT_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
