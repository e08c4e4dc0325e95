"""The packages SpecChat's own code imports (every module of app/specchat,
imports inside functions too), for the checks that each is declared and
installed (tests/test_packaging.py) and that the installed app has each
(tests/packaging/test_bundle.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app" / "specchat"


def imported_top_modules() -> set[str]:
    """The top-level names of the modules imported, the standard library's
    and specchat's own left out."""
    names: set[str] = set()
    for path in APP.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "specchat"}
