"""Talking to the Hub over HTTP: a timeout on every call, Cancel that works
while a call is blocked, quiet retries, and what the server said in words.

Why not ``hf_hub_download``: it cannot do four things a pull needs. Its
partial file has a per-process random name, so a pull killed midway starts
over instead of resuming; its retries print warnings and sleep up to ~25 s
(HEAD with backoff) before "check your connection"; its chunk callback only
runs when bytes arrive, so Cancel does nothing while the server is silent;
and it checks only the size of what it downloaded, not the content. So the
requests are made here, with huggingface_hub's own pieces: its shared HTTP
client (``get_session``: proxies and certificates the user configured), its
headers (``build_hf_headers``: the token, only ever sent to the Hub: the
client drops it on the redirect to the CDN), its URLs and its error types
(``hf_raise_for_status``: repo not found, gated, bad revision).

Cancel and timeouts, and why this design: every blocking call (the model
info, opening a download, each read of its body) runs in a daemon worker
thread that only talks to the network and hands what it got over a queue.
The calling thread waits on that queue in ``POLL`` steps and calls ``tick``
at each step, which reports progress and raises ``DownloadCancelled`` once
the user's event is set, so Cancel takes effect within ~0.1 s even while the
server sends nothing. A worker left behind by a cancel stays blocked on its
socket until the read timeout ends it; since it never writes a file, it
cannot touch the cache after the pull returned. The alternative, short read
timeouts in a loop that checks the event, would turn a slow but alive
server into errors (a timed-out HTTP read cannot be continued, only
re-requested). The timeouts (connect ``CONNECT_TIMEOUT``, read
``READ_TIMEOUT``, both replaced by ``SPECCHAT_HUB_TIMEOUT`` seconds) bound
how long a silent server can hold a pull nobody cancels.

A connection that breaks mid-file is resumed with a Range request from the
last byte written, quietly, up to ``RETRIES`` times in a row without a new
byte. A timeout is not retried: a server silent for that long is reported.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, urlsplit

from specchat import values
from specchat.errors import SpecChatError
from specchat.library.errors import LibraryError
from specchat.library.units import size_text

if TYPE_CHECKING:
    from specchat.library.hub_ref import HubRef

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
POLL = 0.1  # seconds between ticks: how fast Cancel is noticed
RETRIES = 5  # reconnects in a row that bring no new byte before giving up
RETRY_PAUSE = 0.25
_QUEUE_CHUNKS = 8  # bytes in flight between the worker and the writer (chunks)
# The most of a model info answer that is read. The Hub's answer for a repo
# with thousands of files is well under 1 MB; a server that sends more (or
# never stops) is refused before it fills the memory.
INFO_MAX_BYTES = 8 * 1024 * 1024

Tick = Callable[[], None]


class HubAnswered(LibraryError):
    """The server answered, but not with what was asked for: an error
    status, or a web page (a captive portal, a proxy's login page)."""


def timeouts() -> tuple[float, float]:
    """(connect, read) seconds; ``SPECCHAT_HUB_TIMEOUT`` sets both."""
    raw = os.environ.get("SPECCHAT_HUB_TIMEOUT", "").strip()
    if raw:
        seconds = float(values.check("hub timeout", raw))
        return seconds, seconds
    return CONNECT_TIMEOUT, READ_TIMEOUT


def _timeout() -> tuple[float, float, float, float]:
    connect, read = timeouts()
    return (connect, read, read, connect)  # httpx: connect, read, write, pool


def endpoint() -> str:
    from huggingface_hub import constants

    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or constants.ENDPOINT


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(library_name="specchat")


# -- running blocking calls off the calling thread ------------------------------------


def _take(q: queue.Queue, tick: Tick):
    """The next item from the worker; ``tick()`` every POLL seconds meanwhile."""
    while True:
        try:
            return q.get(timeout=POLL)
        except queue.Empty:
            tick()


def call(fn: Callable[[], object], tick: Tick):
    """``fn()`` in a worker thread: its result or its exception, or whatever
    ``tick`` raises while waiting (the worker is then abandoned)."""
    out: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            out.put((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out.put((False, exc))

    threading.Thread(target=work, name="specchat-hub-call", daemon=True).start()
    ok, value = _take(out, tick)
    if ok:
        return value
    raise value


def pause(seconds: float, tick: Tick) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(POLL, max(0.0, end - time.monotonic())))
        tick()


# -- what a response says ----------------------------------------------------------------

_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.I | re.S)


def is_web_page(content_type: str | None, head: bytes) -> bool:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind in ("text/html", "application/xhtml+xml"):
        return True
    start = head.lstrip()[:15].lower()
    return start.startswith((b"<!doctype html", b"<html"))


def summary(body: bytes, content_type: str | None = None, error: str | None = None) -> str:
    """One short line from a body: the Hub's error message, a page's
    title, a JSON ``error`` field or the first line of text."""
    if error:
        return short(error)
    match = _TITLE.search(body[:65536])
    if match:
        return short(match.group(1).decode("utf-8", "replace"))
    text = body[:4096].decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("error"), str):
                return short(data["error"])
        except ValueError:
            pass
    if is_web_page(content_type, body):
        text = re.sub(r"<[^>]*>", " ", text)
    return short(next((line for line in text.splitlines() if line.strip()), ""))


def short(text: str) -> str:
    """``text`` on one line, cut to at most 100 characters."""
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


def said(response, body: bytes) -> str:
    """What an error response says: ``503 Service Unavailable ("upstream
    connect error")``, the detail from the Hub's X-Error-Message or ``body``."""
    detail = summary(body, response.headers.get("Content-Type"),
                     response.headers.get("X-Error-Message"))
    status, reason = response.status_code, response.reason_phrase
    words = f"{status} {reason}".strip() if reason else str(status)
    return f'{words} ("{detail}")' if detail else words


def host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def web_page_message(url: str, body: bytes, content_type: str | None, wanted: str) -> str:
    title = summary(body, content_type)
    shown = f' ("{title}")' if title else ""
    return (f"{host(url)} sent a web page{shown} instead of {wanted}: a captive portal "
            "(hotel or airport Wi-Fi login) or a proxy is in the way. Open a browser to log in, "
            "or check the proxy settings, then pull again.")


# -- model info --------------------------------------------------------------------------


def model_info(repo: str, revision: str | None, tick: Tick):
    """The Hub's ``model_info(files_metadata=True)``, with timeouts and Cancel.
    Raises huggingface_hub's errors for a missing repo, a gated repo or a
    bad revision, ``HubAnswered`` for anything that is not model info, and
    the HTTP client's errors for a network that fails."""
    from huggingface_hub.hf_api import ModelInfo
    from huggingface_hub.utils import get_session, hf_raise_for_status

    url = f"{endpoint()}/api/models/{repo}"
    if revision:
        url += f"/revision/{quote(revision, safe='')}"
    headers = _headers()

    def fetch():
        with get_session().stream("GET", url, params={"blobs": "true"}, headers=headers,
                                  timeout=_timeout(), follow_redirects=True) as streamed:
            body = bytearray()
            for chunk in streamed.iter_bytes():
                body += chunk
                if len(body) > INFO_MAX_BYTES:
                    return streamed, None
            return streamed, bytes(body)

    streamed, body = call(fetch, tick)
    if body is None:
        raise HubAnswered(
            f"{host(str(streamed.url))} sent more than {size_text(INFO_MAX_BYTES)} when asked about "
            f"{repo}, far more than model information takes; SpecChat stopped reading. Is "
            "HF_ENDPOINT right?")
    response = _read(streamed, body)
    content_type = response.headers.get("Content-Type")
    if response.status_code == 401 or (response.status_code >= 400
                                        and response.headers.get("X-Error-Code")):
        hf_raise_for_status(response)  # the Hub's own verdict: not found, gated, revision
    if response.status_code >= 400:
        raise HubAnswered(f"{host(url)} answered {said(response, body)} when asked about {repo}.")
    if is_web_page(content_type, body):
        raise HubAnswered(web_page_message(str(response.url), body, content_type,
                                           f"the model information for {repo}"))
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or "siblings" not in data:
        raise HubAnswered(
            f"{host(url)} answered something that is not model information for {repo} "
            f'("{summary(body, content_type)}"). Is HF_ENDPOINT right?')
    return ModelInfo(**data)


def _read(streamed, body: bytes):
    """A response with its body read (what ``hf_raise_for_status`` and
    ``json()`` need), from a streamed one whose body was read with a cap."""
    extensions = {k: v for k, v in streamed.extensions.items() if k == "reason_phrase"}
    return type(streamed)(streamed.status_code, headers=streamed.headers, content=body,
                          request=streamed.request, extensions=extensions)


def file_url(repo: str, commit: str, filename: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, filename, revision=commit, endpoint=endpoint())


# -- downloading one file -----------------------------------------------------------------


class Sink(Protocol):
    """Where a download's bytes go: the partial file (and its hash)."""

    offset: int  # bytes already there: the next request asks for the rest

    def write(self, data: bytes) -> None: ...

    def restart(self) -> None:
        """Drop what is there: the server sends the file from its first byte."""


_RETRY = {"ReadError", "RemoteProtocolError", "ConnectError", "WriteError", "CloseError",
          "_EndedEarly"}


class _EndedEarly(Exception):
    """The body ended before the file's size without an error."""


def kinds(exc: BaseException) -> set[str]:
    """The names of an exception's classes: how errors are told apart across
    huggingface_hub's HTTP stacks, whose classes cannot all be imported."""
    return {c.__name__ for c in type(exc).__mro__}


def download(url: str, filename: str, size: int | None, sink: Sink, tick: Tick) -> None:
    """Fetch ``url`` into ``sink`` from ``sink.offset`` on (a Range request
    when it is not 0), reconnecting quietly when the connection breaks."""
    failures = 0
    restarted = False
    while True:
        start = sink.offset
        try:
            outcome = _request(url, filename, sink, tick, start)
            if outcome == "again" and not restarted:  # the partial was longer than the file
                restarted = True
                continue
            if size is not None and sink.offset < size:
                raise _EndedEarly(f"{sink.offset} of {size} bytes")
            return
        except Exception as exc:
            if not (kinds(exc) & _RETRY):
                raise
            failures = 0 if sink.offset > start else failures + 1
            if failures > RETRIES:
                raise
            pause(RETRY_PAUSE, tick)


def _request(url: str, filename: str, sink: Sink, tick: Tick, start: int) -> str:
    from huggingface_hub.utils import get_session

    headers = {**_headers(), "Accept-Encoding": "identity"}
    if start:
        headers["Range"] = f"bytes={start}-"
    q: queue.Queue = queue.Queue(maxsize=_QUEUE_CHUNKS)
    stop = threading.Event()

    def put(item) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=POLL)
                return
            except queue.Full:
                continue

    def pump() -> None:
        try:
            with get_session().stream("GET", url, headers=headers, timeout=_timeout(),
                                      follow_redirects=True) as response:
                put(("head", response))
                for chunk in response.iter_bytes():
                    if stop.is_set():
                        return
                    if chunk:
                        put(("data", chunk))
            put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            put(("error", exc))

    threading.Thread(target=pump, name="specchat-hub-download", daemon=True).start()
    try:
        kind, value = _take(q, tick)
        if kind == "error":
            raise value
        response = value
        status = response.status_code
        content_type = response.headers.get("Content-Type")
        if status == 416 and start:
            sink.restart()
            return "again"
        if status >= 400:
            body = _first_bytes(q, tick)
            raise HubAnswered(f"{host(str(response.url))} answered {said(response, body)} for "
                              f"{filename}.")
        if start and status == 200:  # Range ignored: the whole file follows
            sink.restart()
        first = True
        while True:
            kind, value = _take(q, tick)
            if kind == "end":
                return "done"
            if kind == "error":
                raise value
            if first and not filename.lower().endswith((".html", ".htm")) \
                    and is_web_page(content_type, value):
                raise HubAnswered(web_page_message(str(response.url), value, content_type,
                                                   filename))
            first = False
            sink.write(value)
    finally:
        stop.set()


def _first_bytes(q: queue.Queue, tick: Tick, limit: int = 65536) -> bytes:
    """Up to ``limit`` bytes of an error body (to say what the server said)."""
    got = b""
    while len(got) < limit:
        kind, value = _take(q, tick)
        if kind != "data":
            break
        got += value
    return got


# -- what went wrong, in words ----------------------------------------------------------

class HubUnreachable(LibraryError):
    """The Hub could not be reached or did not answer (no network, DNS,
    firewall, Hub down): an installed copy may be used instead."""


# Exception class names, across huggingface_hub's HTTP stacks (requests in
# 0.x, httpx in 1.x, httpx2 in 2.x), that mean "no connection at all" or "the
# connection broke midway".
_UNREACHABLE = {"ConnectError", "ConnectTimeout", "ConnectionError", "ProxyError",
                "OfflineModeIsEnabled", "PoolTimeout"}
_TIMEOUT = {"ReadTimeout", "WriteTimeout", "TimeoutException", "Timeout"}
_BROKEN = {"ReadError", "RemoteProtocolError", "ChunkedEncodingError", "WriteError",
           "NetworkError", "TransportError", "_EndedEarly"}


def translate(exc: Exception, hub: HubRef, file: str | None = None) -> SpecChatError:
    """One sentence a person can act on, for whatever the client raised
    (``file``: the file being downloaded, None while asking about the repo);
    what already is one is returned as it is."""
    from huggingface_hub import errors

    if isinstance(exc, SpecChatError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        return LibraryError(
            f"{hub.ref} is gated: accept its terms at https://huggingface.co/{hub.repo} and log "
            "in with `hf auth login` (SpecChat uses the token huggingface_hub saves).")
    if isinstance(exc, errors.RevisionNotFoundError):
        return LibraryError(f"{hub.ref}: revision {hub.revision!r} does not exist on the Hub.")
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(exc, errors.RepositoryNotFoundError) or (
            isinstance(exc, errors.HfHubHTTPError) and status == 401):
        return LibraryError(
            f"{hub.ref} was not found on the Hugging Face Hub. Check the name (it is "
            "case-sensitive, e.g. hf:mlx-community/Qwen2.5-0.5B-Instruct-4bit); private repos "
            "need `hf auth login`.")
    found = kinds(exc)
    where = endpoint()
    _connect, read = timeouts()
    if found & _UNREACHABLE:
        return HubUnreachable(
            f"Could not reach the Hugging Face Hub at {where} ({type(exc).__name__}) for "
            f"{hub.ref}. Check the connection; finished files are kept for the next pull.")
    if found & _TIMEOUT:
        if file is None:
            return HubUnreachable(
                f"The Hugging Face Hub at {where} did not answer within {read:g} s about "
                f"{hub.ref} (SPECCHAT_HUB_TIMEOUT sets how long to wait).")
        return LibraryError(
            f"The Hub stopped sending {file} of {hub.ref}: nothing arrived for {read:g} s "
            "(SPECCHAT_HUB_TIMEOUT sets how long to wait). Finished files are kept; run the "
            "pull again to continue.")
    if found & _BROKEN:
        return LibraryError(
            f"The connection to the Hub broke while downloading {file or hub.ref} "
            f"({type(exc).__name__}). Finished files are kept; run the pull again to continue.")
    if isinstance(exc, errors.HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return LibraryError(f"The Hugging Face Hub answered {status} for {hub.ref}: {first}")
    if isinstance(exc, OSError):
        return LibraryError(
            f"Download of {hub.ref} failed ({exc}). Finished files are kept; run the pull "
            "again to continue.")
    return LibraryError(f"Download of {hub.ref} failed: {type(exc).__name__}: {exc}")
