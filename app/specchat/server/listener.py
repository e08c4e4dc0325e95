"""Where the server listens, who may connect, and the uvicorn server itself.

By default the API listens on 127.0.0.1: only programs on this computer
can reach it, as with LM Studio or ``mlx_lm.server``; ``guard.py`` keeps
the web pages of this computer's browser out too. Listening anywhere else
lets other machines use the models, so it takes two deliberate acts:
``allow_remote`` (``--allow-remote``) and an API key that every request
must carry, read from ``SPECCHAT_API_KEY`` or a file (``--api-key-file``),
never from the command line, where ``ps`` shows it to every user of the
machine; without both the server does not start, and says why in one line.

The socket is bound here, before uvicorn runs, so a port in use is a
``ServerError`` at once (uvicorn would log it and exit the process), and
port 0 picks a free port (``LocalServer.port`` says which). The server
runs on a thread of its own with its own asyncio loop (``start``), so
neither the window's loop nor its lag slows HTTP, nor HTTP the window; or
in the calling thread (``serve_forever``), as ``specchat serve`` does.
Its connections are uvicorn's, with a deadline for each request's headers
(``connections.py``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from collections.abc import Collection
from pathlib import Path

import uvicorn

from specchat import records
from specchat.server import DEFAULT_HOST, DEFAULT_PORT, KEY_VARIABLE
from specchat.server.app import build_app
from specchat.server.body import MAX_BODY
from specchat.server.connections import DeadlineH11Protocol
from specchat.server.endpoints import base_url
from specchat.server.errors import ServerError
from specchat.server.guard import is_loopback
from specchat.server.service import ApiService

MAX_KEY_FILE_BYTES = 64 * 1024  # an API key is a line; a file far past that is not one


def api_key_from(path: Path | None) -> str | None:
    """The key in the file at ``path`` (its text, stripped), else
    ``SPECCHAT_API_KEY``, else none (blank counts as none there);
    ``ServerError`` if the file cannot be read or is empty, or the key is
    one no client can send (``_sendable``)."""
    if path is None:
        key = os.environ.get(KEY_VARIABLE, "").strip()
        return _sendable(key, KEY_VARIABLE) if key else None
    try:  # as every file SpecChat reads (a FIFO would hang the start), bounded
        key = records.read_file(path, MAX_KEY_FILE_BYTES).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError, records.BadRecord) as exc:
        reason = ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError)
                  else getattr(exc, "strerror", None) or exc)
        raise ServerError(f"Cannot read the API key file {path}: {reason}.") from None
    if not key:
        raise ServerError(f"The API key file {path} is empty.")
    return _sendable(key, f"The API key file {path}")


def _sendable(key: str, where: str) -> str:
    """``key`` if a client can send it: an HTTP header carries printable
    ASCII only (a key with an accented letter or a second line started a
    server no client could ever use: the OpenAI client cannot encode one,
    and Starlette reads header bytes as Latin-1). Never shown: it is a
    secret."""
    for i, c in enumerate(key, 1):
        if not " " <= c <= "~":
            what = "a line break or a control character" if c.isascii() else "not ASCII"
            raise ServerError(f"{where} holds a key an HTTP header cannot carry: its character "
                              f"{i} is {what}; use letters, digits and punctuation only.")
    return key


def check_bind(host: str, allow_remote: bool, api_key: str | None) -> None:
    """``ServerError`` unless listening on ``host`` is safe as asked: any
    loopback address; another one only with ``allow_remote`` and a key."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ServerError(f"Refusing to listen on {host}: other machines could use the models. "
                          f"Pass --allow-remote and an API key ({KEY_VARIABLE} or "
                          "--api-key-file) to allow it.")
    if api_key is None:
        raise ServerError(f"Refusing to listen on {host} without an API key: set {KEY_VARIABLE} "
                          "or pass --api-key-file, and send it as a bearer token.")


def bare(host: str) -> str:
    """``host`` as the socket functions take it: an IPv6 address without
    the brackets a URL puts around it (``[::1]`` is ``::1``)."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port)."""
    host = bare(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerError(f"Cannot listen on {host}: {exc.strerror}.") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerError(f"Port {port} on {host} is in use by another program: choose "
                              "another port.") from None
        raise ServerError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    sock.set_inheritable(True)
    return sock


class LocalServer:
    """The API on a socket: checked and bound at construction."""

    def __init__(self, service: ApiService, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, api_key: str | None = None,
                 allow_remote: bool = False, max_body: int = MAX_BODY,
                 cors_origins: Collection[str] = ()):
        """``cors_origins``: web origins (``values.origin``'s form) whose pages
        may call the API from a browser; none by default."""
        check_bind(host, allow_remote, api_key)
        self.service = service
        self.host = bare(host)
        self._sock = bind(host, port)
        app = build_app(service, api_key, max_body, cors_origins,
                        check_host=is_loopback(self.host))
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                ws="none", http=DeadlineH11Protocol,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        """The base URL clients use (OpenAI's ``base_url``)."""
        return base_url(self.host, self.port)

    async def _serve(self) -> None:
        self.service.attach(asyncio.get_running_loop())
        await self._server.serve(sockets=[self._sock])

    def serve_forever(self) -> None:
        """Serve in this thread until ``stop`` or, on the main thread, Ctrl+C
        (uvicorn finishes the requests in flight, then passes the signal on:
        here it is the normal way to stop, not an error)."""
        try:
            asyncio.run(self._serve())
        except KeyboardInterrupt:
            pass
        finally:
            self.service.cancel_all()
            self._sock.close()

    def start(self) -> None:
        """Serve on a thread of its own; ``stop`` ends it."""
        self._thread = threading.Thread(target=self.serve_forever, name="specchat-api",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel the running requests' engine jobs, close the connections
        and end the thread."""
        self.service.cancel_all()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        else:
            self._sock.close()
