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
goes unnoticed. A rank takes each connection on a thread of its own, with
a deadline, so a stranger who connects and says nothing, or something
that is not a message, or without the secret, loses that connection and
holds up nobody. Nothing here calls MLX.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable

from specchat.engine.distributed import handshake, wire
from specchat.engine.distributed.hostfile import ClusterSpec, Rank, parse_address
from specchat.engine.distributed.wire import Line, Message, ProtocolError
from specchat.engine.errors import EngineError

BEAT_S = 1.0
SILENCE_S = 15.0  # no heartbeat for this long: the rank is lost
CONNECT_S = 5.0  # a handshake's deadline, on both ends
PENDING = 32  # connections a rank takes at once before rank 0 has joined
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
            sock = self._dial(peer)
            keepalive(sock)
            line = Line(sock)
            join = {"cluster": spec.name, "rank": peer.rank, "size": spec.size,
                    "ring": spec.ring_hostfile(), "model": spec.model,
                    "layers": list(spec.layers) if spec.layers else None}
            where = f"Rank {peer.rank} of cluster {spec.name} ({peer.ip}:{peer.control_port})"
            try:
                reply = handshake.ask(line, self.secret, peer.rank, "join", join, CONNECT_S)
            except handshake.NotOurs as exc:
                line.close()
                self.close()
                raise EngineError(f"The process at {peer.ip}:{peer.control_port} {exc}: "
                                  f"restart the ranks with `specchat cluster start {spec.name}`.") from None
            except (ProtocolError, OSError) as exc:
                line.close()
                self.close()
                raise EngineError(f"{where} did not answer as a SpecChat rank ({exc}).") from None
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


def probe(spec: ClusterSpec, secret: bytes, timeout: float = 1.0) -> tuple[int, str] | None:
    """The first of ranks 1..N-1 that is not waiting for rank 0, with why in
    words; None when all of them are. A probe is a connection a rank answers
    and closes without joining (after the handshake: "ready" comes from a
    rank of this cluster), so asking costs the ranks nothing (a rank
    serving rank 0 has closed its port and counts as not waiting). Each rank
    takes up to twice ``timeout`` (connecting, then the answers), plus the
    resolver's time for a host given by name."""
    for peer in spec.ranks[1:]:
        try:
            sock = socket.create_connection(peer.control_address, timeout=timeout)
        except (OSError, OverflowError, ValueError) as exc:  # refused, unreachable, bad port
            why = getattr(exc, "strerror", None) or exc
            return peer.rank, (f"rank {peer.rank} is not running at {peer.ip}:{peer.control_port} "
                               f"({why}): start it with `specchat cluster start {spec.name}`")
        line = Line(sock)
        try:
            reply = handshake.ask(line, secret, peer.rank, "probe", {}, timeout)
        except handshake.NotOurs as exc:
            return peer.rank, (f"the process at {peer.ip}:{peer.control_port} {exc}: restart "
                               f"the ranks with `specchat cluster start {spec.name}`")
        except (ProtocolError, OSError):
            reply = None
        finally:
            line.close()
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


class RankChannel:
    """A non-zero rank's end: wait for rank 0 (the first connection that
    proves the secret and asks to join), answer it, beat, and leave the
    process when rank 0 goes away."""

    def __init__(self, rank: int, host: str, port: int, secret: bytes,
                 say: Callable[[str], None] = lambda _m: None):
        self.rank = rank
        self.secret = secret
        self.say = say
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.line: Line | None = None
        self.join: dict | None = None
        self._joined = threading.Event()
        self._ring = threading.Event()
        self._lock = threading.Lock()
        self._pending = threading.BoundedSemaphore(PENDING)

    def accept(self) -> dict:
        """Block until rank 0 joins; its join message (checked: wire.KINDS)."""
        self.listener.settimeout(0.2)
        while not self._joined.is_set():
            try:
                conn, addr = self.listener.accept()
            except TimeoutError:
                continue
            if not self._pending.acquire(blocking=False):  # a crowd: not rank 0 alone
                conn.close()
                continue
            threading.Thread(target=self._take, args=(conn, addr), daemon=True,
                             name="specchat-rank-handshake").start()
        self.listener.close()
        threading.Thread(target=self._beat, name="specchat-rank-beat", daemon=True).start()
        return self.join

    def _take(self, conn: socket.socket, addr) -> None:
        """One connection: the handshake, then a probe's answer or the join.
        Anything else closes this connection only."""
        line = Line(conn)
        try:
            keepalive(conn)
            request = handshake.answer(line, self.secret, self.rank, CONNECT_S)
            if request.kind == "probe":
                line.send({"ready": {"rank": self.rank, "pid": os.getpid()}})
            elif request.body["rank"] != self.rank:
                line.send({"error": {"text": f"this process is rank {self.rank}, "
                                             f"not {request.body['rank']}"}})
            elif (busy := ring_port_problem(request.body["ring"][self.rank][0])) is not None:
                line.send({"error": {"text": busy}})
            else:
                with self._lock:
                    if self._joined.is_set():
                        line.send({"error": {"text": "another rank 0 joined first"}})
                    else:
                        line.send({"joined": {"rank": self.rank, "pid": os.getpid()}})
                        conn.settimeout(None)
                        self.line, self.join = line, request.body
                        self._joined.set()
                        return
        except (ProtocolError, OSError) as exc:
            self.say(f"refused a connection from {addr[0]}: {exc}")
            with contextlib.suppress(OSError):
                line.send({"error": {"text": f"refused: {exc}"}})
        finally:
            self._pending.release()
        line.close()

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
