"""The import rules between SpecChat's layers (docs/architecture.md).

The engine runs headless on its own thread, so it knows nothing of the
library, the store or Qt; the library and the store know nothing of Qt; the
window and the local API server never import MLX (only the engine thread
does, lazily). Each layer has an allow-list of what it may import from
SpecChat, and no package has an import cycle. Every import counts,
including the ones inside functions, because a lazy import breaks a rule
(or closes a cycle) just as surely when it runs.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "app" / "specchat"

QT = ("PySide6", "qasync", "pyqtgraph", "shiboken6")
MLX = ("mlx", "mlx_lm")

# What each part of SpecChat may import from SpecChat besides itself: the
# table in docs/architecture.md ("Layers"), as allow-lists. An entry allows
# that module, or every module of that package; anything else of SpecChat's
# is refused, so a new dependency between layers is a change to this table
# and to the doc's, never a quiet import. Every module belongs to exactly
# one rule (a new top-level module needs its line here).
BASE = ("specchat.errors", "specchat.values", "specchat.records", "specchat.origins",
        "specchat.outputs")
ENGINE_VALUE_TYPES = ("specchat.engine.events", "specchat.engine.modes", "specchat.engine.errors")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "errors": (),
    "origins": (),
    "values": ("specchat.errors",),
    "records": ("specchat.errors", "specchat.values"),
    "outputs": ("specchat.errors", "specchat.records", "specchat.home"),
    "home": (),
    "applog": ("specchat.home", "specchat.records"),
    "startup": ("specchat.values", "specchat.home", "specchat.engine.blas"),
    "engine": (*BASE, "specchat.home"),
    # The engine modules that load no MLX when imported.
    "library": (*BASE, "specchat.home", "specchat.engine.compat", "specchat.engine.folders",
                "specchat.engine.safetensors_file", "specchat.engine.eagle3_format",
                "specchat.engine.rope_rules",
                "specchat.engine.mtp_format", "specchat.engine.modes",
                "specchat.engine.errors", "specchat.engine.client", "specchat.engine.template",
                "specchat.engine.events", "specchat.engine.costs",
                "specchat.engine.drafter_kinds", "specchat.engine.measure",
                "specchat.engine.distributed.hostfile", "specchat.engine.distributed.secret",
                "specchat.engine.distributed.control"),
    "store": (*BASE, "specchat.home"),
    # The local API reaches the engine only through EngineClient (its jobs run
    # on the engine thread), and checks requests by the engine's own rules
    # for tools and template switches (chat_rules: no MLX); it knows no
    # window and no store.
    "server": (*BASE, *ENGINE_VALUE_TYPES, "specchat.engine.client", "specchat.engine.chat_rules",
               "specchat.library"),
    # The window counts a reply's parts by the engine's rule (part_stats) and
    # maps its thinking switch onto the template's by the engine's words for
    # reasoning efforts (chat_rules); neither loads MLX.
    "ui": (*BASE, *ENGINE_VALUE_TYPES, "specchat.engine.drafter_kinds", "specchat.engine.worker",
           "specchat.engine.part_stats", "specchat.engine.chat_rules", "specchat.library",
           "specchat.store", "specchat.server", "specchat.applog", "specchat.startup"),
    "tools": ("specchat",),
    "cli": ("specchat",),
    "cluster_cmd": ("specchat",),
    "__main__": ("specchat.cli",),
}
# Third-party packages a part must not import (the window and the local API
# never import MLX: only the engine thread does, lazily).
MUST_NOT: dict[str, tuple[str, ...]] = {
    **{part: (*QT, *MLX) for part in ("errors", "origins", "values", "records", "outputs", "home",
                                      "applog", "startup")},
    "engine": QT,
    "library": QT,
    "store": (*QT, *MLX),
    "server": (*QT, *MLX),
    "ui": MLX,
}


def module_names(root: Path, top: str = "specchat") -> dict[str, Path]:
    """Every module under ``root`` (the ``specchat`` folder) by its dotted
    name; a package by its own name (its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [top, *path.relative_to(root).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imported_modules(path: Path, package: str, known: Collection[str] = (),
                     type_checking: bool = True) -> list[tuple[int, str]]:
    """(line, module) for every import in a source file, module-level and
    inside functions, relative ones resolved against ``package`` (the
    file's own package). ``from P import N`` imports ``P.N`` when that is a
    module in ``known``, else ``P``. ``type_checking=False`` leaves out the
    imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = set() if type_checking else _type_checking_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[:len(parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{a.name}" for a in node.names]
            out += [(node.lineno, name) for name in names if name in known]
            if not all(name in known for name in names):
                out.append((node.lineno, base))
    return out


def part_of(module: str) -> str:
    """The rule a module of specchat falls under: its package below
    ``specchat``, or itself for a top-level module."""
    return module.split(".")[1] if "." in module else module


def _within(module: str, entries: Collection[str]) -> str | None:
    return next((e for e in entries if module == e or module.startswith(e + ".")), None)


def violations(root: Path, may: dict[str, tuple[str, ...]] = MAY_IMPORT,
               must_not: dict[str, tuple[str, ...]] = MUST_NOT,
               top: str = "specchat") -> list[str]:
    """Every import in ``root`` that its part's rule does not allow, and
    every module no rule covers."""
    modules = module_names(root, top)
    found = []
    for name, path in modules.items():
        if name == top:
            continue
        part = part_of(name)
        where = path.relative_to(root)
        if part not in may:
            found.append(f"{where}: no rule says what {part} may import")
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for line, module in imported_modules(path, package, modules):
            if module.split(".")[0] == top:
                if (module != top and part_of(module) != part
                        and not _within(module, may[part])):
                    found.append(f"{where}:{line} imports {module} ({part} may import "
                                 f"{', '.join(may[part]) or 'nothing of SpecChat'})")
            elif bad := _within(module, must_not.get(part, ())):
                found.append(f"{where}:{line} imports {module} ({part} must not import {bad})")
    return sorted(set(found))


def import_graph(root: Path, top: str = "specchat") -> dict[str, set[str]]:
    """module -> the modules importing it runs: every import (inside
    functions too, but not under ``if TYPE_CHECKING:``), plus the packages
    around each side (Python runs a package's ``__init__`` before any of
    its modules)."""
    modules = module_names(root, top)

    def with_packages(module: str) -> set[str]:
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = with_packages(package)
        for _line, module in imported_modules(path, package, modules, type_checking=False):
            while module and module not in modules:  # a name inside a module
                module = module.rpartition(".")[0]
            targets |= with_packages(module) if module else set()
        graph[name] = targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one
    module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_every_layer_keeps_its_import_rules():
    assert all(len(list((PACKAGE / part).glob("*.py"))) > 2
               for part in MAY_IMPORT if (PACKAGE / part).is_dir())
    assert {part_of(m) for m in module_names(PACKAGE) if m != "specchat"} == set(MAY_IMPORT)
    known = module_names(PACKAGE)
    assert [e for entries in MAY_IMPORT.values() for e in entries if e not in known] == []
    assert violations(PACKAGE) == []


def test_a_forbidden_import_is_caught(tmp_path):
    """The rule checker itself: a module-level and a lazy import outside the
    layer's allow-list, absolute and relative, are each reported, as is a
    forbidden third-party import and a module no rule covers; allowed ones
    (its own layer, an allowed module) are not."""
    root = tmp_path / "specchat"
    for layer in ("engine", "library", "ui"):
        (root / layer).mkdir(parents=True)
        (root / layer / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    (root / "values.py").write_text("")
    (root / "library" / "refs.py").write_text("")
    (root / "engine" / "kv.py").write_text("")
    (root / "engine" / "ok.py").write_text(
        "import os\nfrom specchat.engine import kv\nfrom specchat import errors\n")
    (root / "engine" / "bad.py").write_text(
        "from ..library import refs\n"
        "def later():\n    from PySide6.QtCore import QObject\n    import specchat.values\n")
    (root / "ui" / "bad.py").write_text("import mlx.core as mx\nfrom specchat.library import refs\n")
    (root / "new.py").write_text("")
    may = {"engine": ("specchat.errors",), "library": (), "ui": ("specchat.library",),
           "errors": (), "values": ()}
    found = violations(root, may, {"engine": QT, "ui": MLX})
    assert found == [
        "engine/bad.py:1 imports specchat.library.refs (engine may import specchat.errors)",
        "engine/bad.py:3 imports PySide6.QtCore (engine must not import PySide6)",
        "engine/bad.py:4 imports specchat.values (engine may import specchat.errors)",
        "new.py: no rule says what new may import",
        "ui/bad.py:1 imports mlx.core (ui must not import mlx)",
    ]


@pytest.mark.parametrize("package", ["engine", "library", "store", "ui", "server", "tools"])
def test_no_package_has_an_import_cycle(package):
    """No module of a package imports, directly or through others, a module
    that imports it back: every import counts (inside functions too, and a
    package's ``__init__`` runs before its modules), except those under ``if
    TYPE_CHECKING:``, which never run. Shared pieces go down a layer, into a
    module both sides import."""
    found = [c for c in cycles(import_graph(PACKAGE))
             if any(part_of(m) == package for m in c)]
    assert found == []


def test_an_import_cycle_is_found(tmp_path):
    """The cycle finder itself: a cycle through a lazy import and one
    through a package's ``__init__`` are found; a TYPE_CHECKING-only import
    back is not a cycle."""
    root = tmp_path / "specchat"
    (root / "lib" / "kinds").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "lib/__init__.py": "",
        "lib/a.py": "from specchat.lib import b\n",
        "lib/b.py": "def later():\n    from specchat.lib.a import thing\n",
        "lib/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from specchat.lib import d\n",
        "lib/d.py": "from specchat.lib import c\n",
        "lib/kinds/__init__.py": "from specchat.lib.kinds import one\n",
        "lib/kinds/one.py": "from specchat.lib.kinds.base import Base\n",
        "lib/kinds/base.py": "",
    }.items():
        (root / name).write_text(text)
    assert cycles(import_graph(root)) == [
        ["specchat.lib.a", "specchat.lib.b"],
        ["specchat.lib.kinds", "specchat.lib.kinds.base", "specchat.lib.kinds.one"],
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
system = {{os.path.realpath(p) for paths in blas.LIBRARIES.values() for p in paths}}
mapped = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
print(sorted(p for p in system if p in mapped),
      sorted(k for k in os.environ if k.startswith(("BLIS_", "OPENBLAS_"))))
"""
    out = _fresh(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]"]  # no system BLAS in the process, no variables


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


def test_no_test_file_imports_another():
    """What test files share lives in helper modules or fixtures: a test
    file imported by another runs its module-level fixtures and setup
    twice, and ties the two together (docs/architecture.md, "Tests")."""
    import ast

    tests = Path(__file__).resolve().parent
    names = {p.stem for p in tests.rglob("test_*.py")}
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{path.relative_to(tests)}: {m}" for m in modules
                      if m.split(".")[-1] in names]
    assert found == []
