"""OpenAI's request and response bodies, and the engine's values they map to.

Pure functions over plain dicts (no HTTP, no engine thread), so every rule
about what a client may send is in one place and testable on its own. Each
number goes through ``specchat.values``, the table the CLI, the settings
dialog and the engine check against, so a bad temperature gets the same one
line here as anywhere else, as a 400 naming its parameter.

Fields this server cannot honour (``n`` above 1, log-probabilities, several
prompts at once) are refused by name rather than ignored, so a client never
gets less than it asked for without knowing; fields that only shape the
reply's form (``user``, ``tools`` and the like) are ignored, as OpenAI-style
local servers do.

Every list a request carries is bounded in count and in total length
(``specchat.values``: stop strings, messages, a message's content parts,
the prompt in UTF-8 bytes or token ids; tools too, which are ignored today
but will be rendered into the prompt), each before its items are read, so
no request costs the engine thread more than those bounds allow: one past
a bound never waits for its turn.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from specchat import values
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    GenerationResult,
    Message,
    SamplingParams,
    Summary,
)
from specchat.server.errors import ApiError, bad_value

Kind = Literal["chat", "completion"]
# The roles a chat template knows; OpenAI's "developer" is the newer name
# for "system".
ROLES = {"system": "system", "developer": "system", "user": "user",
         "assistant": "assistant", "tool": "tool"}
MAX_TOKENS_CAP = int(values.LIMITS["max tokens"].high)


@dataclass(frozen=True)
class ApiRequest:
    """One checked request: what to generate, and how to answer."""

    kind: Kind
    id: str
    model: str
    stream: bool = False
    include_usage: bool = False
    messages: tuple[Message, ...] = ()
    prompt: str | None = None  # a completion's text, tokenized by the target
    prompt_ids: tuple[int, ...] | None = None  # a completion's token ids
    max_tokens: int | None = None  # None: as many as the cap and the context allow
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()

    def generate_request(self, mode: str, k: int | None, cap: int = MAX_TOKENS_CAP,
                         prompt_ids: tuple[int, ...] | None = None) -> GenerateRequest:
        """The engine's request, decoded in ``mode``; ``prompt_ids`` for a
        text prompt once the target has tokenized it."""
        ids = prompt_ids if prompt_ids is not None else self.prompt_ids
        return GenerateRequest(
            messages=self.messages if self.kind == "chat" else (),
            prompt_ids=ids if self.kind == "completion" else None,
            max_tokens=min(self.max_tokens or cap, cap),
            sampling=self.sampling,
            draft=DraftSettings(mode=mode, k=k),
            stop_strings=self.stop,
        )


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


# -- requests ---------------------------------------------------------------------

def parse(kind: Kind, body: object, cap: int = MAX_TOKENS_CAP) -> ApiRequest:
    """A chat or completion request body, checked; ``ApiError`` (400) names
    the first field that is not acceptable."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_value("you must provide a model parameter (GET /v1/models lists it)",
                        "model")
    _refuse_unsupported(kind, body)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_value("stream_options must be an object", "stream_options")
    include_usage = stream and _flag(options or {}, "include_usage", "stream_options")
    fields = dict(kind=kind, id=new_id(kind), model=model, stream=stream,
                  include_usage=include_usage, max_tokens=_max_tokens(kind, body, cap),
                  sampling=_sampling(body), stop=_stop(body.get("stop")))
    if kind == "chat":
        _tools(body.get("tools"))
        messages = _messages(body.get("messages"))
        _bounded(values.utf8_size(m.content for m in messages), "messages")
        return ApiRequest(messages=messages, **fields)
    text, ids = _prompt(body.get("prompt"))
    if text is not None:
        _bounded(values.utf8_size([text]), "prompt")
    return ApiRequest(prompt=text, prompt_ids=ids, **fields)


def _bounded(size_bytes: int, param: str) -> None:
    """The engine's bound on a prompt's UTF-8 bytes, checked here too so that
    a prompt past it is refused before it waits for its turn (and a text
    completion prompt before the engine tokenizes it)."""
    _as_400(param, values.prompt_size, size_bytes)


def _sized(param: str, name: str, n: int) -> None:
    """``values.size(name, n)`` as a 400 naming ``param``."""
    _as_400(param, values.size, name, n)


def _as_400(param: str, check, *args):
    """``check(*args)`` from ``specchat.values``, its BadValue a 400 naming ``param``."""
    try:
        return check(*args)
    except values.BadValue as exc:
        raise bad_value(str(exc), param) from None


def _refuse_unsupported(kind: Kind, body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_value("this server returns one choice per request: n must be 1", "n")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) not in (None, False, 0):  # absent or off
            raise bad_value("log-probabilities are not supported by this server", name)
    if kind == "completion":
        if body.get("echo"):
            raise bad_value("echo is not supported by this server", "echo")
        if body.get("best_of") not in (None, 1):
            raise bad_value("best_of must be 1 on this server", "best_of")
        if body.get("suffix"):
            raise bad_value("suffix (fill-in-the-middle) is not supported by this server",
                            "suffix")


def _flag(body: dict, name: str, param: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_value(f"{name} must be true or false; got {_shown(v)}", param or name)
    return v


def _checked(limit: str, value: object, param: str):
    """``values.check`` for a JSON value, as a 400 naming the parameter.
    JSON text ("0.5") is refused: a number must be sent as a number."""
    if isinstance(value, str):
        raise bad_value(f"{values.LIMITS[limit].describe()}; got the text {_shown(value)}",
                        param)
    return _as_400(param, values.check, limit, value)


def _max_tokens(kind: Kind, body: dict, cap: int) -> int | None:
    param = "max_tokens"
    value = body.get("max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        param, value = "max_completion_tokens", body.get("max_completion_tokens")
    if value is None:
        return None
    n = _checked("max tokens", value, param)
    if n > cap:
        raise bad_value(f"{param} must be at most {cap} on this server; got {n}", param)
    return n


def _sampling(body: dict) -> SamplingParams:
    def get(name: str, limit: str, default):
        v = body.get(name)
        return default if v is None else _checked(limit, v, name)

    return SamplingParams(temperature=get("temperature", "temperature", 1.0),
                          top_p=get("top_p", "top-p", 1.0),
                          top_k=get("top_k", "top-k", 0),  # an mlx-lm extension
                          seed=get("seed", "seed", None))


def _text(what: str, value: object, param: str) -> str:
    """A text value by specchat.values' rule for ``what`` (the CLI's, which
    refuses an empty stop string or prompt too); refused as a 400 naming
    ``param``."""
    return _as_400(param, values.text, what, value)


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise bad_value("stop must be a string or a list of strings", "stop")
    return _as_400("stop", values.stop_strings, items)


def _tools(tools: object) -> None:
    """Tools are ignored (the chat template does not see them yet), but
    bounded as they will be once it does: their count, and their JSON's
    UTF-8 bytes, which a template writes into the prompt."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_value("tools must be a list of tool objects", "tools")
    _sized("tools", "tools", len(tools))
    if not all(isinstance(t, dict) for t in tools):
        raise bad_value("tools must be a list of tool objects", "tools")
    text = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    _sized("tools", "bytes of tools", values.utf8_size([text]))


def _messages(messages: object) -> tuple[Message, ...]:
    if not isinstance(messages, list) or not messages:
        raise bad_value("messages must be a non-empty list of {role, content} objects",
                        "messages")
    _sized("messages", "messages", len(messages))
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_value(f"{where} must be an object with a role and a content", where)
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise bad_value(f"{where}.role must be one of {', '.join(ROLES)}; "
                            f"got {_shown(m.get('role'))}", f"{where}.role")
        out.append(Message(role, _content(m.get("content"), f"{where}.content")))
    if not any(m.role == "user" and m.content.strip() for m in out):
        raise bad_value("messages must include a user message with some text", "messages")
    return tuple(out)


def _content(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts (what newer
    clients send); an image or audio part is refused, not dropped."""
    if content is None:
        return ""
    if isinstance(content, list):
        _sized(where, "content parts", len(content))
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_value(f"{where} has a {_shown(kind)} part; this server takes text "
                                "only", where)
            if not isinstance(part.get("text"), str):
                raise bad_value(f"{where}: a text part's text must be a string", where)
            texts.append(part["text"])
        content = "".join(texts)
    return _text(where, content, where)


def _prompt(prompt: object) -> tuple[str | None, tuple[int, ...] | None]:
    """A completion's prompt: text or token ids (OpenAI takes both), one of them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return _text("the prompt", prompt, "prompt"), None
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str | list):
        _as_400("prompt", values.prompt_tokens, len(prompt))  # before reading them
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return None, tuple(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(
            isinstance(p, str | list) for p in prompt):
        raise bad_value("this server takes one prompt per request", "prompt")
    raise bad_value("prompt must be a non-empty string or a list of token ids", "prompt")


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# -- responses ----------------------------------------------------------------------

def finish_reason(summary: Summary) -> str:
    """OpenAI's words: "length" when the token budget ran out, "stop" for an
    end token or a stop string."""
    return "length" if summary.finish_reason == "length" else "stop"


def usage(summary: Summary) -> dict:
    return {"prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.new_tokens,
            "total_tokens": summary.prompt_tokens + summary.new_tokens}


def speculative(summary: Summary) -> dict:
    """The extension field: how speculation went for this reply (clients
    that do not know it ignore it)."""
    out = {"mode": summary.mode, "drafted": summary.drafted, "accepted": summary.accepted,
           "acceptance_rate": round(summary.acceptance_rate, 4),
           "tokens_per_step": round(summary.tokens_per_step, 4)}
    by_origin = getattr(summary, "tokens_by_origin", None)
    if by_origin:
        out["tokens_by_origin"] = dict(by_origin)
    return out


def _head(req: ApiRequest, obj: str, created: int, model: str) -> dict:
    return {"id": req.id, "object": obj, "created": created, "model": model}


def response(req: ApiRequest, result: GenerationResult, model: str) -> dict:
    """The whole answer of a request that did not stream."""
    s, chat = result.summary, req.kind == "chat"
    text = {"message": {"role": "assistant", "content": result.text}} if chat \
        else {"text": result.text}
    choice = {"index": 0, **text, "logprobs": None, "finish_reason": finish_reason(s)}
    return {**_head(req, "chat.completion" if chat else "text_completion", int(time.time()), model),
            "choices": [choice], "usage": usage(s), "speculative": speculative(s)}


class Chunks:
    """The streamed form of one answer: the chunks, in order."""

    def __init__(self, req: ApiRequest, model: str):
        self.req = req
        self.model = model
        self.created = int(time.time())
        # The text streamed so far, in its pieces: joined once, at the end
        # (adding each piece to one string copied all of it every step).
        self._sent: list[str] = []

    def _chunk(self, choice: dict | None, **extra) -> dict:
        obj = "chat.completion.chunk" if self.req.kind == "chat" else "text_completion"
        return {**_head(self.req, obj, self.created, self.model),
                "choices": [choice] if choice is not None else [], **extra}

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict:
        if self.req.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else (
                {"content": text} if text is not None else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def start(self) -> list[dict]:
        """A chat stream opens with the assistant's role, as OpenAI's does."""
        return [self._chunk(self._choice(None, None, role=True))] if self.req.kind == "chat" else []

    def text(self, text: str) -> list[dict]:
        if not text:
            return []
        self._sent.append(text)
        return [self._chunk(self._choice(text, None))]

    def end(self, result: GenerationResult) -> list[dict]:
        """Any text the steps held back, the finish reason with the
        ``speculative`` extension, and the usage chunk if it was asked for."""
        s = result.summary
        out = []
        sent = "".join(self._sent)
        if result.text.startswith(sent) and len(result.text) > len(sent):
            out += self.text(result.text[len(sent):])
        out.append(self._chunk(self._choice(None, finish_reason(s)),
                               speculative=speculative(s)))
        if self.req.include_usage:
            out.append(self._chunk(None, usage=usage(s), speculative=speculative(s)))
        return out
