"""Records read back from disk, checked before anything uses them.

Everything SpecChat keeps on disk can be edited by hand, damaged, or written
by another version: the model index, the history's rows and settings, the
history index, the records of checked files. Reading one must never end a
command on a ``TypeError`` from a field of the wrong type, and one bad record
must not cost the others. So a record is checked field by field against the
type its dataclass declares (``fields_of``); a bad one is left out and said
once in the log (``report``), and the rest load. A file is read only if it is
a regular file (a FIFO in its place would block the reader forever, a device
would never end) and only up to a bound (``read_file``); JSON nested too
deep to parse is a damaged file like any other (``parse_json``), and JSON
text from anywhere can be held to a nesting depth before it is parsed
(``nested_deeper``: the API's bodies, the tools and tool calls a request
carries; ``deep_path`` says where it goes too deep). A small
JSON file is written whole or not at all (``write_json``), and one that is
only a cache of work done before reads as {} when it is missing or garbage
(``read_record``). A file that two processes read, change and write back (the
model index, the records of checked files) is changed only while holding its
lock (``locked``, ``update_record``), so neither loses what the other wrote.

Only the standard library and ``specchat.values`` here (and numpy, imported
only when JSON nesting is counted): every layer imports it, the engine's
history index too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import logging
import os
import stat
import sys
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from specchat.values import shown

# The records of checked files and measurements are a few KB; a file far past
# that is not one SpecChat wrote.
MAX_RECORD_BYTES = 16 * 2**20
# The most of a model folder's JSON file that is read (its config, its
# tokenizer): the largest published, a tokenizer.json, are a few tens of MB.
MAX_JSON_BYTES = 64 * 2**20


class BadRecord(ValueError):
    """A file or record read back from disk that is not what it must be;
    ``str()`` says which field or what about the file, in words."""


# -- files ---------------------------------------------------------------------------


def read_file(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (a symlink to one is
    followed) of at most ``limit`` bytes. ``FileNotFoundError`` if nothing is
    there; ``BadRecord`` for a FIFO, device, socket or folder, or a file over
    the limit, which are never read; other ``OSError``s as they come. The
    messages say "it is ...": the caller names the file as people know it."""
    with open_file(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew after the check
        raise BadRecord(f"it is larger than the {_size(limit)} such a file can be")
    return data


@contextlib.contextmanager
def open_file(path: str | os.PathLike, limit: int | None = None) -> Iterator[BinaryIO]:
    """``path`` open for reading, if it is a regular file (a symlink to one
    is followed) of at most ``limit`` bytes (any size if None): the one way
    SpecChat opens a file a person or a download put there, for a reader
    that takes only part of it (a safetensors header). Raises as
    ``read_file`` does, before anything is read."""
    before = os.stat(path)
    _check_regular(before, limit)
    # Non-blocking, so that a FIFO swapped in after the check cannot hang
    # the open; fstat then says whether this is still the file checked.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            raise BadRecord("it was replaced while it was being opened")
        _check_regular(now, limit)
        yield f


def _check_regular(st: os.stat_result, limit: int | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise BadRecord(f"it is {file_kind(st.st_mode)}, not a regular file")
    if limit is not None and st.st_size > limit:
        raise BadRecord(f"it is {_size(st.st_size)}, larger than the {_size(limit)} such a "
                        "file can be")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words ("a FIFO (named pipe)")."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n:,} bytes"


def parse_json(data: str | bytes, max_depth: int | None = None) -> object:
    """JSON text as Python values; ``BadRecord`` for anything that is not
    JSON, including nesting too deep to parse (a ``RecursionError``, which is
    no ``ValueError``), or with ``max_depth`` deeper than that (counted
    before parsing: ``nested_deeper``)."""
    if max_depth is not None and nested_deeper(data, max_depth):
        raise BadRecord(f"it nests arrays and objects deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except RecursionError:
        raise BadRecord("it is nested too deeply to read") from None
    except ValueError as exc:  # UnicodeDecodeError included
        if "integer string conversion" in str(exc):  # Python's bound, and its advice to coders
            raise BadRecord(f"it holds a whole number of more than "
                            f"{sys.get_int_max_str_digits():,} digits") from None
        raise BadRecord(f"it is not valid JSON ({exc})") from None


_ONLY_QUOTES_AND_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')


def nested_deeper(data: str | bytes, limit: int) -> bool:
    """Whether JSON text nests arrays and objects deeper than ``limit``,
    found without parsing it: ``json.loads`` recurses once per level, and a
    few hundred levels can exhaust a thread's stack (512 KiB on macOS), a
    few thousand Python's recursion limit. Linear and in C, about as long
    as parsing: escaped backslashes and quotes go first, then every byte
    but quotes and brackets; the pieces between quotes are strings; the
    deepest level is the running count of the brackets outside them.
    (In UTF-8 these bytes never occur inside another character; a
    backslash outside a string is not JSON, which ``json.loads`` says at
    that point, before it nests further.)"""
    body = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(body) <= limit:  # each level opens with a byte of its own: nothing to count
        return False
    import numpy as np

    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    pieces = unescaped.translate(None, _ONLY_QUOTES_AND_BRACKETS).split(b'"')
    outside = np.frombuffer(b"".join(pieces[::2]), np.uint8)  # odd pieces are strings
    if not outside.size:
        return False
    step = np.zeros(256, np.int8)  # +1 opens a level, -1 closes one
    step[list(b"[{")] = 1
    step[list(b"]}")] = -1
    return bool(np.cumsum(step[outside], dtype=np.int32).max() > limit)


_SHOWN_STEPS = 8  # of a path too deep to show whole
# Each byte's part in JSON's structure (bytes.translate, then as int8): 1
# opens a level, -1 (255) closes one, _NEXT is a comma or a colon, _QUOTE a
# quote, 0 anything else.
_NEXT, _QUOTE = 2, 3
_MOVES = bytes(1 if c in b"[{" else 255 if c in b"]}" else _NEXT if c in b",:"
               else _QUOTE if c == 0x22 else 0 for c in range(256))


def deep_path(data: str | bytes, limit: int) -> str:
    """Where JSON text first nests deeper than ``limit``: the path of the
    value that opens the level past it, as a field is named in a request
    (``messages[1].content[0].content``, its first steps when it is long),
    "" if it never does. In C and numpy, as ``nested_deeper`` (8 MiB in
    about the time parsing them takes; only a body it refused is read
    here): escaped backslashes and quotes
    blanked (their places kept), the structural bytes outside strings
    (after an even number of quotes), the depth after each, the one that
    goes past ``limit``; each level's container then opens after the last
    byte before it that is shallower, and the step within it is its commas
    before (an array) or the string before its last colon (an object's key)."""
    import numpy as np

    body = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    clean = body.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    kinds = np.frombuffer(clean.translate(_MOVES), np.int8)
    inside = np.bitwise_xor.accumulate((kinds == _QUOTE).view(np.uint8))  # odd quotes before
    where = np.flatnonzero((kinds != 0) & (kinds != _QUOTE) & (inside == 0))
    s = np.frombuffer(clean, np.uint8)[where]  # the structural bytes outside strings, in order
    moves = kinds[where]
    depth = np.cumsum(np.where(moves == _NEXT, 0, moves), dtype=np.int32)
    past = np.flatnonzero(depth > limit)
    if not past.size:
        return ""
    end = past[0]
    s, depth, where = s[:end], depth[:end], where[:end]
    # The shallowest depth from each structural byte on: a level's container
    # opens where that first reaches the level.
    floor = np.minimum.accumulate(depth[::-1])[::-1]
    quotes = np.flatnonzero(kinds == _QUOTE)
    steps: list[int | str] = []
    for level in range(1, min(limit, _SHOWN_STEPS) + 1):
        start = int(np.searchsorted(floor, level))
        if start >= end:
            break
        mine = depth[start:end] == level
        if s[start] == 0x5B:  # an array: its commas before
            steps.append(int(np.count_nonzero(mine & (s[start:end] == 0x2C))))
            continue
        colons = np.flatnonzero(mine & (s[start:end] == 0x3A))
        k = np.searchsorted(quotes, where[start + colons[-1]]) if colons.size else 0
        steps.append(_key(body[quotes[k - 2]:quotes[k - 1] + 1]) if k >= 2 else "")
    return field_path(steps) + ("..." if limit > _SHOWN_STEPS else "")


def _key(token: bytes) -> str:
    try:
        key = json.loads(token)
    except ValueError:
        key = token[1:-1].decode("utf-8", "replace")
    return key if isinstance(key, str) else ""


def field_path(steps: list[int | str]) -> str:
    """How a request names the value at ``steps`` (``messages[1].content``):
    a key that is a name after a dot, any other in brackets as JSON, an
    index in brackets. Public: the one spelling of it, which the tests of
    the places named (``deep_path``) spell their expectations with."""
    parts = []
    for step in steps:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif step.isidentifier():
            parts.append(f".{step}" if parts else step)
        else:
            parts.append(f"[{json.dumps(shown(step))}]")
    return "".join(parts)


def read_json(path: str | os.PathLike, limit: int) -> object:
    """``read_file`` then ``parse_json``."""
    return parse_json(read_file(path, limit))


def read_record(path: Path) -> dict:
    """A cache file's dict (the records of checked files, measurements);
    {} when it is missing, unreadable or not a dict: it only saves redoing
    work, so garbage in its place means the work is done again."""
    try:
        data = read_json(path, MAX_RECORD_BYTES)
    except (OSError, BadRecord):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: object, **dump: Any) -> None:
    """Replace ``path`` with ``data`` as JSON (``json.dumps(data, **dump)``
    and a newline, as the files it stands in for end, e.g. a model's
    config.json), as ``write_text`` writes."""
    write_text(path, json.dumps(data, **dump) + "\n")


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically and durably:
    written to ``.<name>.<random>.tmp`` beside it (a name no ``*.json``
    glob picks up, made anew: never a link someone left there), fsynced,
    then renamed over it in one ``os.replace``, so no reader, in this
    process or another, after a kill, a crash or a full disk, ever sees
    half a file, and the file it replaces is whole until then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """Hold the ``flock`` of the file ``lock`` (made if needed) for the
    block: what every read-modify-write of a file that two processes (the
    app and a terminal, two terminals) or two threads may change at once
    holds, so neither loses the other's change. The kernel drops the lock
    when its process dies, however it dies. The same lock ``filelock``
    takes, so code holding a ``FileLock`` of the same file waits too."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # a folder in its place was only "Is a directory"
        raise type(exc)(exc.errno, f"the lock file {lock} cannot be opened "
                                   f"({exc.strerror or exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # each open file its own lock: threads wait too
        yield
    finally:
        os.close(fd)  # drops the lock


def lock_beside(path: Path) -> Path:
    """The lock file of ``path``: ``.<name>.lock`` beside it."""
    return path.with_name(f".{path.name}.lock")


def update_record(path: Path, change: Callable[[dict], object], **dump: Any) -> None:
    """Read a record file (``read_record``), let ``change`` edit the dict in
    place, and write it back whole (``write_json``), all under its lock
    (``locked``), so two processes remembering at once keep both entries."""
    with locked(lock_beside(path)):
        data = read_record(path)
        change(data)
        write_json(path, data, **dump)


# -- fields ------------------------------------------------------------------------------


def conforms(value: object, hint: Any) -> bool:
    """Whether a value read from JSON or SQLite has the type ``hint`` (a
    dataclass field's annotation): ``int`` is never a bool, ``float`` takes
    whole numbers, lists stand for tuples."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(conforms(value, a) for a in args)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(
            conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return all(conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(conforms, value, args))
    if isinstance(hint, type):
        return isinstance(value, hint)
    raise TypeError(f"records cannot check values against {hint!r}")


def type_name(hint: Any) -> str:
    """``int | None``, ``dict[str, int]``: a type as a message shows it."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return "None" if hint is type(None) else hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def described(value: object) -> str:
    """A value read from disk as a message shows it: short, on one line,
    with its type (``'12' (str)``); a 1 GB string is cut before it is shown."""
    if isinstance(value, list | tuple | dict):
        kind = type(value).__name__
        return f"a {kind} of {len(value)}" if value else f"an empty {kind}"
    text = repr(value[:41]) if isinstance(value, str | bytes) else value
    return f"{shown(text)} ({type(value).__name__})"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def fields_of(cls: type, data: object, defaults: Mapping[str, object] | None = None
              ) -> dict[str, object]:
    """The values of the dataclass ``cls``'s fields in ``data`` (a JSON object,
    a SQLite row as a dict), each checked against the field's declared type:
    what ``cls(**...)`` takes. A missing field takes its dataclass default,
    else its entry in ``defaults``, else None if its type allows None (files
    of older versions lack newer fields); keys that are not fields are
    ignored. ``BadRecord`` names the first field that is missing or of the
    wrong type."""
    if not isinstance(data, Mapping):
        raise BadRecord(f"it is {described(data)}, not a record of named fields")
    hints = _hints(cls)
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints[f.name]
        if f.name in data:
            value = data[f.name]
            if not conforms(value, hint):
                raise BadRecord(f"{f.name} is {described(value)}, not {type_name(hint)}")
            out[f.name] = value
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        elif defaults and f.name in defaults:
            out[f.name] = defaults[f.name]
        elif conforms(None, hint):
            out[f.name] = None
        else:
            raise BadRecord(f"{f.name} is missing")
    return out


# -- saying so ---------------------------------------------------------------------------

_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def report(log: logging.Logger, message: str) -> None:
    """Log ``message`` as a warning, once per process: records are read again
    on every listing and every window refresh, and one damaged record is one
    line in the log, not one per read."""
    with _reported_lock:
        if (log.name, message) in _reported:
            return
        _reported.add((log.name, message))
    log.warning("%s", message)
