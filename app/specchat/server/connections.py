"""uvicorn's HTTP/1.1 connections, with a deadline for each request's headers.

uvicorn closes a kept-alive connection that stays silent
(``timeout_keep_alive``) and h11 bounds the size of the headers (16 KiB),
but nothing bounds the time they take: a client that opens connections and
sends its headers a byte now and then (slowloris), or nothing at all, holds
each one open for good. Here every request's headers must be complete
within ``HEADER_SECONDS`` of the connection opening, or of the previous
reply ending on a kept-alive connection; bytes that arrive meanwhile do not
extend it. A connection past its deadline is closed without an answer, as
uvicorn closes an idle one. Local clients send their headers in one go, in
microseconds.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_SECONDS = 5.0


class DeadlineH11Protocol(H11Protocol):
    """``H11Protocol`` that closes a connection whose request headers are
    not complete in time."""

    _headers_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect_headers()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the request's headers are in
            self._cancel()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._expect_headers()  # the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _expect_headers(self) -> None:
        self._cancel()
        self._headers_due = self.loop.call_later(HEADER_SECONDS, self._headers_late)

    def _cancel(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
