"""Errors of the local API, in the shape each API's clients read.

An ``ApiError`` is a refused request: its HTTP status and the body
``{"error": {"message", "type", "param", "code"}}`` that OpenAI's SDKs turn
into ``BadRequestError``, ``AuthenticationError``, ``NotFoundError`` and so
on; under Anthropic's paths (``/v1/messages``) the same refusal has
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, and
the status Anthropic gives its type (``answer``), so its SDKs raise their
own classes of the same names. A ``ServerError`` is the server itself
refusing to start (a bind that would expose it without a key, a port in
use): one line for the person at the terminal or in Settings, like every
``SpecChatError``.
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

    def answer(self, path: str) -> tuple[int, dict]:
        """(HTTP status, body) for a request to ``path``: OpenAI's shape,
        or Anthropic's under its paths (whose error types have no
        ``param``: the message names the field)."""
        if not anthropic_path(path):
            return self.status, self.body()
        kind = ANTHROPIC_TYPES.get(self.status) or (
            "api_error" if self.status >= 500 else "invalid_request_error")
        # Anthropic's "no capacity now, retry" is 529; ours is no model loaded yet.
        status = 529 if self.status == 503 else self.status
        message = self.message if not self.param or self.param in self.message \
            else f"{self.param}: {self.message}"
        return status, {"type": "error", "error": {"type": kind, "message": message}}


# Anthropic's error types by HTTP status; any other 4xx is an
# invalid_request_error and any other 5xx an api_error, as its API documents.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error",
                   413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def anthropic_path(path: str) -> bool:
    """A path of Anthropic's Messages API (``/v1/messages`` and under it)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def bad_value(message: str, param: str | None = None) -> ApiError:
    """A 400 for a value out of its range or of the wrong kind."""
    return ApiError(400, message, param, "invalid_value" if param else None)
