"""The checks every API face runs on a request's fields, each refusal a
400 naming its field: numbers through ``specchat.values`` (the table the
CLI, the settings and the engine check against), lists bounded in count
before their items are read, text as UTF-8, and the engine's own rules for
tools, calls and switches (``engine/chat_rules.py``) as 400s. OpenAI's chat
completions (protocol.py), the Responses API (responses.py) and Anthropic's
Messages API (anthropic.py) map their shapes onto these, so one field is
refused in the same words whichever API carried it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specchat import values
from specchat.engine import chat_rules
from specchat.engine.events import Message, SamplingParams
from specchat.server.errors import ApiError, bad_value


def ruled(rule, *args, **kwargs):
    """``rule(*args, **kwargs)`` from ``engine/chat_rules.py``, a refusal a
    400 naming the field it names."""
    try:
        return rule(*args, **kwargs)
    except chat_rules.BadField as exc:
        raise bad_value(str(exc), exc.param) from None


def bounded(size_bytes: int, param: str) -> None:
    """The engine's bound on a prompt's UTF-8 bytes, checked here too so that
    a prompt past it is refused before it waits for its turn (and a text
    completion prompt before the engine tokenizes it)."""
    as_400(param, values.prompt_size, size_bytes)


def sized(param: str, name: str, n: int) -> None:
    """``values.size(name, n)`` as a 400 naming ``param``."""
    as_400(param, values.size, name, n)


def as_400(param: str, check, *args):
    """``check(*args)`` from ``specchat.values``, its BadValue a 400 naming ``param``."""
    try:
        return check(*args)
    except values.BadValue as exc:
        raise bad_value(str(exc), param) from None


def flag(body: dict, name: str, param: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_value(f"{name} must be true or false; got {shown(v)}", param or name)
    return v


def checked(limit: str, value: object, param: str):
    """``values.check`` for a JSON value, as a 400 naming the parameter.
    JSON text ("0.5") is refused: a number must be sent as a number."""
    if isinstance(value, str):
        raise bad_value(f"{values.LIMITS[limit].describe()}; got the text {shown(value)}",
                        param)
    return as_400(param, values.check, limit, value)


def max_tokens(body: dict, cap: int, names: tuple[str, ...]) -> int | None:
    """The reply's token budget from the first of ``names`` the body sets
    (chat's ``max_completion_tokens`` over its older ``max_tokens``), at
    most ``cap``; None if it sets none."""
    param = next((n for n in names if body.get(n) is not None), None)
    if param is None:
        return None
    value = body[param]
    n = checked("max tokens", value, param)
    if n > cap:
        raise bad_value(f"{param} must be at most {cap} on this server; got {n}", param)
    return n


def sampling(body: dict) -> SamplingParams:
    def get(name: str, limit: str, default):
        v = body.get(name)
        return default if v is None else checked(limit, v, name)

    return SamplingParams(temperature=get("temperature", "temperature", 1.0),
                          top_p=get("top_p", "top-p", 1.0),
                          top_k=get("top_k", "top-k", 0),  # an mlx-lm extension
                          seed=get("seed", "seed", None))


def text(what: str, value: object, param: str) -> str:
    """A text value by specchat.values' rule for ``what`` (the CLI's, which
    refuses an empty stop string or prompt too); refused as a 400 naming
    ``param``."""
    return as_400(param, values.text, what, value)


def stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise bad_value("stop must be a string or a list of strings", "stop")
    return as_400("stop", values.stop_strings, items)


def objects(value: object, param: str, bound: str, items: str, item: str,
             empty: bool = True) -> list[tuple[str, dict]]:
    """A list of objects a request carries, each with its name
    (``messages[3]``), its count bounded (``values`` entry ``bound``)
    before any is read; a 400 naming what is not a list of ``items`` (of
    at least one, unless ``empty``) or not ``item``."""
    if not isinstance(value, list) or not (value or empty):
        raise bad_value(f"{param} must be a {'' if empty else 'non-empty '}list of {items}",
                        param)
    sized(param, bound, len(value))
    out = []
    for i, v in enumerate(value):
        at = f"{param}[{i}]"
        if not isinstance(v, dict):
            raise bad_value(f"{at} must be {item}", at)
        out.append((at, v))
    return out


def asks(messages: Sequence[Message], param: str) -> None:
    """A conversation must ask something: a user turn with some text."""
    if not any(m.role == "user" and m.content.strip() for m in messages):
        raise bad_value(f"{param} must include a user message with some text", param)


def content(content: object, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's text: a string, or a list of text parts (what newer
    clients send; ``kinds``: the types a text part has in this API); an
    image or audio part is refused, not dropped."""
    if content is None:
        return ""
    if isinstance(content, list):
        sized(where, "content parts", len(content))
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in kinds:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_value(f"{where} has a {shown(kind)} part; this server takes text "
                                "only", where)
            if not isinstance(part.get("text"), str):
                raise bad_value(f"{where}: a text part's text must be a string", where)
            texts.append(part["text"])
        content = "".join(texts)
    return text(where, content, where)


def shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def model(body: object) -> str:
    """The model a request body names (a body that is not an object is refused)."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_value("you must provide a model parameter (GET /v1/models lists it)",
                        "model")
    return model
