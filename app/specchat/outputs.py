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

SpecChat's own folder (``specchat.home``) is arranged by SpecChat alone:
its Hub cache, the folders of installed models, its work folders and
records. An output goes into it only where its command keeps such things
(``home_place``: a head directly in ``models``, a cluster directly in
``clusters``), never elsewhere in it: a head trained into ``<home>/hub``
was the Hub cache's folder, and removing the head removed every download;
one in ``<home>/models/t/sub`` went with the model ``t``.

Only the standard library, ``specchat.errors``, ``specchat.records`` and
``specchat.home``: every layer calls it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specchat import records
from specchat.errors import SpecChatError
from specchat.home import home

SYSTEM = ("/proc", "/sys", "/dev")  # never a place for a command's output
SHOWN_NAMES = 4  # of a folder's entries named in a refusal


class Refused(SpecChatError):
    """An output path a command will not write to; ``str()`` says why."""


Own = Callable[[Path], bool]
# Where in SpecChat's own folder an output may be, directly: a folder of it
# by name ("models"), or by path one SpecChat chose itself (a work folder);
# None: nowhere in it.
Place = str | os.PathLike | None


def folder(path: str | os.PathLike, what: str, own: Own | None = None, hint: str = "",
           error: type[SpecChatError] = Refused, home_place: Place = None) -> Path:
    """``path`` (absolute, its parents' links resolved) if a command may
    write ``what`` into it: nothing is there yet, it is an empty folder, or
    ``own(path)`` says the command wrote it; inside SpecChat's own folder
    only as a folder of ``home_place`` there (``"models"``). Else ``error``
    says why, ending in ``hint`` (what to do instead). Nothing is made or
    written here."""
    place, there = _look(path, what, hint, error, stat.S_ISDIR, "a folder", home_place)
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
                error: type[SpecChatError] = Refused, home_place: Place = None) -> Path:
    """``folder``, then the folder made (with its missing parents)."""
    place = folder(path, what, own, hint, error, home_place)
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
    could wait forever). Never inside SpecChat's own folder."""
    place, there = _look(path, what, hint, error, stat.S_ISREG, "a file")
    if not there:
        return place
    if own is None or not own(place):
        raise _refused(what, place, "a file of that name is already there", hint, error)
    return _writable(place, what, hint, error)


def write_json(path: str | os.PathLike, data: object, what: str, own: Own | None = None,
               hint: str = "", error: type[SpecChatError] = Refused, **dump: Any) -> Path:
    """``write_text`` of ``data`` as JSON (``records.write_json``'s text)."""
    return write_text(path, json.dumps(data, **dump) + "\n", what, own, hint, error)


def write_text(path: str | os.PathLike, text: str, what: str, own: Own | None = None,
               hint: str = "", error: type[SpecChatError] = Refused) -> Path:
    """``file``, then ``text`` written there whole (``records.write_text``:
    a temporary file renamed into place, so a full disk or a kill leaves
    the file that was there as it was). Checked again here, however long
    ago the command checked it first: something may have appeared since."""
    place = file(path, what, own, hint, error)
    try:
        records.write_text(place, text)
    except OSError as exc:
        raise _refused(what, place, f"writing it failed ({exc.strerror or exc})", hint,
                       error) from None
    return place


# -- the checks every output shares --------------------------------------------------------


def _look(path: str | os.PathLike, what: str, hint: str, error: type[SpecChatError],
          kind: Callable[[int], bool], noun: str,
          home_place: Place = None) -> tuple[Path, bool]:
    """The place (``_place``), and whether something is there: only what
    ``kind`` accepts (a folder, a regular file); a symbolic link is refused,
    never followed, and so is anything of another kind."""
    place = _place(path, what, hint, error)
    _outside_home(place, what, hint, error, home_place)
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


def _outside_home(place: Path, what: str, hint: str, error: type[SpecChatError],
                  home_place: Place) -> None:
    """Refuse ``place`` if it is in SpecChat's own folder anywhere but
    directly in ``home_place`` (a folder of the home by name, or a folder
    SpecChat chose itself by its path; None: nowhere in it). The folders
    are compared as themselves, not as text: another name for the home (a
    bind mount of it; on macOS the same path in other letter case) is the
    home too."""
    try:
        root = home().resolve()
    except (OSError, RuntimeError):
        return
    if not _within(place, root):
        return
    allowed = root / home_place if home_place is not None else None
    if allowed is not None and _same(place.parent, allowed):
        return
    where = (f"goes only directly in {allowed}" if allowed is not None
             else "has no place there")
    raise _refused(what, place, f"it is in SpecChat's own folder {root}, which SpecChat "
                   f"arranges itself ({what} {where})", hint, error)


def _within(place: Path, root: Path) -> bool:
    """``place`` is ``root`` or inside it: by their paths, or by one of the
    folders above ``place`` being ``root`` itself."""
    if place == root or place.is_relative_to(root):
        return True
    folder = _identity(root)
    return folder is not None and any(_identity(p) == folder for p in (place, *place.parents))


def _same(a: Path, b: Path) -> bool:
    ids = _identity(a)
    return a == b.resolve() or (ids is not None and ids == _identity(b))


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
