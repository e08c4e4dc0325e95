"""Helpers for the cluster tests: free ports, a process's output read while
it runs, a real ``specchat cluster rank`` process, and a stranger's raw
connection to a rank's control port."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_base(count: int) -> int:
    """A port p with p .. p+count-1 all free on 127.0.0.1."""
    for _ in range(50):
        base = random.randint(20000, 60000)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


class Lines:
    """A process's stdout, read on a thread, searchable while it runs."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, text: str, after: int = 0, timeout: float = 60) -> tuple[int, str]:
        """(index, line) of the first line from ``after`` on containing ``text``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if text in self.lines[i]:
                        return i, self.lines[i]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {text!r} in:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


def start_rank(rank: int, port: int, key: bytes, tmp: Path | None = None
               ) -> tuple[subprocess.Popen, Lines]:
    """``specchat cluster rank`` on 127.0.0.1:``port``, handed ``key`` on
    stdin as ``cluster start`` does (and ``tmp`` as its TMPDIR), once it
    says it waits for rank 0."""
    env = dict(os.environ)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    proc = subprocess.Popen([sys.executable, "-m", "specchat", "cluster", "rank", "--rank",
                             str(rank), "--listen", f"127.0.0.1:{port}"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    proc.stdin.write(key.hex() + "\n")
    proc.stdin.close()
    out = Lines(proc)
    out.wait_for("waiting for rank 0")
    return proc, out


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    proc.stdout.close()


def exchange(port: int, *sends: bytes, timeout: float = 10) -> bytes:
    """Connect to 127.0.0.1:``port``, send each of ``sends`` after reading
    one line (the first at once), then read until the other end closes;
    everything received. A reset counts as a close."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for i, data in enumerate(sends):
                if i:
                    while got.count(b"\n") < i:
                        chunk = sock.recv(65536)
                        if not chunk:
                            return got
                        got += chunk
                sock.sendall(data)
            while chunk := sock.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return got


class Trap:
    """A listening socket on 127.0.0.1 that records who connects: an
    address a stranger names (as rank 0's ring port, or as a rank's control
    port in a hostfile), to see that nothing dials it."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port: int = self.server.getsockname()[1]
        self.calls: list[tuple] = []
        self._done = threading.Event()
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        while not self._done.is_set():
            try:
                conn, addr = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.calls.append(addr)
            conn.close()

    def __enter__(self) -> Trap:
        return self

    def __exit__(self, *_exc) -> None:
        self._done.set()
        self.server.close()
