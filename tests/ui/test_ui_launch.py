"""`specchat` with no subcommand opens the window, with the pair from the
command line selected and loading."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from specchat.store.settings import AppSettings
from specchat.ui.app import initial_pair
from specchat.ui.library_view import default_pair

LAUNCH = """
import sys
from PySide6.QtWidgets import QApplication
import specchat.ui.main_window as mw
made = mw.MainWindow.__init__
def watched(self, *args, **kwargs):
    made(self, *args, **kwargs)
    def loaded(pair):  # after the window's own handler: connected after it
        print("TITLE", self.windowTitle())
        print("SELECTED", self.picker.selection())
        QApplication.instance().quit()
    def failed(message):
        print("FAILED", message)
        QApplication.instance().quit()
    self.session.engine.loaded.connect(loaded)
    self.session.engine.loadFailed.connect(failed)
mw.MainWindow.__init__ = watched
from specchat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_specchat_opens_window_with_pair(tmp_path, tiny_target):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECCHAT_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", LAUNCH, "--target", str(tiny_target),
                          "--lookup"], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TITLE target-llama + suffix matching — SpecChat" in out.stdout
    assert f"SELECTED ('{tiny_target}', None)" in out.stdout


def test_initial_pair_choice():
    assert initial_pair("t", "d", False) == ("t", "d")
    assert initial_pair("t", "d", True) == ("t", None)
    assert initial_pair("t", None, False) == ("t", None)
    assert initial_pair(None, None, False, AppSettings()) == default_pair()
    last = AppSettings(last_target="x", last_draft=None)
    assert initial_pair(None, None, False, last) == ("x", None)
    assert default_pair() == ("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b")


BRIEFCASE_DEV = """
import runpy, sys
from PySide6.QtWidgets import QApplication
import specchat.ui.engine_controller as c

def load(self, target, draft):  # record instead of converting gigabytes
    print("LOAD", target, draft)
    mains = [w for w in QApplication.topLevelWidgets() if w.inherits("QMainWindow")]
    print("TITLE", mains[0].windowTitle(), mains[0].isVisible())
    QApplication.instance().quit()
c.EngineController.load = load
sys.argv.extend([])
runpy.run_module("specchat", run_name="__main__", alter_sys=True)
"""


def test_briefcase_dev_command_opens_gui_with_default_pair(tmp_path):
    # What `briefcase dev` runs (briefcase/commands/dev.py): the package's
    # __main__ through runpy, with no arguments.
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECCHAT_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", BRIEFCASE_DEV], capture_output=True, text=True,
                         env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    target, draft = default_pair()
    assert f"LOAD {target} {draft}" in out.stdout
    assert "TITLE SpecChat True" in out.stdout
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None,
                    reason="the X11 platform plugin is Linux's")
def test_the_x11_platform_plugin_finds_every_library_it_links():
    """Qt opens a window on X11 through its xcb plugin, which links a dozen
    xcb libraries; one missing aborts the app before any window (exit 134)
    while the offscreen platform the other tests use works. ./dev installs
    them; this says which one is missing."""
    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    missing = set()
    for lib in (qt / "plugins" / "platforms" / "libqxcb.so", *qt.glob("lib/libQt6XcbQpa.so*")):
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, check=True).stdout
        missing |= {line.split()[0] for line in out.splitlines() if "not found" in line}
    assert not missing, f"missing for Qt's xcb platform: {sorted(missing)} (run ./dev)"
