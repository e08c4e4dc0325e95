"""Running the installed SpecChat package as a person does: a real X server
(Xvfb), keys typed into its window (xdotool), its close button (the
WM_DELETE_WINDOW message a window manager sends), and every file it
creates, renames or deletes (strace).

Used by tests/packaging/test_bundle.py and benchmarks/first_launch.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INSTALLED = Path("/usr/bin/specchat")
APP_DIR = Path("/usr/lib/specchat")  # the app and its packages, as the .deb lays them out


# -- the environment of a person's session ------------------------------------------------------
def clean_env(home: Path, display: str | None = None, **extra: str) -> dict[str, str]:
    """What a desktop session gives an app: a HOME, a PATH, a UTF-8 locale,
    a display. Nothing of the test run leaks in (no PYTHONPATH, no venv, no
    SPECCHAT_HOME, no XDG_* folders, no Qt platform override)."""
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "TMPDIR": str(home / "tmp")}
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    if display is not None:
        env["DISPLAY"] = display
    env.update(extra)
    return env


def data_dir(home: Path) -> Path:
    """platformdirs.user_data_dir("SpecChat") for that HOME with no XDG_DATA_HOME."""
    return home / ".local" / "share" / "SpecChat"


# -- an X server -----------------------------------------------------------------------------------
@contextlib.contextmanager
def xvfb(size: str = "1280x900x24") -> Iterator[str]:
    """A private X server on a free display number; yields ":N"."""
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", size,
                             "-nolisten", "tcp"], pass_fds=(write,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        with os.fdopen(read) as f:
            number = f.readline().strip()
        if not number:
            raise RuntimeError(f"Xvfb did not start (exit {proc.poll()})")
        yield f":{number}"
    finally:
        proc.terminate()
        proc.wait(10)


def find_window(display: str, title_prefix: str, timeout: float,
                alive: subprocess.Popen | None = None) -> int:
    """The X window whose title starts with ``title_prefix``."""
    deadline = time.monotonic() + timeout
    pattern = "^" + re.escape(title_prefix)
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the app exited ({alive.returncode}) before its window showed")
        out = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", pattern], capture_output=True,
                             text=True, env={**os.environ, "DISPLAY": display})
        ids = [int(w) for w in out.stdout.split()]
        if ids:
            return ids[0]
        time.sleep(0.2)
    raise AssertionError(f"no window titled {title_prefix!r}… within {timeout:g} s")


def window_title(display: str, window: int) -> str:
    return subprocess.run(["xdotool", "getwindowname", str(window)], capture_output=True,
                          text=True, check=True,
                          env={**os.environ, "DISPLAY": display}).stdout.strip()


def wait_for_title(display: str, window: int, wanted: str, timeout: float) -> None:
    """Until the window's title, as the X server has it (with whatever Qt
    appends), is ``wanted`` (it names the pair once one is selected)."""
    deadline = time.monotonic() + timeout
    title = ""
    while time.monotonic() < deadline:
        title = window_title(display, window)
        if title == wanted:
            return
        time.sleep(0.2)
    raise AssertionError(f"the window is titled {title!r}, not {wanted!r}")


def type_into(display: str, window: int, text: str) -> None:
    """Give the window the keyboard (as clicking its title bar would) and type
    ``text`` and Enter, key by key, through the X server."""
    env = {**os.environ, "DISPLAY": display}
    subprocess.run(["xdotool", "windowfocus", "--sync", str(window)], check=True, env=env)
    subprocess.run(["xdotool", "type", "--delay", "15", text], check=True, env=env)
    subprocess.run(["xdotool", "key", "Return"], check=True, env=env)


class _ClientMessage(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                ("display", ctypes.c_void_p), ("window", ctypes.c_ulong),
                ("message_type", ctypes.c_ulong), ("format", ctypes.c_int),
                ("data", ctypes.c_long * 5)]


class _XEvent(ctypes.Union):
    _fields_ = [("xclient", _ClientMessage), ("pad", ctypes.c_long * 24)]


def close_window(display: str, window: int) -> None:
    """What a window manager's close button does: a WM_DELETE_WINDOW client
    message, so the app quits its own way (xdotool can only destroy a window)."""
    x11 = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XInternAtom.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long,
                               ctypes.POINTER(_XEvent)]
    x11.XFlush.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    dpy = x11.XOpenDisplay(display.encode())
    if not dpy:
        raise RuntimeError(f"cannot open display {display}")
    try:
        event = _XEvent()
        msg = event.xclient
        msg.type = 33  # ClientMessage
        msg.window = window
        msg.message_type = x11.XInternAtom(dpy, b"WM_PROTOCOLS", 0)
        msg.format = 32
        msg.data[0] = x11.XInternAtom(dpy, b"WM_DELETE_WINDOW", 0)
        msg.data[1] = 0  # CurrentTime
        x11.XSendEvent(dpy, window, 0, 0, ctypes.byref(event))
        x11.XFlush(dpy)
    finally:
        x11.XCloseDisplay(dpy)


# -- the conversation as the app saved it ---------------------------------------------------------
@dataclass(frozen=True)
class Saved:
    """The last assistant message in the history, as read at one moment."""

    chars: int
    complete: bool
    summary: dict | None
    content: str


def last_reply(db: Path) -> Saved | None:
    """Read-only: the app keeps writing while this reads (WAL)."""
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            row = con.execute("SELECT content, complete, summary FROM messages "
                              "WHERE role = 'assistant' ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None  # not created yet, or mid-checkpoint
    if row is None:
        return None
    content, complete, summary = row
    return Saved(len(content), bool(complete), json.loads(summary) if summary else None, content)


def watch_reply(db: Path, timeout: float, alive: subprocess.Popen | None = None,
                every: float = 0.02) -> list[Saved]:
    """Every distinct state of the reply until it is complete: a streamed
    reply is saved while it streams (at most every 250 ms), so its text is
    seen growing before it is marked complete."""
    seen: list[Saved] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the app exited ({alive.returncode}) before the reply ended")
        state = last_reply(db)
        if state is not None and (not seen or state != seen[-1]):
            seen.append(state)
            if state.complete:
                return seen
        time.sleep(every)
    raise AssertionError(f"no complete reply within {timeout:g} s; seen {seen}")


# -- what the app wrote ---------------------------------------------------------------------------
TRACED = ("open,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,rmdir,"
          "link,linkat,symlink,symlinkat,truncate")


def traced(command: list[str], log: Path) -> list[str]:
    """``command`` under strace, following every thread and child, logging the
    calls that create, change or remove a file (with their folders resolved)."""
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-s", "4096", "-y", "-e", f"trace={TRACED}",
            "-o", str(log), *command]


_CALL = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
_ARG = re.compile(r'(AT_FDCWD|\d+)<([^>]*)>|"((?:[^"\\]|\\.)*)"')
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")


def written_paths(log: Path, cwd: Path) -> list[tuple[str, str]]:
    """(call, absolute path) for every successful call that created, opened
    for writing, renamed, linked or removed a file, from a ``traced`` log."""
    out: list[tuple[str, str]] = []
    for line in log.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m is None or int(m.group(3)) < 0:
            continue
        call, args = m.group(1), m.group(2)
        if call in ("open", "openat", "creat"):
            if call != "creat" and not any(f in args for f in _WRITE_FLAGS):
                continue
        paths: list[str] = []
        base = str(cwd)
        for _fd, fd_dir, quoted in _ARG.findall(args):
            if fd_dir:
                base = fd_dir
            elif quoted:
                text = quoted.encode().decode("unicode_escape")
                paths.append(text if text.startswith("/") else os.path.join(base, text))
                base = str(cwd)
        if call in ("symlink", "symlinkat"):
            paths = paths[1:]  # the first argument is the link's text, not a file
        out.extend((call, os.path.normpath(p)) for p in paths)
    return out


def outside(writes: list[tuple[str, str]], allowed: Path) -> list[tuple[str, str]]:
    """The writes not under ``allowed``, other than creating the folders that
    lead to it and writing to devices (/dev/null, a terminal)."""
    ancestors = {str(p) for p in allowed.parents}
    bad = []
    for call, path in writes:
        if path == str(allowed) or path.startswith(str(allowed) + os.sep):
            continue
        if call in ("mkdir", "mkdirat") and path in ancestors:
            continue
        if path.startswith("/dev/"):
            continue
        bad.append((call, path))
    return bad


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` with its size and mtime: a package's
    files must not change while it runs (no bytecode, logs or settings)."""
    state = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            state[p] = (st.st_size, st.st_mtime_ns)
    return state


def start(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """The app (under strace, or not) in a process group of its own, so
    ``stop`` ends it whole: killing strace alone leaves the app running,
    detached, holding the output pipe."""
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen) -> str:
    """Kill the app's process group if it is still running; its output."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out or ""


def tools_missing() -> list[str]:
    return [t for t in ("Xvfb", "xdotool", "strace", "dpkg-deb", "gcc", "make")
            if shutil.which(t) is None]
