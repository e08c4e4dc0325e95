"""A request's body: JSON only, bounded before it is parsed.

A POST must say its body is JSON (``Content-Type: application/json``): no
web page can send that type to another origin without a CORS preflight,
which the server answers only for the origins the user listed, so a page's
plain form or ``text/plain`` fetch never makes it generate. The body is
then bounded in bytes (the announced length, then as it streams in), in
time, and in nesting depth, all before ``json.loads`` sees it.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request

from specchat import records
from specchat.server.errors import ApiError

MAX_BODY = 8 * 1024 * 1024  # bytes; a long file pasted into a prompt fits easily
MAX_DEPTH = 64  # JSON nesting; OpenAI's bodies nest a few levels (a tool's schema a dozen)
BODY_SECONDS = 60.0  # to send a whole body: 8 MiB at about 1 Mbit/s


async def read_json(request: Request, limit: int = MAX_BODY) -> object:
    """The request's JSON body, or ApiError: 415 (not declared JSON), 413
    (over ``limit`` bytes), 408 (not all there within ``BODY_SECONDS``), 400
    (not UTF-8, nested deeper than ``MAX_DEPTH``, not JSON)."""
    require_json(request)
    seconds = BODY_SECONDS
    too_large = ApiError(413, f"The request body is larger than this server takes "
                              f"({limit:,} bytes).", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
    except TimeoutError:
        raise ApiError(408, f"The request body did not arrive within {seconds:g} seconds.",
                       code="request_timeout") from None
    data = bytes(body)
    try:
        text = data.decode("utf-8")  # JSON between programs is UTF-8 (RFC 8259)
    except UnicodeDecodeError:
        raise ApiError(400, "The request body is not UTF-8 text, as JSON must be.") from None
    check_nesting(data)
    try:
        return json.loads(text)
    except ValueError:
        raise ApiError(400, "The request body is not valid JSON.") from None


def require_json(request: Request) -> None:
    """415 unless the body is declared JSON (any parameters, any case)."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, "Send the request body as JSON, with the header "
                            "'Content-Type: application/json'.", code="unsupported_media_type")


def check_nesting(body: bytes, limit: int = MAX_DEPTH) -> None:
    """400 if ``body`` nests arrays and objects deeper than ``limit``,
    counted before it is parsed (``records.nested_deeper``), naming the
    field where it does (``records.deep_path``)."""
    if records.nested_deeper(body, limit):
        where = records.deep_path(body, limit)
        raise ApiError(400, f"The request body nests JSON deeper than {limit} levels"
                            + (f" (at {where})." if where else "."), where or None)
