"""The HTTP side: OpenAI's endpoints and Anthropic's Messages API
(``anthropic.py``) on Starlette.

Why Starlette (with uvicorn): it is the small, well-kept ASGI toolkit that
FastAPI itself is built on, with streaming responses that notice a client
going away, and it needs no request models: the bodies are checked by
``protocol.py`` against ``specchat.values``, the table every other part of
SpecChat checks against, rather than by a second set of pydantic rules.

Before a request reaches the endpoints, ``guard.LocalOnly`` refuses a
foreign Host or Origin, and Starlette's CORS middleware answers the origins
the user listed (none by default) and a request's own (``guard.Cors``). A
client that goes away while sending its body is one quiet log line, not an
error.

A request is read (``body.read_json``: JSON only, bounded in size, time
and nesting), checked, and run as a task
(``ApiService.run``); a watcher cancels that task when the client
disconnects, which cancels its engine job. A streamed reply sends its
headers only once the first step is in, so an error before it (a prompt
too long, no model) still gets its HTTP status; one after it arrives as an
``error`` event, which OpenAI's clients raise.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Collection
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specchat.engine.events import GenerationResult, StepEvent
from specchat.server import anthropic, endpoints, protocol, responses
from specchat.server.body import MAX_BODY, read_json
from specchat.server.endpoints import BASE_PATH, ENDPOINTS
from specchat.server.errors import ApiError
from specchat.server.guard import Cors, LocalOnly
from specchat.server.service import ApiService

log = logging.getLogger("specchat.server")

_GONE = object()  # the client went away
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def build_app(service: ApiService, api_key: str | None = None, max_body: int = MAX_BODY,
              cors_origins: Collection[str] = (), check_host: bool = True) -> Starlette:
    """The ASGI app over ``service``; with ``api_key``, every request must
    carry ``Authorization: Bearer <api_key>``. ``cors_origins``: the web
    origins (``values.origin``'s form) allowed to call it from a browser;
    ``check_host``: refuse a Host that is not this computer (off only when
    listening for other machines, behind a key)."""
    started = int(time.time())

    def authorize(request: Request) -> None:
        """The key as OpenAI's clients send it (a bearer token) or as
        Anthropic's do (``x-api-key``), compared in constant time."""
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        sent = [token.strip()] if scheme.lower() == "bearer" else []
        sent += request.headers.getlist("x-api-key")
        if not any(hmac.compare_digest(key.encode(), api_key.encode()) for key in sent):
            raise ApiError(401, "Incorrect or missing API key: send it as "
                                "'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                           code="invalid_api_key")

    async def models(request: Request) -> Response:
        authorize(request)
        served = service.served
        data = [] if served is None else [{
            "id": served.model, "object": "model", "created": started, "owned_by": "specchat",
            "speculative": {"mode": served.mode, "draft": served.draft}}]
        return JSONResponse({"object": "list", "data": data})

    def completions(kind: protocol.Kind):
        async def complete(request: Request) -> Response:
            authorize(request)
            body = await read_json(request, max_body)
            req = protocol.parse(kind, body, service.max_tokens_cap)
            # 404 or 503 now, and what the model cannot do, before the request waits its turn
            protocol.check_format(req, service.model(req.model).chat)
            return await _answer(request, service, req, partial(protocol.response, req),
                                 partial(protocol.Chunks, req))

        return complete

    async def respond(request: Request) -> Response:
        """OpenAI's Responses API (``responses.py``): the same request to
        the engine, answered in its items and typed events."""
        authorize(request)
        asked = responses.parse(await read_json(request, max_body), service.max_tokens_cap)
        responses.check_format(asked, service.model(asked.request.model).chat)
        return await _answer(request, service, asked.request, partial(responses.response, asked),
                             partial(responses.Events, asked))

    async def messages(request: Request) -> Response:
        """Anthropic's Messages API (``anthropic.py``): the same request to
        the engine, answered in its content blocks and events."""
        authorize(request)
        asked = anthropic.parse(await read_json(request, max_body), service.max_tokens_cap)
        req = anthropic.check_format(asked, service.model(asked.api.model).chat)
        return await _answer(request, service, req,
                             lambda result, model: anthropic.Reply(asked, model).body(result),
                             partial(anthropic.Reply, asked))

    async def count_tokens(request: Request) -> Response:
        authorize(request)
        asked = anthropic.parse(await read_json(request, max_body), counting=True)
        req = anthropic.check_format(asked, service.model(asked.api.model).chat)
        return JSONResponse({"input_tokens": await service.count(req)})

    # Each endpoint of the table (endpoints.py: what Settings lists) by its path.
    handlers = {f"{BASE_PATH}/models": models,
                f"{BASE_PATH}/chat/completions": completions("chat"),
                f"{BASE_PATH}/completions": completions("completion"),
                f"{BASE_PATH}/responses": respond,
                f"{BASE_PATH}/messages": messages,
                f"{BASE_PATH}/messages/count_tokens": count_tokens}
    if handlers.keys() != {e.path for e in ENDPOINTS}:
        raise RuntimeError("the server's handlers and its endpoint table differ")
    return Starlette(
        routes=[Route(e.path, handlers[e.path], methods=[e.method]) for e in ENDPOINTS],
        middleware=[
            Middleware(LocalOnly, check_host=check_host, allowed_origins=cors_origins),
            # Only listed origins reach this with an Origin other than the
            # server's own; CORS for those and for a request's own origin,
            # any header they ask for (OpenAI's SDKs send their own), no
            # cookies, and Chrome's private network access for a listed
            # public site.
            Middleware(Cors, allow_origins=list(cors_origins),
                       allow_methods=["GET", "POST"], allow_headers=["*"],
                       allow_private_network=True)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                            ClientDisconnect: _client_gone, Exception: _internal_error},
    )


async def _answer(request: Request, service: ApiService, req: protocol.ApiRequest,
                  whole: Callable[[GenerationResult, str], dict],
                  stream: Callable[[str], protocol.Chunks | responses.Events | anthropic.Reply]
                  ) -> Response:
    """Run the request; answer as one JSON body (``whole(result, model)``)
    or as a stream (``stream(model)``: its events from the steps, framed as
    server-sent events), naming the model that runs it (in the app, the
    pair may change while it waits)."""
    events: asyncio.Queue = asyncio.Queue()

    async def produce() -> None:
        try:
            events.put_nowait(await service.run(req, events.put_nowait))
        except asyncio.CancelledError:
            events.put_nowait(_GONE)
            raise
        except ApiError as exc:
            events.put_nowait(exc)
        except Exception as exc:  # noqa: BLE001 - a bug: answered as one, and logged
            log.exception("an API request failed")
            events.put_nowait(ApiError(500, f"Internal error (a bug in SpecChat, please "
                                            f"report it): {type(exc).__name__}: {exc}"))

    task = asyncio.create_task(produce())
    watcher = asyncio.create_task(_disconnected(request))
    watcher.add_done_callback(lambda _w: task.cancel())
    first = await events.get()
    model = service.served.model if service.served is not None else req.model
    if isinstance(first, ApiError) or first is _GONE or not req.stream:
        try:
            while not isinstance(first, GenerationResult | ApiError) and first is not _GONE:
                first = await events.get()  # the steps of a reply that does not stream
        finally:
            _stop(task, watcher)
        if first is _GONE:
            return Response(status_code=499)  # nobody reads it
        if isinstance(first, ApiError):
            return _api_error(request, first)
        return JSONResponse(whole(first, model))
    return StreamingResponse(_sse(stream(model), first, events, task, watcher),
                             media_type="text/event-stream", headers=_SSE_HEADERS)


async def _sse(chunks: protocol.Chunks | responses.Events | anthropic.Reply, first,
               events: asyncio.Queue,
               task: asyncio.Task, watcher: asyncio.Task):
    """The stream's events, from the first step to the last (and the
    closing line its API ends with)."""
    item = first
    try:
        for c in chunks.start():
            yield chunks.frame(c)
        while True:
            if isinstance(item, StepEvent):
                for c in chunks.step(item):
                    yield chunks.frame(c)
            elif isinstance(item, GenerationResult):
                for c in chunks.end(item):
                    yield chunks.frame(c)
                break
            elif isinstance(item, ApiError):
                for c in chunks.error(item):
                    yield chunks.frame(c)
                break
            else:  # the client went away
                return
            item = await events.get()
        if chunks.closing:
            yield chunks.closing
    finally:
        _stop(task, watcher)  # a client gone mid-stream ends up here: its job stops


def _stop(task: asyncio.Task, watcher: asyncio.Task) -> None:
    watcher.cancel()
    task.cancel()  # a no-op once it is done


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read by now,
    so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _api_error(request: Request, exc: ApiError) -> Response:
    """A refusal in the shape of the API asked (``ApiError.answer``)."""
    status, body = exc.answer(request.url.path)
    return JSONResponse(body, status_code=status)


def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such path, wrong method), in the shape
    of the API asked."""
    message = (f"There is no {request.method} {request.url.path} here; this server has "
               f"{endpoints.listed()}."
               if exc.status_code in (404, 405) else str(exc.detail))
    return _api_error(request, ApiError(exc.status_code, message))


def _client_gone(_request: Request, _exc: ClientDisconnect) -> Response:
    """The client closed its connection before its whole body arrived: no
    one reads an answer, and nothing went wrong here."""
    log.info("a client disconnected before sending its whole request")
    return Response(status_code=499)


def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("an API request failed: %s: %s", type(exc).__name__, exc)
    return _api_error(request, ApiError(500, f"Internal error (a bug in SpecChat, please "
                                             f"report it): {type(exc).__name__}"))
