"""The control channel's messages: JSON lines of bounded length, each
checked against one table of what its kind carries before anyone acts on it.

A message is an object with one key, its kind, whose value is an object of
exactly the fields ``KINDS`` lists, each of the right type and size; rank
0's requests carry a ``proof`` beside it (handshake.py). A line that is too
long, not UTF-8, not JSON, or not such a message raises ProtocolError, and
whoever reads it closes that connection and nothing else. Imports no MLX.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from specchat.engine.distributed.hostfile import MAX_RANKS, parse_address
from specchat.engine.errors import EngineError
from specchat.engine.folders import NAME

MAX_LINE = 64 * 1024  # bytes, newline excluded: a join of MAX_RANKS long host names fits
MAX_TEXT = 2000  # characters of an error message
MAX_PATH = 4096
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ProtocolError(Exception):
    """What the other end sent is not a message of the control channel (or
    it proved nothing): the connection is closed, in words."""


class Closed(ProtocolError):
    """The other end closed the connection (or reset it) before its line
    came: a rank that refused a crowd's connection, for one (rank 0 tries
    again: control.py)."""


class Message(NamedTuple):
    kind: str
    body: dict[str, Any]
    proof: str | None = None


# -- the fields -----------------------------------------------------------------

def _hex64(v: object) -> bool:
    return isinstance(v, str) and bool(_HEX64.fullmatch(v))


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 62


def _rank(v: object) -> bool:
    return _count(v) and v < MAX_RANKS


def _size(v: object) -> bool:
    return _count(v) and 2 <= v <= MAX_RANKS


def _text(v: object) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _name(v: object) -> bool:
    return isinstance(v, str) and bool(NAME.fullmatch(v))


def _path(v: object) -> bool:
    return (isinstance(v, str) and 0 < len(v) <= MAX_PATH and "\0" not in v
            and v.startswith("/"))


def _address(v: object) -> bool:
    if not isinstance(v, str):
        return False
    try:
        parse_address(v)
    except EngineError:
        return False
    return True


def _ring(v: object) -> bool:
    return (isinstance(v, list) and 2 <= len(v) <= MAX_RANKS
            and all(isinstance(r, list) and len(r) == 1 and _address(r[0]) for r in v))


def _layers(v: object) -> bool:
    return v is None or (isinstance(v, list) and 2 <= len(v) <= MAX_RANKS
                         and all(_count(n) and n > 0 for n in v))


def _span(v: object) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_count(n) for n in v)


KINDS: dict[str, dict[str, Callable[[object], bool]]] = {
    # rank 0 -> rank, then rank -> rank 0: the handshake (handshake.py)
    "hello": {"nonce": _hex64},
    "challenge": {"nonce": _hex64, "rank": _rank, "proof": _hex64},
    # rank 0's requests (with a proof)
    "probe": {},
    "join": {"cluster": _name, "rank": _rank, "size": _size, "ring": _ring, "model": _path,
             "layers": _layers},
    # a rank's answers
    "ready": {"rank": _rank, "pid": _count},
    "joined": {"rank": _rank, "pid": _count},
    "error": {"text": _text},
    # rank 0 to a joined rank: every rank has joined, start the ring
    "ring": {},
    # a joined rank's messages
    "beat": {},
    "loaded": {"seq": _count, "layer_params": _count, "layer_bytes": _count, "layers": _span},
    "failed": {"seq": _count, "error": _text},
}


def _consistent(kind: str, body: dict) -> bool:
    """Rules across fields."""
    if kind == "join":
        layers = body["layers"]
        return (len(body["ring"]) == body["size"] and body["rank"] < body["size"]
                and body["rank"] > 0 and (layers is None or len(layers) == body["size"]))
    return True


def check(msg: object, kinds: Iterable[str], proof: bool = False) -> Message:
    """``msg`` as a Message of one of ``kinds`` (with a proof when
    ``proof``), or ProtocolError saying what is wrong with it."""
    kinds = set(kinds)
    if not isinstance(msg, dict):
        raise ProtocolError("a line that is not a JSON object")
    keys = set(msg) - ({"proof"} if proof else set())
    if len(keys) != 1 or not keys <= kinds:
        raise ProtocolError(f"a message other than {' or '.join(sorted(kinds))}")
    kind = keys.pop()
    body, fields = msg[kind], KINDS[kind]
    if not isinstance(body, dict) or set(body) != set(fields):
        raise ProtocolError(f"a {kind} message without exactly the fields {sorted(fields)}")
    bad = next((f for f, ok in fields.items() if not ok(body[f])), None)
    if bad is not None or not _consistent(kind, body):
        raise ProtocolError(f"a {kind} message with a bad {bad or 'combination of fields'}")
    if proof and not _hex64(msg.get("proof")):
        raise ProtocolError(f"a {kind} message without a proof")
    return Message(kind, body, msg.get("proof") if proof else None)


def parse(line: bytes) -> object:
    """One line's JSON value (ProtocolError when it is not UTF-8 JSON)."""
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("a line that is not UTF-8 JSON") from None


class Line:
    """JSON lines over one socket (sends from any thread), each line at
    most MAX_LINE bytes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = b""
        self._lock = threading.Lock()

    def send(self, message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self.sock.sendall(data)

    def feed(self, data: bytes) -> list[object]:
        """The values of the lines ``data`` completes."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if any(len(line) > MAX_LINE for line in lines) or len(self._buf) > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
        return [parse(line) for line in lines if line.strip()]

    def read_one(self, timeout: float) -> object:
        """The next line's value; ProtocolError on EOF, silence for
        ``timeout`` seconds, or a line that is not JSON."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"no answer within {timeout:.0f} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise ProtocolError(f"no answer within {timeout:.0f} s") from None
            except ConnectionError as exc:
                raise Closed(f"the connection failed ({exc.strerror or exc})") from None
            except OSError as exc:
                raise ProtocolError(f"the connection failed ({exc.strerror or exc})") from None
            if not data:
                raise Closed("the connection closed")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
        return parse(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
