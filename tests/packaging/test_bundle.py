"""The app as it ships: Briefcase builds the Linux system package (.deb)
from the tracked files, it is installed, and the installed ``specchat`` runs
outside the development venv, with only what the package carries.

This is the packaging check CI runs as its own step (``./dev bundle``, from
.ci/run): ``briefcase create``, ``build`` and ``package linux system``, then
``apt-get install`` of the .deb, then the installed app under Xvfb on the
tiny models (a message typed into its real window, the reply watched as it
streams into the history), ``specchat generate`` and ``specchat models``,
and every file the installed app creates or changes, traced with strace:
all of it under the user data folder. A requirement missing from
``requires``, a resource missing from the package or a wrong entry point
fails here; nothing in the development venv can hide it.

Marked ``bundle``: skipped unless pytest runs with ``--bundle`` (it takes
minutes and installs a system package).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import installed as inst  # noqa: E402
from app_imports import imported_top_modules  # noqa: E402  (tests/, on the path by conftest)

pytestmark = pytest.mark.bundle

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "bundle"  # the source copy, Briefcase's build and the .deb
BRIEFCASE_VENV = REPO / "build" / "briefcase-venv"  # made by ./dev bundle
TEMPLATE = "linux-system-template-v0.4.1"
PACKAGE = "specchat"
PY_APP = inst.APP_DIR / "app" / "specchat"  # the installed app's Python package
# Waits for dpkg's lock rather than failing at once (another apt run, an update).
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=600"]


def _briefcase_config() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["briefcase"]


def template() -> Path | None:
    """Briefcase's Linux system template, kept offline beside the repository
    (CI lays shared/ beside its clone; developers have /work/shared). None:
    Briefcase clones it from its repository, as on any machine with internet."""
    override = os.environ.get("SPECCHAT_BRIEFCASE_TEMPLATE")
    candidates = [Path(override)] if override else [
        REPO.parent / "shared" / "briefcase" / TEMPLATE, Path("/work/shared/briefcase") / TEMPLATE]
    return next((c for c in candidates if (c / "cookiecutter.json").is_file()), None)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def _copy_tracked(dest: Path) -> None:
    """The tracked files as they are in the work tree (so a change not yet
    committed is checked too), and nothing untracked: what a clean clone has."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel in tracked_files():
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)


def _briefcase(src: Path, *command: str, timeout: float) -> None:
    exe = BRIEFCASE_VENV / "bin" / "briefcase"
    args = [str(exe), *command, "linux", "system", "--no-input"]
    if (tpl := template()) is not None:
        args += ["-C", f'template="{tpl}"']
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # dpkg-deb's default (xz) takes many minutes for the .deb on two cores;
    # the check needs the files, not the compression (docs/app.md).
    env.setdefault("DPKG_DEB_COMPRESSOR_TYPE", "zstd")
    started = time.monotonic()
    out = subprocess.run(args, cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"briefcase {command[0]}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    assert out.returncode == 0, f"briefcase {' '.join(command)} failed:\n{out.stdout[-6000:]}"


@pytest.fixture(scope="module")
def deb() -> Path:
    """Build the .deb from a copy of the tracked files, as a clean clone would."""
    missing = inst.tools_missing()
    if missing or not (BRIEFCASE_VENV / "bin" / "briefcase").exists():
        pytest.fail(f"the packaging tools are not installed ({', '.join(missing) or 'briefcase'}):"
                    " run ./dev bundle, which installs them and runs this check")
    src = WORK / "src"
    _copy_tracked(src)
    _briefcase(src, "create", timeout=1800)
    _briefcase(src, "build", timeout=600)
    _briefcase(src, "package", timeout=1800)
    debs = sorted((src / "dist").glob("*.deb"))
    assert len(debs) == 1, debs
    kept = WORK / debs[0].name
    shutil.move(debs[0], kept)
    return kept


@pytest.fixture(scope="module")
def installed(deb) -> Path:
    """The package installed with apt (which brings its Depends), removed after."""
    out = subprocess.run([*APT, "install", "--reinstall", "--allow-downgrades", str(deb)], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    yield deb
    subprocess.run([*APT, "remove", PACKAGE], capture_output=True, timeout=600,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


@pytest.fixture(scope="module")
def untouched(installed):
    """The installed files before anything ran; checked after every run."""
    return inst.tree_state(inst.APP_DIR)


def _package_files() -> set[str]:
    out = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


# -- what the package holds -------------------------------------------------------------------
def test_the_package_declares_its_entry_point_icons_and_dependencies(installed):
    files = _package_files()
    assert str(inst.INSTALLED) in files and os.access(inst.INSTALLED, os.X_OK)
    app_id = f"{_briefcase_config()['bundle']}.{PACKAGE}"
    desktop = Path(f"/usr/share/applications/{app_id}.desktop").read_text()
    assert f"Exec={inst.INSTALLED} %F" in desktop.splitlines()
    assert f"Icon={app_id}" in desktop.splitlines()
    icon_base = REPO / _briefcase_config()["app"][PACKAGE]["icon"]
    for size in (16, 32, 64, 128, 256, 512):
        shipped = Path(f"/usr/share/icons/hicolor/{size}x{size}/apps/{app_id}.png")
        assert shipped.read_bytes() == (icon_base.parent / f"{icon_base.name}-{size}.png"
                                        ).read_bytes(), shipped
    doc = Path("/usr/share/doc") / PACKAGE
    assert (doc / "copyright").read_bytes() == (REPO / "LICENSE").read_bytes()
    assert gzip.decompress((doc / "changelog.gz").read_bytes()) == \
        (REPO / "CHANGELOG.md").read_bytes()
    depends = subprocess.run(["dpkg-deb", "-f", str(installed), "Depends"], capture_output=True,
                             text=True, check=True).stdout
    runtime = _briefcase_config()["app"][PACKAGE]["linux"]["system"]["debian"][
        "system_runtime_requires"]
    assert all(f", {lib}" in depends for lib in runtime), depends
    assert "libpython3" in depends  # the system Python the app runs on


def _resource_literals() -> set[str]:
    """Every "resources/..." path the app's code names."""
    found = set()
    for path in (REPO / "app" / "specchat").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("resources/"):
                found.add(node.value)
    return found


def test_every_resource_the_app_reads_is_in_the_package(installed):
    """The styles, icons and catalog (everything under resources/, which the
    app reads through specchat/resources) are installed, byte for byte."""
    files = _package_files()
    tracked = [Path(p) for p in tracked_files() if p.startswith("resources/")]
    assert {p.parts[1] for p in tracked} >= {"catalog", "icon", "styles"}
    missing, differ = [], []
    for rel in tracked:
        shipped = PY_APP / rel
        if str(shipped) not in files:
            missing.append(str(rel))
        elif shipped.read_bytes() != (REPO / rel).read_bytes():
            differ.append(str(rel))
    assert missing == [] and differ == [], f"missing: {missing}; different: {differ}"
    named = _resource_literals()
    assert "resources/styles/app.qss" in named
    assert [n for n in sorted(named) if str(PY_APP / n) not in files] == []


PROBE = '''
import importlib, json, os, pkgutil, sys, unittest

class Imports(unittest.TestCase):
    """Run inside the installed app's own interpreter: every module of the
    app, and every package it imports (also those imported only inside a
    function), comes from the package."""

    def test_everything_the_app_imports_is_in_the_package(self):
        import specchat
        failed, outside = {}, {}
        names = [m.name for m in pkgutil.walk_packages(specchat.__path__, "specchat.")
                 if not m.name.endswith(".__main__")]  # that one opens the app
        for name in names + json.loads(os.environ["PROBE_MODULES"]):
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            where = getattr(module, "__file__", None) or ""
            if where and not where.startswith(os.environ["PROBE_APP_DIR"]):
                outside[name] = where
        print(json.dumps({"modules": len(names), "failed": failed, "outside": outside,
                          "path": sys.path}))
        self.assertEqual((failed, outside), ({}, {}))

    def test_the_built_in_pair_ships_whole(self):
        """The default pair's GGUF parts are found through the package's
        metadata and their joined bytes match the pinned SHA-256 (converted
        only on first use, which the check does not pay for)."""
        from specchat.library import bundled
        for ref in (bundled.DEFAULT_TARGET, bundled.DEFAULT_DRAFT):
            files = bundled.part_files(ref)
            self.assertTrue(all(str(f).startswith(os.environ["PROBE_APP_DIR"]) for f in files))
            bundled.verify(ref)
'''


def test_everything_the_app_imports_and_the_built_in_pair_are_in_the_package(installed, untouched,
                                                                             tmp_path):
    """The installed binary runs this probe instead of the app
    (BRIEFCASE_MAIN_MODULE, Briefcase's own switch for its test mode): a
    package missing from ``requires`` fails here even when only a menu
    item or the local API would import it."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe_imports.py").write_text(PROBE)
    home = tmp_path / "home"
    env = inst.clean_env(home, BRIEFCASE_MAIN_MODULE="unittest", QT_QPA_PLATFORM="offscreen",
                         PROBE_MODULES=json.dumps(sorted(imported_top_modules())),
                         PROBE_APP_DIR=str(inst.APP_DIR))
    out = subprocess.run([str(inst.INSTALLED), "discover", "-s", str(probe), "-p",
                          "probe_imports.py"], env=env, cwd=probe, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Ran 2 tests" in out.stderr, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["modules"] > 100
    assert inst.tree_state(inst.APP_DIR) == untouched


# -- the installed app at work ------------------------------------------------------------------
def _no_writes_outside(log: Path, cwd: Path, home: Path) -> None:
    writes = inst.written_paths(log, cwd)
    assert any(p.startswith(str(inst.data_dir(home))) for _, p in writes), \
        "the trace saw no write at all"
    assert inst.outside(writes, inst.data_dir(home)) == []


def test_generate_from_the_installed_package(installed, untouched, tmp_path, tiny_target,
                                             tiny_draft):
    """``specchat generate`` speculates and writes what plain decoding writes
    (greedy), from the installed package, writing nothing but under the user
    data folder."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    env = inst.clean_env(home)
    args = ["generate", "--target", str(tiny_target),
            "--prompt", "def fibonacci(n):", "--max-tokens", "48", "--json"]
    log = tmp_path / "generate.strace"
    spec = subprocess.run(inst.traced([str(inst.INSTALLED), *args, "--draft", str(tiny_draft)],
                                      log),
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert spec.returncode == 0, spec.stderr[-4000:]
    plain = subprocess.run([str(inst.INSTALLED), *args, "--plain"], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-4000:]
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["mode"] != "plain" and plain_out["mode"] == "plain"
    assert spec_out["stats"]["new_tokens"] == 48 and spec_out["stats"]["drafted"] > 0
    assert spec_out["token_ids"] == plain_out["token_ids"]
    assert list(cwd.iterdir()) == []
    _no_writes_outside(log, cwd, home)
    assert inst.tree_state(inst.APP_DIR) == untouched


def test_the_installed_app_chats_in_its_window(installed, untouched, tmp_path, tiny_target,
                                               tiny_draft):
    """Launched as a desktop launches it (no venv, a fresh HOME, a real X
    display), the installed app opens its window on the pair given; a
    message typed into the window is answered, the reply seen growing in
    the history while it streams; the close button quits it cleanly."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    log = tmp_path / "gui.strace"
    db = inst.data_dir(home) / "conversations.sqlite3"
    with inst.xvfb() as display:
        app = inst.start(inst.traced([str(inst.INSTALLED), "--target", str(tiny_target),
                                      "--draft", str(tiny_draft)], log),
                         inst.clean_env(home, display), cwd)
        try:
            # Any SpecChat window first, then its title must name the pair
            # given: an entry point that ignores the arguments opens the
            # default pair instead (and starts converting it).
            window = inst.find_window(display, "SpecChat", timeout=180, alive=app)
            wanted = f"{tiny_target.name} + {tiny_draft.name} — SpecChat"  # once, not twice
            inst.wait_for_title(display, window, wanted, timeout=60)
            # The tiny pair answers this one up to the default max tokens
            # (greedy), so it streams for a while; others it ends at once.
            inst.type_into(display, window, "Hello from the installed app")
            states = inst.watch_reply(db, timeout=300, alive=app)
            inst.close_window(display, window)
            app.wait(timeout=120)
        finally:
            output = inst.stop(app)
    assert app.returncode == 0, output[-4000:]
    final = states[-1]
    assert final.complete and final.chars > 0 and final.summary is not None
    from specchat.store.settings import AppSettings

    assert final.summary["new_tokens"] == AppSettings().max_tokens  # the default, all used
    assert final.summary["mode"] != "plain"
    growing = [s.chars for s in states if not s.complete and s.chars > 0]
    assert growing and 0 < growing[0] < final.chars, [(s.chars, s.complete) for s in states]
    assert growing == sorted(growing)
    assert "Traceback" not in output, output[-4000:]
    assert list(cwd.iterdir()) == []
    _no_writes_outside(log, cwd, home)
    assert inst.tree_state(inst.APP_DIR) == untouched

    # The command line tells the same story as the window, on the same home.
    env = inst.clean_env(home)
    where = subprocess.run([str(inst.INSTALLED), "models", "where", "--json"], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert json.loads(where.stdout)["home"] == str(inst.data_dir(home))
