"""The endpoints the local server serves: one table that the HTTP side
builds its routes from (``app.build_app``), that names them in its refusal
of any other path, and that Settings' "Local server" lists, so a new
endpoint is one line here and appears in all three.

No Starlette here (nor anything that imports it): the window lists the
endpoints without loading the server.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every endpoint's path starts with it; clients are given the server's
# address and it (OpenAI's ``base_url``, http://127.0.0.1:8321/v1).
BASE_PATH = "/v1"


@dataclass(frozen=True)
class Endpoint:
    method: str  # "GET" or "POST"
    path: str  # from the root: "/v1/chat/completions"
    what: str  # what it is, as Settings names it
    note: str = ""  # said after it when the server lists its endpoints in a refusal

    def url(self, base: str) -> str:
        """Its URL under ``base`` (``base_url``'s, ending in BASE_PATH)."""
        return base + self.path.removeprefix(BASE_PATH)


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", f"{BASE_PATH}/models", "the model served"),
    Endpoint("POST", f"{BASE_PATH}/chat/completions", "OpenAI Chat Completions"),
    Endpoint("POST", f"{BASE_PATH}/completions", "OpenAI Completions"),
    Endpoint("POST", f"{BASE_PATH}/responses", "OpenAI Responses",
             "it stores no responses to get back"),
    Endpoint("POST", f"{BASE_PATH}/messages", "Anthropic Messages"),
    Endpoint("POST", f"{BASE_PATH}/messages/count_tokens", "Anthropic token count"),
)


def base_url(host: str, port: int | str) -> str:
    """The base URL clients use for a server on ``host`` (bare: an IPv6
    address without its brackets) and ``port``."""
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}{BASE_PATH}"


def listed() -> str:
    """The endpoints in a sentence: "GET /v1/models, POST ... and POST ..."."""
    names = [f"{e.method} {e.path}" + (f" ({e.note})" if e.note else "") for e in ENDPOINTS]
    return ", ".join(names[:-1]) + " and " + names[-1]
