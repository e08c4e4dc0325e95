"""Who may talk to the API: a program on this computer, not a web page.

Listening on 127.0.0.1 keeps other machines out, but not the browser on
this one: any page can send requests to 127.0.0.1, and two kinds matter.

- **DNS rebinding.** A page at ``attacker.example`` makes its own name
  resolve to 127.0.0.1; its requests then reach this server as
  same-origin requests the page may read, with ``Host: attacker.example``.
  So the Host must be a loopback name or address with this server's port
  (as a local client sends it); anything else gets 421 before any work.
  (Ollama's CVE-2024-28224 and vLLM's GHSA-rx2h-752g-w9w4 are this.)
- **Cross-site requests.** A page of another origin can POST without asking
  (a form, a ``text/plain`` fetch) and make the server generate, even if it
  cannot read the reply. Browsers name the page in ``Origin``; a request
  with an Origin other than this server's own loopback origin, or one the
  user listed for CORS, gets 403 (``null`` too: sandboxed frames and files
  send it). The app also reads only ``application/json`` bodies
  (``app.py``), a type no page can send to another origin without a
  preflight, which this server answers only for listed origins.

CORS (``Cors``) is Starlette's, for the origins the user listed and for a
request's own origin: a browser sends no preflight to a page's own origin,
but one that arrives is answered, not refused (a page calling its own
origin could read the reply anyway).

Programs that are not browsers send no Origin and a Host of this computer,
so editors, scripts and the ``openai`` client pass unchanged. When the user
has the server listen on another address (``--allow-remote``, which needs
an API key), clients name this machine as they reach it, so the Host is
not checked there: the key, which no page knows, is what keeps pages out.
"""

from __future__ import annotations

from collections.abc import Collection
from contextvars import ContextVar
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specchat.server.errors import ApiError
from specchat.values import is_loopback


def split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` for IPv6) as (host without brackets,
    port or None); None if it is not that shape."""
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        host, colon, port = value.partition(":")
        port = port if colon else None
    if port is not None and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return (host, int(port) if port is not None else None) if host else None


def local_host(value: str, port: int | None) -> bool:
    """A ``Host`` header a client on this computer sends to ``port``."""
    parts = split_host(value.strip())
    if parts is None:
        return False
    host, given = parts
    return is_loopback(host) and (given if given is not None else 80) == port


def own_origin(value: str, port: int | None) -> bool:
    """The server's own origin: ``http://`` a loopback host and ``port``."""
    try:
        url = urlsplit(value)
        given = url.port
    except ValueError:
        return False
    return (url.scheme == "http" and url.hostname is not None and is_loopback(url.hostname)
            and (given if given is not None else 80) == port
            and value == f"http://{url.netloc}" and "@" not in url.netloc)


class LocalOnly:
    """ASGI middleware: refuse a foreign Host (421) or Origin (403) before
    the request reaches the app, in the error shape of the API asked
    (``ApiError.answer``)."""

    def __init__(self, app: ASGIApp, check_host: bool = True,
                 allowed_origins: Collection[str] = ()):
        self.app = app
        self.check_host = check_host
        self.allowed_origins = frozenset(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            server = scope.get("server") or (None, None)
            refusal = self.refusal(Headers(scope=scope), server[1])
            if refusal is not None:
                status, body = refusal.answer(scope.get("path", ""))
                await JSONResponse(body, status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, port: int | None) -> ApiError | None:
        hosts = headers.getlist("host")
        if self.check_host and (len(hosts) != 1 or not local_host(hosts[0], port)):
            return ApiError(421, "This server answers requests for 127.0.0.1, localhost or "
                                 f"[::1] on port {port} only (the Host header named another "
                                 "name).", code="host_not_allowed")
        for origin in headers.getlist("origin"):
            if origin not in self.allowed_origins and not own_origin(origin, port):
                return ApiError(403, f"Requests from web pages of {origin[:100]} are not "
                                     "allowed; list the origin in the server's allowed origins "
                                     "(--cors-origin) to allow it.", code="origin_not_allowed")
        return None


def same_origin(origin: str, host: str, port: int | None) -> bool:
    """``origin`` is the server's own (``own_origin``) and names the very
    host and port the request was sent to (its ``Host``): a page calling
    its own origin, not another loopback name of the same port."""
    theirs = split_host(host.strip())
    if not own_origin(origin, port) or theirs is None:
        return False
    ours = split_host(origin.partition("://")[2])
    return ours is not None and _normal(ours) == _normal(theirs)


def _normal(parts: tuple[str, int | None]) -> tuple[str, int]:
    host, port = parts
    return host.lower(), 80 if port is None else port


# The Host and the port of the request the CORS middleware is answering:
# Starlette asks ``is_allowed_origin`` with the origin alone.
_REQUEST: ContextVar[tuple[str, int | None]] = ContextVar("specchat_cors_request",
                                                          default=("", None))


class Cors(CORSMiddleware):
    """Starlette's CORS middleware, which allows the listed origins, also
    allowing a request's own origin (``same_origin``): its preflight gets
    the answer a listed origin's gets rather than a 400."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        server = scope.get("server") or (None, None)
        token = _REQUEST.set((Headers(scope=scope).get("host", ""), server[1]))
        try:
            await super().__call__(scope, receive, send)
        finally:
            _REQUEST.reset(token)

    def is_allowed_origin(self, origin: str) -> bool:
        return super().is_allowed_origin(origin) or same_origin(origin, *_REQUEST.get())
