"""Errors of the local API, in the shape OpenAI's clients read.

An ``ApiError`` is a refused request: its HTTP status and the body
``{"error": {"message", "type", "param", "code"}}`` that OpenAI's SDKs turn
into ``BadRequestError``, ``AuthenticationError``, ``NotFoundError`` and so
on. A ``ServerError`` is the server itself refusing to start (a bind that
would expose it without a key, a port in use): one line for the person at
the terminal or in Settings, like every ``SpecChatError``.
"""

from __future__ import annotations

from specchat.errors import SpecChatError


class ServerError(SpecChatError):
    """The server cannot start as asked (see ``listener.check_bind``)."""


class ApiError(Exception):
    """A request the server refuses, with the status and body to answer."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        # OpenAI's error "type": the server's fault (5xx) or the request's.
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}


def bad_value(message: str, param: str | None = None) -> ApiError:
    """A 400 for a value out of its range or of the wrong kind."""
    return ApiError(400, message, param, "invalid_value" if param else None)
