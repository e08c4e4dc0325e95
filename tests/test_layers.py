"""The import rules between SpecChat's layers (docs/architecture.md).

The engine runs headless on its own thread, so it knows nothing of the
library, the store or Qt; the library and the store know nothing of Qt; the
window and the local API server never import MLX (only the engine thread
does, lazily). Every import
counts, including the ones inside functions, because a lazy import breaks a
rule just as surely when it runs.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "app" / "specchat"

QT = ("PySide6", "qasync", "pyqtgraph", "shiboken6")
MLX = ("mlx", "mlx_lm")
RULES: dict[str, tuple[str, ...]] = {
    "engine": ("specchat.library", "specchat.store", "specchat.ui", "specchat.tools", *QT),
    "library": ("specchat.store", "specchat.ui", "specchat.tools", *QT),
    "store": ("specchat.engine", "specchat.library", "specchat.ui", "specchat.tools", *QT, *MLX),
    "ui": ("specchat.tools", *MLX),
    # The local API reaches the engine only through EngineClient (its jobs run
    # on the engine thread), so it imports no MLX; it knows no window or store.
    "server": ("specchat.store", "specchat.ui", "specchat.tools", *QT, *MLX),
}


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in a source file, relative ones
    resolved against ``package`` (the file's own package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[:len(parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def violations(root: Path, rules: dict[str, tuple[str, ...]], top: str = "specchat") -> list[str]:
    """Every import in ``root/<layer>/`` that its layer's rule forbids."""
    found = []
    for layer, forbidden in rules.items():
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            package = ".".join([top, *rel.parts[:-1]])
            for line, module in imported_modules(path, package):
                bad = next((f for f in forbidden if module == f or module.startswith(f + ".")), None)
                if bad:
                    found.append(f"{path.relative_to(root)}:{line} imports {module} ({layer} must not import {bad})")
    return sorted(set(found))


def test_every_layer_keeps_its_import_rules():
    assert all(len(list((PACKAGE / layer).glob("*.py"))) > 2 for layer in RULES)
    assert violations(PACKAGE, RULES) == []


def test_a_forbidden_import_is_caught(tmp_path):
    """The rule checker itself: a module-level and a lazy forbidden import,
    absolute and relative, are each reported; allowed ones are not."""
    root = tmp_path / "specchat"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "ok.py").write_text("import os\nfrom specchat.engine import kv\n")
    (root / "engine" / "bad.py").write_text(
        "from ..library import refs\n"
        "def later():\n    from PySide6.QtCore import QObject\n")
    (root / "ui").mkdir()
    (root / "ui" / "bad.py").write_text("import mlx.core as mx\n")
    found = violations(root, RULES)
    assert found == [
        "engine/bad.py:1 imports specchat.library (engine must not import specchat.library)",
        "engine/bad.py:1 imports specchat.library.refs (engine must not import specchat.library)",
        "engine/bad.py:3 imports PySide6.QtCore (engine must not import PySide6)",
        "engine/bad.py:3 imports PySide6.QtCore.QObject (engine must not import PySide6)",
        "ui/bad.py:1 imports mlx.core (ui must not import mlx)",
    ]


def _fresh(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLIS_", "OPENBLAS_"))}
    env.update(SPECCHAT_HOME=str(tmp_path), QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("layer", ["engine", "library", "store", "server"])
def test_importing_a_layer_has_no_side_effects(layer, tmp_path):
    """Importing every module of a layer loads no BLAS, sets no BLAS
    environment, and (outside the engine's MLX modules) imports no MLX:
    the BLAS preload is the explicit ``specchat.startup.prepare()``."""
    code = f"""
import importlib, os, pkgutil, sys
import specchat.{layer} as pkg
for m in pkgutil.walk_packages(pkg.__path__, "specchat.{layer}."):
    importlib.import_module(m.name)
from specchat.engine import blas
print(blas._status, sorted(k for k in os.environ if k.startswith(("BLIS_", "OPENBLAS_"))))
"""
    out = _fresh(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "[]"]


def test_importing_the_library_loads_no_mlx(tmp_path):
    out = _fresh("""
import importlib, pkgutil, sys
import specchat.library as pkg
for m in pkgutil.walk_packages(pkg.__path__, "specchat.library."):
    importlib.import_module(m.name)
print(sorted(n for n in sys.modules if n.split(".")[0] in ("mlx", "mlx_lm")))
""", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_one_error_root_for_people():
    from specchat.engine.errors import EngineError
    from specchat.errors import SpecChatError
    from specchat.library.errors import LibraryError

    assert issubclass(EngineError, SpecChatError) and issubclass(LibraryError, SpecChatError)
    assert not issubclass(LibraryError, EngineError)


def test_the_command_line_starts_without_heavy_imports(tmp_path):
    """Every ``specchat`` command builds the whole parser first, so what the
    parser imports is paid by ``specchat --help``: no MLX, no Qt, and not
    the local server's uvicorn, Starlette and numpy (``serve`` imports them
    when it runs)."""
    out = _fresh("""
import sys
from specchat import cli
cli.build_parser().format_help()
heavy = ("mlx", "mlx_lm", "PySide6", "qasync", "uvicorn", "starlette", "numpy", "transformers")
print(sorted(n for n in sys.modules if n.split(".")[0] in heavy))
""", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
