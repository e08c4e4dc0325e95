"""Where a command may write: into what it made, never over what the user owns.

A path a person gives a command for its output (``heads train --out``,
``bench --json``, a name in the library, a cluster's name) may already hold
something: an installed model, a downloaded head, a file of theirs, a
named pipe, a folder of the system's. The rule, the same for every command
(the CLI's, the window's, the engine's head training):

- where nothing is yet, the command makes the folder or the file itself;
- an empty folder is written into (there is nothing in it to lose);
- what is already there is written over only if the command wrote it
  itself before, which only its caller can tell (``own``: a head's
  training state, a cluster's hostfile, a bench report);

anything else is refused before a byte is written, in a sentence that
names the path, what is there and what to do instead. A symbolic link as
the output itself is never followed (it would write wherever it points),
and the system's own file systems (``/proc``, ``/sys``, ``/dev``) are
never written to. Parents of the output that do not exist yet are made
(they are the command's own then); one that is a file is said to be.

Only the standard library, ``specchat.errors`` and ``specchat.records``:
every layer calls it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specchat import records
from specchat.errors import SpecChatError

SYSTEM = ("/proc", "/sys", "/dev")  # never a place for a command's output
SHOWN_NAMES = 4  # of a folder's entries named in a refusal


class Refused(SpecChatError):
    """An output path a command will not write to; ``str()`` says why."""


Own = Callable[[Path], bool]


def folder(path: str | os.PathLike, what: str, own: Own | None = None, hint: str = "",
           error: type[SpecChatError] = Refused) -> Path:
    """``path`` (absolute, its parents' links resolved) if a command may
    write ``what`` into it: nothing is there yet, it is an empty folder, or
    ``own(path)`` says the command wrote it. Else ``error`` says why, ending
    in ``hint`` (what to do instead). Nothing is made or written here."""
    place, there = _look(path, what, hint, error, stat.S_ISDIR, "a folder")
    if not there:
        return place
    if own is not None and own(place):
        return _writable(place, what, hint, error)
    try:
        names = sorted(os.listdir(place))
    except OSError as exc:
        raise _refused(what, place, f"it cannot be read ({exc.strerror or exc})", hint,
                       error) from None
    if names:
        shown = ", ".join(names[:SHOWN_NAMES]) + (", ..." if len(names) > SHOWN_NAMES else "")
        raise _refused(what, place, f"that folder already holds files this command did not "
                       f"write ({shown})", hint, error)
    return _writable(place, what, hint, error)


def make_folder(path: str | os.PathLike, what: str, own: Own | None = None, hint: str = "",
                error: type[SpecChatError] = Refused) -> Path:
    """``folder``, then the folder made (with its missing parents)."""
    place = folder(path, what, own, hint, error)
    try:
        place.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refused(what, place, f"it cannot be made ({exc.strerror or exc})", hint,
                       error) from None
    return place


def file(path: str | os.PathLike, what: str, own: Own | None = None, hint: str = "",
         error: type[SpecChatError] = Refused) -> Path:
    """``path`` (absolute, its parents' links resolved) if a command may
    write ``what`` there: nothing is there yet, or a regular file that
    ``own(path)`` says the command wrote. Else ``error`` says why, ending
    in ``hint``. A named pipe or a device is never opened (writing to one
    could wait forever)."""
    place, there = _look(path, what, hint, error, stat.S_ISREG, "a file")
    if not there:
        return place
    if own is None or not own(place):
        raise _refused(what, place, "a file of that name is already there", hint, error)
    return _writable(place, what, hint, error)


def write_json(path: str | os.PathLike, data: object, what: str, own: Own | None = None,
               hint: str = "", error: type[SpecChatError] = Refused, **dump: Any) -> Path:
    """``file``, then ``data`` written there whole (``records.write_json``:
    a temporary file renamed into place). Checked again here, however long
    ago the command checked it first: something may have appeared since."""
    place = file(path, what, own, hint, error)
    try:
        records.write_json(place, data, **dump)
    except OSError as exc:
        raise _refused(what, place, f"writing it failed ({exc.strerror or exc})", hint,
                       error) from None
    return place


# -- the checks every output shares --------------------------------------------------------


def _look(path: str | os.PathLike, what: str, hint: str, error: type[SpecChatError],
          kind: Callable[[int], bool], noun: str) -> tuple[Path, bool]:
    """The place (``_place``), and whether something is there: only what
    ``kind`` accepts (a folder, a regular file); a symbolic link is refused,
    never followed, and so is anything of another kind."""
    place = _place(path, what, hint, error)
    st = _lstat(place, what, hint, error)
    if st is None:
        return place, False
    if stat.S_ISLNK(st.st_mode):
        raise _refused(what, place, f"it is a symbolic link (to {os.readlink(place)})", hint,
                       error)
    if not kind(st.st_mode):
        raise _refused(what, place, f"it is {_kind(st.st_mode)}, not {noun}", hint, error)
    return place, True


def _place(path: str | os.PathLike, what: str, hint: str,
           error: type[SpecChatError]) -> Path:
    """The path made absolute, links resolved in its parents but not in its
    last part; refused when empty, in a system folder, or under a file."""
    text = os.fspath(path)
    if not str(text).strip():
        raise error(f"No place given for {what}; nothing was written." + _then(hint))
    try:
        raw = Path(text).expanduser()
    except RuntimeError:  # ~someone with no home folder here
        raw = Path(text)
    place = raw.resolve() if raw.name in ("", ".", "..") else raw.parent.resolve() / raw.name
    for system in SYSTEM:
        if place.is_relative_to(system):
            raise _refused(what, place, f"{system} is the system's, not a place for files",
                           hint, error)
    above = place.parent
    while not os.path.lexists(above):  # the nearest part that is there (made parents go in it)
        above = above.parent
    try:
        mode = os.stat(above).st_mode
    except OSError as exc:  # a link to nothing
        raise _refused(what, place, f"{above} cannot be looked at ({exc.strerror or exc})", hint,
                       error) from None
    if not stat.S_ISDIR(mode):
        raise _refused(what, place, f"{above} is {_kind(mode)}, not a folder", hint, error)
    if not os.access(above, os.W_OK | os.X_OK):
        raise _refused(what, place, f"this user may not write in {above}", hint, error)
    return place


def _lstat(place: Path, what: str, hint: str, error: type[SpecChatError]) -> os.stat_result | None:
    try:
        return os.lstat(place)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a parent that is a file (ENOTDIR), no permission to look
        raise _refused(what, place, f"it cannot be looked at ({exc.strerror or exc})", hint,
                       error) from None


def _writable(place: Path, what: str, hint: str, error: type[SpecChatError]) -> Path:
    if not os.access(place, os.W_OK | (os.X_OK if place.is_dir() else 0)):
        raise _refused(what, place, "this user may not write there", hint, error)
    return place


def _kind(mode: int) -> str:
    return "a file" if stat.S_ISREG(mode) else records.file_kind(mode)


def _refused(what: str, place: Path, why: str, hint: str,
             error: type[SpecChatError]) -> SpecChatError:
    return error(f"Will not write {what} at {place}: {why}; nothing was written." + _then(hint))


def _then(hint: str) -> str:
    return f" {hint[0].upper()}{hint[1:]}." if hint else ""
