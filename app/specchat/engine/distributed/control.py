"""The side channel beside MLX's ring: one TCP connection from rank 0 to
each other rank, carrying JSON lines (wire.py), opened only after both ends
proved the cluster's secret (handshake.py).

MLX's ring cannot tell rank 0 much: ``init`` blocks until every rank has
connected, a collective whose peer's process died fails (the kernel closes
its sockets), but one whose peer's host vanished, or whose peer is stuck,
waits forever. So the control channel does what the ring cannot:

* rendezvous: the other ranks wait on their control port for as long as it
  takes; rank 0 connects when the app loads the cluster target and fails at
  once, in words, when a rank is not running;
* the ring's start: ``mx.distributed.init`` holds Python's GIL while it
  connects, up to about 30 s when a peer never opens its ring, and nothing
  else in the process runs meanwhile (not the watchdog, not rank 0's GUI).
  So a rank answers a join only after checking that it can listen on its
  ring port, and opens its ring only when rank 0 says every rank has
  joined (``open_ring``); a rank 0 that leaves before that is seen at once;
* replies in words: a rank's load result or error reaches rank 0 as text;
* liveness: ranks send a heartbeat every second; rank 0's watchdog thread
  declares a rank lost when its connection closes or its heartbeats stop,
  and then shuts down rank 0's ring sockets so that a collective blocked
  in MLX returns with an error instead of hanging the engine thread.

TCP keepalive on every connection bounds how long a silently vanished host
goes unnoticed.

Strangers: anyone who can reach a rank's control port can connect, so until
rank 0 has joined, a rank takes every connection in one loop
(``RankChannel``), not a thread or a slot each. A connection that says
nothing, trickles bytes, sends something that is not the next message, or
fails to prove the secret is closed at its first wrong line or 5 s after it
came, and holds up no other meanwhile. A flood is bounded by PENDING
connections waiting at once: each one past it closes the oldest connection
of the address holding the most, so a stranger's own connections go first.
Rank 0's is closed only when no address holds more than rank 0's (a
stranger on rank 0's own address, or one with an address for every
connection), and then only once PENDING newer connections have come
within the milliseconds of its handshake; rank 0 then asks again on a new
connection (``request``) until its deadline. What a stranger can do is use
the rank's CPU and, past what the kernel queues (BACKLOG), delay
connections, rank 0's among them, by the time TCP takes to try again.
Nothing here calls MLX.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import selectors
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specchat.engine.distributed import handshake, wire
from specchat.engine.distributed.hostfile import ClusterSpec, Rank, parse_address
from specchat.engine.distributed.wire import Line, Message, ProtocolError
from specchat.engine.errors import EngineError

BEAT_S = 1.0
SILENCE_S = 15.0  # no heartbeat for this long: the rank is lost
CONNECT_S = 5.0  # a handshake's deadline, on both ends
PENDING = 128  # connections a rank holds before rank 0 has joined that proved nothing yet
ACCEPTS = 8  # connections a rank takes in one turn of its loop, before reading what came
BACKLOG = 1024  # connections the kernel queues for a rank (capped by the system: somaxconn)
RETRY_S = 0.05  # rank 0 asks again this soon when a rank closed its connection unanswered
NOTES = 20  # refused connections a rank reports one by one, in ...
WINDOW_S = 10.0  # ... this many seconds (the rest as a count)
RANK_SAYS = ("beat", "loaded", "failed", "error")  # what a joined rank may send
ZERO_SAYS = ("ring",)  # what rank 0 may send a joined rank


def keepalive(sock: socket.socket, idle: int = 5, interval: int = 2, count: int = 3) -> None:
    """Let the kernel notice a vanished peer within about idle + interval * count seconds."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle_opt = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    for opt, value in ((idle_opt, idle), (getattr(socket, "TCP_KEEPINTVL", None), interval),
                       (getattr(socket, "TCP_KEEPCNT", None), count)):
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)  # Linux: unacknowledged data too
    if user_timeout is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, user_timeout, (idle + interval * count) * 1000)


class Peers:
    """Rank 0's connections to ranks 1..N-1, and the watchdog over them."""

    def __init__(self, spec: ClusterSpec, secret: bytes):
        self.spec = spec
        self.secret = secret
        self.lines: dict[int, Line] = {}
        self.inbox: dict[int, queue.Queue] = {}
        self.lost: tuple[int, str] | None = None  # (rank, why), the first loss only
        self._on_lost: list[Callable[[], None]] = []
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._lost_event = threading.Event()

    def connect(self) -> None:
        """Reach every rank's control port, prove the secret, and hand the
        rank the ring layout and the model (what it will agree to load)."""
        spec = self.spec
        for peer in spec.ranks[1:]:
            join = {"cluster": spec.name, "rank": peer.rank, "size": spec.size,
                    "ring": spec.ring_hostfile(), "model": spec.model,
                    "layers": list(spec.layers) if spec.layers else None}
            where = f"Rank {peer.rank} of cluster {spec.name} ({peer.ip}:{peer.control_port})"
            try:
                line, reply = request(lambda _left, p=peer: self._dial(p), self.secret, peer.rank,
                                      "join", join, CONNECT_S)
            except handshake.NotOurs as exc:
                self.close()
                raise EngineError(f"The process at {peer.ip}:{peer.control_port} {exc}: "
                                  f"restart the ranks with `specchat cluster start {spec.name}`.") from None
            except (ProtocolError, OSError) as exc:
                self.close()
                raise EngineError(f"{where} did not answer as a SpecChat rank ({exc}).") from None
            keepalive(line.sock)
            if reply.kind != "joined":
                line.close()
                self.close()
                raise EngineError(f"{where} refused to join: {reply.body.get('text')}.")
            self.lines[peer.rank] = line
            self.inbox[peer.rank] = queue.Queue()

    def open_ring(self) -> None:
        """Tell every rank that all have joined: each starts its ring now,
        as rank 0 is about to. Not when a rank is already lost: MLX's
        ``init`` would wait for it about 31 s, holding the GIL."""
        if self.lost is not None:
            self.close()
            raise EngineError(self.describe_loss())
        for r, line in self.lines.items():
            try:
                line.send({"ring": {}})
            except OSError as exc:
                self.close()
                raise EngineError(f"Rank {r} of cluster {self.spec.name} "
                                  f"({self.spec.ranks[r].ip}) left before the ring started "
                                  f"({exc.strerror or exc}).") from None

    def _dial(self, peer: Rank) -> socket.socket:
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                return socket.create_connection(peer.control_address, timeout=CONNECT_S)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    self.close()
                    raise EngineError(
                        f"Rank {peer.rank} of cluster {self.spec.name} is not running at "
                        f"{peer.ip}:{peer.control_port} ({exc.strerror or exc}): start it with "
                        f"`specchat cluster start {self.spec.name}`.") from None
                time.sleep(0.2)

    def on_lost(self, fn: Callable[[], None]) -> None:
        self._on_lost.append(fn)

    def watch(self) -> None:
        now = time.monotonic()
        self._seen = {r: now for r in self.lines}
        for line in self.lines.values():
            line.sock.settimeout(None)
        threading.Thread(target=self._watch, name="specchat-cluster-watchdog", daemon=True).start()

    def _watch(self) -> None:
        by_sock = {line.sock: r for r, line in self.lines.items()}
        while not self._stop.is_set() and self.lost is None:
            try:
                ready, _, _ = select.select(list(by_sock), [], [], BEAT_S)
            except (OSError, ValueError):
                return
            now = time.monotonic()
            for sock in ready:
                r = by_sock[sock]
                try:
                    data = sock.recv(65536)
                except OSError as exc:
                    self._lose(r, f"lost its connection ({exc.strerror or exc})")
                    return
                if not data:
                    self._lose(r, "stopped (its connection closed)")
                    return
                self._seen[r] = now
                try:
                    messages = [wire.check(m, RANK_SAYS) for m in self.lines[r].feed(data)]
                except ProtocolError as exc:
                    self._lose(r, f"sent {exc}, which SpecChat does not understand")
                    return
                for msg in messages:
                    if msg.kind == "error":
                        self._lose(r, f"failed: {msg.body['text']}")
                        return
                    if msg.kind != "beat":
                        self.inbox[r].put(msg)
            for r, seen in self._seen.items():
                if now - seen > SILENCE_S:
                    self._lose(r, f"stopped answering ({SILENCE_S:.0f} s without a heartbeat)")
                    return

    def _lose(self, rank: int, why: str) -> None:
        if self.lost is None:
            self.lost = (rank, why)
        self._lost_event.set()
        for q in self.inbox.values():
            q.put(None)
        for fn in self._on_lost:
            fn()

    def wait_lost(self, timeout: float) -> tuple[int, str] | None:
        """The loss, once the watchdog has seen it (waiting up to ``timeout``)."""
        self._lost_event.wait(timeout)
        return self.lost

    def collect(self, key: str, seq: int) -> dict[int, dict]:
        """Each rank's message carrying ``key`` for request ``seq`` (older
        ones are dropped; a rank's loss ends the wait with an EngineError)."""
        out = {}
        for r, q in self.inbox.items():
            while r not in out:
                msg: Message | None = q.get()
                if msg is None:
                    raise EngineError(self.describe_loss())
                if msg.body.get("seq") != seq:
                    continue
                if msg.kind == key:
                    out[r] = msg.body
                elif msg.kind == "failed":
                    raise EngineError(f"Rank {r} of cluster {self.spec.name} "
                                      f"({self.spec.ranks[r].ip}) could not load its layers: "
                                      f"{msg.body['error']}")
        return out

    def describe_loss(self) -> str:
        if self.lost is None:
            return f"The connection to cluster {self.spec.name} was lost"
        r, why = self.lost
        return f"Rank {r} of cluster {self.spec.name} ({self.spec.ranks[r].ip}) {why}"

    def close(self) -> None:
        self._stop.set()
        for line in self.lines.values():
            line.close()


def request(dial: Callable[[float], socket.socket], secret: bytes, rank: int, kind: str,
            body: dict, timeout: float) -> tuple[Line, Message]:
    """Rank 0's question ``kind`` to rank ``rank`` on the connection
    ``dial(seconds left)`` opens, after the handshake: the open line and
    the answer. Asked again on a new connection when the rank closes one
    before answering (a rank full of connections that prove nothing
    closes its oldest, which may be this one), until ``timeout`` has
    passed; then the last error, as from handshake.ask."""
    deadline = time.monotonic() + timeout
    while True:
        line = Line(dial(max(0.0, deadline - time.monotonic())))
        try:
            return line, handshake.ask(line, secret, rank, kind, body,
                                       max(0.0, deadline - time.monotonic()))
        except wire.Closed:
            line.close()
            if time.monotonic() + RETRY_S >= deadline:
                raise
        except BaseException:
            line.close()
            raise
        time.sleep(RETRY_S)


def probe(spec: ClusterSpec, secret: bytes, timeout: float = 1.0) -> tuple[int, str] | None:
    """The first of ranks 1..N-1 that is not waiting for rank 0, with why in
    words; None when all of them are. A probe is a connection a rank answers
    and closes without joining (after the handshake: "ready" comes from a
    rank of this cluster), so asking costs the ranks nothing (a rank
    serving rank 0 has closed its port and counts as not waiting). Each rank
    takes up to ``timeout`` (connecting and the answers, on a new
    connection if the rank closed one unanswered: ``request``), plus the
    resolver's time for a host given by name."""
    for peer in spec.ranks[1:]:
        def dial(left: float, p: Rank = peer) -> socket.socket:
            return socket.create_connection(p.control_address, timeout=max(left, 0.1))

        try:
            line, reply = request(dial, secret, peer.rank, "probe", {}, timeout)
            line.close()
        except handshake.NotOurs as exc:
            return peer.rank, (f"the process at {peer.ip}:{peer.control_port} {exc}: restart "
                               f"the ranks with `specchat cluster start {spec.name}`")
        except ProtocolError:
            reply = None
        except (OSError, OverflowError, ValueError) as exc:  # refused, unreachable, bad port
            why = getattr(exc, "strerror", None) or exc
            return peer.rank, (f"rank {peer.rank} is not running at {peer.ip}:{peer.control_port} "
                               f"({why}): start it with `specchat cluster start {spec.name}`")
        if reply is None or reply.kind != "ready" or reply.body["rank"] != peer.rank:
            return peer.rank, (f"rank {peer.rank} at {peer.ip}:{peer.control_port} did not answer "
                               "as a SpecChat rank")
    return None


def ring_sockets(spec: ClusterSpec, rank: int) -> list[socket.socket]:
    """This process's sockets of the ring (duplicates of MLX's descriptors):
    bound to our ring port (the listening socket during ``init``, the
    accepted connection after) or connected to a neighbour's ring port."""
    own = spec.ranks[rank]
    neighbours = {(spec.ranks[(rank + d) % spec.size].ip,
                   spec.ranks[(rank + d) % spec.size].ring_port) for d in (1, -1)}
    found = []
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(fd_dir):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (ValueError, OSError):
            continue
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            sock.close()
            continue
        try:
            local = sock.getsockname()
            try:
                peer = sock.getpeername()
            except OSError:
                peer = None
        except OSError:
            sock.close()
            continue
        ours = local[1] == own.ring_port
        if ours or (peer is not None and (peer[0], peer[1]) in neighbours):
            found.append(sock)
        else:
            sock.close()
    return found


def ring_port_problem(address: str) -> str | None:
    """Why this host cannot listen on its ring ``address`` (None: it can).
    Found before joining, because MLX would only find it inside ``init``,
    while rank 0 waits there for this rank with the GIL held."""
    host, port = parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as MLX's ring does
            sock.bind((host, port))
            sock.listen()
    except OSError as exc:
        return f"this rank cannot listen on its ring address {address} ({exc.strerror or exc})"
    return None


def shut(socks: list[socket.socket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@dataclass(eq=False)
class _Caller:
    """A connection to a rank that has not yet proved the secret."""

    sock: socket.socket
    ip: str
    line: Line
    deadline: float
    nonces: tuple[str, str] | None = None  # once its hello came: handshake.verify's


class _Notes:
    """What a rank says about the connections it refuses: each one in a
    line, up to NOTES lines a WINDOW; past that, and for the connections it
    drops to make room, a count at the end of the window. A flood of
    connections costs the supervisor's output a few lines, not one each."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self._start = time.monotonic()
        self._said = 0
        self._quiet = 0
        self._dropped: dict[str, int] = {}

    def refused(self, ip: str, why: str) -> None:
        if self._said < NOTES:
            self._said += 1
            self.say(f"refused a connection from {ip}: {why}")
        else:
            self._quiet += 1

    def dropped(self, ip: str) -> None:
        self._dropped[ip] = self._dropped.get(ip, 0) + 1

    def tick(self, now: float, end: bool = False) -> None:
        """Say the counts once a window has passed (or at ``end``)."""
        if now - self._start < WINDOW_S and not end:
            return
        if self._quiet:
            self.say(f"refused {self._quiet} more connections in {now - self._start:.0f} s")
        if self._dropped:
            ip = max(self._dropped, key=self._dropped.__getitem__)
            self.say(f"closed {sum(self._dropped.values())} connections in "
                     f"{now - self._start:.0f} s before they proved the secret, to keep at most "
                     f"{PENDING} waiting (the most, {self._dropped[ip]}, from {ip})")
        self._start, self._said, self._quiet, self._dropped = now, 0, 0, {}


class RankChannel:
    """A non-zero rank's end: wait for rank 0 (the first connection that
    proves the secret and asks to join), answer it, beat, and leave the
    process when rank 0 goes away.

    Until rank 0 joins, one loop takes every connection (no thread each):
    it answers each line as it comes, so a connection that is slow, silent
    or wrong holds up no other, and closes a connection at its deadline or
    at its first wrong line. It holds at most PENDING connections that have
    not proved the secret; one more closes one of them, the oldest of the
    address holding the most (the module's docstring says what a stranger
    can and cannot do)."""

    def __init__(self, rank: int, host: str, port: int, secret: bytes,
                 say: Callable[[str], None] = lambda _m: None):
        self.rank = rank
        self.secret = secret
        self.notes = _Notes(say)
        self.listener = socket.create_server((host, port), backlog=BACKLOG, reuse_port=False)
        self.line: Line | None = None
        self.join: dict | None = None
        self._ring = threading.Event()
        self._waiting: dict[socket.socket, _Caller] = {}  # oldest first
        self._by_ip: dict[str, dict[socket.socket, _Caller]] = {}
        self._selector = selectors.DefaultSelector()

    def accept(self) -> dict:
        """Block until rank 0 joins; its join message (checked: wire.KINDS)."""
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ)
        try:
            while self.join is None:
                first = next(iter(self._waiting.values()), None)
                wait = 1.0 if first is None else first.deadline - time.monotonic()
                for key, _events in self._selector.select(min(max(wait, 0.0), 1.0)):
                    if key.fileobj is self.listener:
                        self._admit()
                    elif self.join is None and key.fileobj in self._waiting:
                        self._read(key.data)
                now = time.monotonic()
                while self.join is None and self._waiting:
                    first = next(iter(self._waiting.values()))
                    if first.deadline > now:
                        break
                    self._refuse(first, f"no answer within {CONNECT_S:.0f} s")
                self.notes.tick(now)
        finally:
            for caller in list(self._waiting.values()):
                self._close(caller)
            self.notes.tick(time.monotonic(), end=True)
            self._selector.close()
            self.listener.close()
        threading.Thread(target=self._beat, name="specchat-rank-beat", daemon=True).start()
        return self.join

    def _admit(self) -> None:
        """Take up to ACCEPTS new connections (then the loop reads the lines
        that came meanwhile), making room by closing the oldest connection
        of the address holding the most."""
        for _ in range(ACCEPTS):
            try:
                conn, addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors, or a connection reset in the queue
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._waiting:
                    self._drop_one()
                return
            if len(self._waiting) >= PENDING:
                self._drop_one()
            conn.setblocking(False)
            caller = _Caller(conn, addr[0], Line(conn), time.monotonic() + CONNECT_S)
            self._waiting[conn] = caller
            self._by_ip.setdefault(caller.ip, {})[conn] = caller
            self._selector.register(conn, selectors.EVENT_READ, caller)

    def _drop_one(self) -> None:
        crowd = max(self._by_ip.values(),
                    key=lambda c: (len(c), -next(iter(c.values())).deadline))
        victim = next(iter(crowd.values()))
        self.notes.dropped(victim.ip)
        self._close(victim)

    def _read(self, caller: _Caller) -> None:
        """What came on one connection: the handshake's next step, then a
        probe's answer or the join. Anything else closes this connection."""
        try:
            data = caller.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._refuse(caller, f"the connection failed ({exc.strerror or exc})")
            return
        if not data:
            self._refuse(caller, "the connection closed")
            return
        try:
            for msg in caller.line.feed(data):
                if caller.nonces is None:
                    reply, caller.nonces = handshake.challenge(self.secret, self.rank, msg)
                    caller.line.send(reply)
                else:
                    self._answer(caller, handshake.verify(self.secret, caller.nonces, msg))
                    return
        except (ProtocolError, OSError) as exc:
            self._refuse(caller, str(exc))

    def _answer(self, caller: _Caller, request: Message) -> None:
        """A request that proved the secret: a probe's answer, or the join."""
        self._close(caller, keep=True)
        line, body = caller.line, request.body
        if request.kind == "probe":
            reply = {"ready": {"rank": self.rank, "pid": os.getpid()}}
        elif body["rank"] != self.rank:
            reply = {"error": {"text": f"this process is rank {self.rank}, not {body['rank']}"}}
        elif (busy := ring_port_problem(body["ring"][self.rank][0])) is not None:
            reply = {"error": {"text": busy}}
        else:
            caller.sock.setblocking(True)
            keepalive(caller.sock)
            line.send({"joined": {"rank": self.rank, "pid": os.getpid()}})
            self.line, self.join = line, body
            return
        with contextlib.suppress(OSError):
            line.send(reply)
        line.close()

    def _refuse(self, caller: _Caller, why: str) -> None:
        self.notes.refused(caller.ip, why)
        with contextlib.suppress(OSError):
            caller.line.send({"error": {"text": f"refused: {why}"}})
        self._close(caller)

    def _close(self, caller: _Caller, keep: bool = False) -> None:
        """Forget a waiting connection, and close it unless ``keep``."""
        if self._waiting.pop(caller.sock, None) is not None:
            self._selector.unregister(caller.sock)
            same = self._by_ip[caller.ip]
            del same[caller.sock]
            if not same:
                del self._by_ip[caller.ip]
        if not keep:
            caller.line.close()

    def send(self, message: dict) -> None:
        with contextlib.suppress(OSError):
            self.line.send(message)

    def wait_ring(self) -> None:
        """Block until rank 0 says every rank has joined (the beat thread
        ends the process if rank 0 leaves first)."""
        self._ring.wait()

    def _beat(self) -> None:
        sock = self.line.sock
        why = "rank 0 left"
        while True:
            try:
                ready, _, _ = select.select([sock], [], [], BEAT_S)
                if ready:
                    data = sock.recv(4096)
                    if not data:
                        break
                    for m in self.line.feed(data):
                        wire.check(m, ZERO_SAYS)
                        self._ring.set()
                self.line.send({"beat": {}})
            except OSError:
                break
            except ProtocolError as exc:
                why = f"rank 0 sent {exc}"
                break
        print(f"specchat cluster: rank {self.rank}: {why}; exiting", flush=True)
        sys.stdout.flush()
        os._exit(0)  # the ring may be blocked in MLX; nothing is left to do here
