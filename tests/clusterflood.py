"""A stranger flooding a rank's control port, run as a process of its own
by tests/engine/test_cluster_security.py: ``python clusterflood.py PORT COUNT``.

It keeps COUNT connections to 127.0.0.1:PORT open, from several loopback
addresses (127.0.0.1 to 127.0.0.5, where this system lets a socket bind to
them), and opens a new one at once whenever the rank closes one. Each
connection plays one stranger, by its number:

* idle: connects and says nothing;
* slowloris: sends the start of a hello, one byte a second;
* stall: sends a valid hello, reads the rank's challenge, and says nothing more;
* churn: sends a line that is not JSON, and reconnects when refused.

Prints ``open N`` once N connections are up, then ``opened M`` every
second (the connections opened so far), until it is killed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import secrets
import selectors
import socket
import sys
import time

IDLE, SLOWLORIS, STALL, CHURN = range(4)


def addresses() -> list[str]:
    """The loopback addresses a socket here can connect from."""
    found = []
    for i in range(1, 6):
        ip = f"127.0.0.{i}"
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((ip, 0))
            found.append(ip)
    return found


def main(port: int, count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 64)), hard))
    ips = addresses()
    hello = json.dumps({"hello": {"nonce": secrets.token_hex(32)}}).encode() + b"\n"
    sel = selectors.DefaultSelector()
    slots: dict[int, socket.socket | None] = dict.fromkeys(range(count))
    sent: dict[int, int] = {}  # slowloris: bytes of the hello sent
    opened = 0
    reported = False
    last_tick = time.monotonic()

    def close(i: int) -> None:
        sock = slots[i]
        if sock is not None:
            sel.unregister(sock)
            sock.close()
            slots[i] = None

    def open_slot(i: int) -> bool:
        nonlocal opened
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((ips[i % len(ips)], 0))
            err = sock.connect_ex(("127.0.0.1", port))
        except OSError:
            sock.close()
            return False
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            return False
        slots[i] = sock
        sent[i] = 0
        opened += 1
        style = i % 4
        sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE
                                                  if style in (STALL, CHURN) else 0), i)
        return True

    while True:
        refused = False
        for i, sock in slots.items():
            if sock is None and not open_slot(i):
                refused = True
        if not reported and all(s is not None for s in slots.values()):
            print(f"open {count}", flush=True)
            reported = True
        for key, events in sel.select(0.01 if refused else 0.2):
            i, sock = key.data, key.fileobj
            if events & selectors.EVENT_WRITE:
                try:
                    sock.send(hello if i % 4 == STALL else b"x\n")
                except OSError:
                    close(i)
                    continue
                sel.modify(sock, selectors.EVENT_READ, i)
            if events & selectors.EVENT_READ:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    close(i)
        now = time.monotonic()
        if now - last_tick >= 1.0:
            last_tick = now
            for i, sock in slots.items():
                if sock is not None and i % 4 == SLOWLORIS and sent[i] < len(hello) - 1:
                    with contextlib.suppress(OSError):
                        sock.send(hello[sent[i]:sent[i] + 1])
                        sent[i] += 1
            print(f"opened {opened}", flush=True)
        if refused:
            time.sleep(0.01)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
