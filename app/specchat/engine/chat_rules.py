"""What a request may carry for tools, tool calls and the chat template's
switches: one set of rules, for the engine's request check (every caller:
the window, the CLI, the API) and for the API, which answers a value that
breaks one with a 400 naming the field (``BadField.param``).

Pure Python, no MLX: the server imports it. Each rule is checked before
what it guards is used: a list's count before its items are read, JSON
text's nesting before it is parsed (``records.nested_deeper``), and the
template's own switches against what the loaded model's template reads
(``events.ChatFormat``), so a switch the model does not have is refused in
words instead of being silently ignored by the template.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from specchat import records, values
from specchat.engine.events import ChatFormat, Message, ToolCall

# JSON a request carries (a tool's schema, a call's arguments) nests at most
# this deep: the API's body bound, so JSON text inside a body is held to
# what the body around it is.
JSON_DEPTH = 64
# OpenAI's rule for a function's name; a name is written into the prompt
# and read back from replies (gpt-oss writes it in a header: ``to=functions.NAME``).
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ID_CHARS = 256  # a tool call's id, as clients make them (OpenAI's are 30-odd characters)
TOOL_CHOICES = ("auto", "none", "required")
# A function tool's fields a chat template reads (under "function" in chat's shape).
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
# OpenAI's reasoning_effort words. A template's on/off switch is off for the
# first two (no reasoning, or as little as possible: a switch has no
# "little"), on for the rest; a template that takes levels (gpt-oss) takes
# its own three.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
EFFORT_OFF = ("none", "minimal")
EFFORT_LEVELS = ("low", "medium", "high")
# The switches reasoning_effort maps onto, in the order one is chosen:
# on/off (Qwen3 and most thinking templates; DeepSeek-V3.1's), then levels (gpt-oss).
ON_OFF_SWITCHES = ("enable_thinking", "thinking")
LEVEL_SWITCHES = ("reasoning_effort",)

Scalar = bool | int | float | str | None


class BadField(values.BadValue):
    """A value a request carries that breaks a rule here; ``param`` names
    the field as the API names it (``messages[3].tool_call_id``)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _json(text: str, where: str) -> object:
    """JSON text held to ``JSON_DEPTH`` before it is parsed."""
    try:
        return records.parse_json(text, max_depth=JSON_DEPTH)
    except records.BadRecord as exc:
        raise BadField(f"{where} must be JSON text; {exc}", where) from None


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        _wrong(where, "text", value)
    try:
        return values.text(where, value)
    except values.BadValue as exc:
        raise BadField(str(exc), where) from None


def json_text(value: object, where: str, separators: tuple[str, str] | None = None) -> str:
    """``value`` as JSON text that can be written as UTF-8: a JSON escape
    of a lone surrogate (``"\\udcff"``) parses to text no tokenizer and no
    HTTP answer can encode, so it is refused here, in words."""
    text = json.dumps(value, ensure_ascii=False, separators=separators)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadField(f"{where} holds text that is not valid UTF-8 (a lone surrogate)",
                       where) from None
    return text


def _wrong(where: str, what: str, value: object):
    raise BadField(f"{where} must be {what}; got {_kind(value)}", where)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return {dict: "an object", list: "a list", str: "text", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def name(value: object, where: str) -> str:
    text = _text(value, where)
    if not NAME.fullmatch(text):
        raise BadField(f"{where} must be 1 to 64 letters, digits, _ or - (OpenAI's rule for a "
                       f"function's name); got {values.shown(text)}", where)
    return text


# -- tools ----------------------------------------------------------------------------

def tools(value: object, where: str = "tools", flat: bool = False) -> str:
    """A list of tools in OpenAI's shape, checked, as JSON text ("" for
    none): its count before its items, each a function with a name, an
    optional description and an optional schema object, no name twice,
    then its JSON's bytes. ``flat``: the Responses API's shape, a function's
    fields on the tool itself (``{"type": "function", "name": ...}``),
    named so in a refusal and returned in chat's shape, the one the
    engine and the chat templates read."""
    if value is None or value == []:  # none, as some clients say it
        return ""
    if not isinstance(value, list):
        _wrong(where, "a list of tool objects", value)
    _sized(where, "tools", len(value))
    seen: dict[str, int] = {}
    for i, tool in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict):
            _wrong(at, 'a tool object ({"type": "function", ...})', tool)
        if tool.get("type", "function") != "function":
            raise BadField(f"{at}.type must be \"function\" (the only kind of tool a model "
                           f"here can call); got {values.shown(tool.get('type'))}", f"{at}.type")
        fn, fat = (tool, at) if flat else (tool.get("function"), f"{at}.function")
        if not isinstance(fn, dict):
            _wrong(fat, "an object with the function's name", fn)
        fname = name(fn.get("name"), f"{fat}.name")
        if fname in seen:
            raise BadField(f"{fat}.name {fname!r} is the name of {where}[{seen[fname]}] "
                           "too; each tool needs its own", f"{fat}.name")
        seen[fname] = i
        if fn.get("description") is not None:
            _text(fn["description"], f"{fat}.description")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            _wrong(f"{fat}.parameters", "a JSON schema object", fn["parameters"])
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            _wrong(f"{fat}.strict", "true or false", fn["strict"])
    if flat:
        value = [{"type": "function", "function": {
            k: t[k] for k in FUNCTION_FIELDS if t.get(k) is not None}} for t in value]
    text = json_text(value, where, (",", ":"))
    _sized(where, "bytes of tools", values.utf8_size([text]))
    return text


def tool_list(text: str) -> list[dict]:
    """The tools of a request's JSON text (checked by ``tools`` when it was
    made; checked again here, since any caller can make a request)."""
    if not text:
        return []
    _sized("tools", "bytes of tools", values.utf8_size([text]))
    parsed = _json(text, "tools")
    tools(parsed)
    return parsed


def tool_choice(choice: object, tool: object, names: Sequence[str],
                where: str = "tool_choice", name_where: str = "") -> tuple[str, str]:
    """(choice, the one function's name or "") checked: a required or named
    call needs tools, and a named one must be among them. ``name_where``:
    the field that names the function (chat's ``tool_choice.function.name``
    by default)."""
    name_where = name_where or f"{where}.function.name"
    if choice not in TOOL_CHOICES:
        raise BadField(f"{where} must be one of {', '.join(TOOL_CHOICES)} or a named function; "
                       f"got {values.shown(choice)}", where)
    tool = _text(tool, name_where) if tool else ""
    if choice == "required" and not names:
        raise BadField(f"{where} asks for a tool call, but the request has no tools", where)
    if tool and tool not in names:
        raise BadField(f"{name_where} {values.shown(tool)} is not one of the request's "
                       f"tools ({', '.join(names)})", name_where)
    if tool and choice != "required":
        raise BadField(f"{where} names a function, so it asks for a call; got {choice!r} with it",
                       where)
    return choice, tool


# -- tool calls and the turns around them ---------------------------------------------

def arguments(value: object, where: str) -> str:
    """A call's arguments: JSON text of an object (OpenAI's shape; an
    object itself is taken too, and nothing is ``{}``), returned as text."""
    if isinstance(value, dict):
        text = json_text(value, where)
        if records.nested_deeper(text, JSON_DEPTH):
            raise BadField(f"{where} nests deeper than {JSON_DEPTH} levels", where)
        return text
    text = _text(value, where) if value is not None else ""
    if not text.strip():
        return "{}"
    parsed = _json(text, where)
    if not isinstance(parsed, dict):
        raise BadField(f"{where} must be JSON text of an object (the function's arguments by "
                       "name)", where)
    json_text(parsed, where)
    return text


def call_id(value: object, where: str) -> str:
    """A tool call's id: what the call's result names it by."""
    cid = _text(value, where)
    if not cid.strip() or len(cid) > ID_CHARS:
        raise BadField(f"{where} must be text of 1 to {ID_CHARS} characters", where)
    return cid


def tool_call(call: ToolCall, where: str) -> ToolCall:
    """A call an earlier assistant turn made, each field checked."""
    if not isinstance(call, ToolCall):
        _wrong(where, "a tool call", call)
    return ToolCall(call_id(call.id, f"{where}.id"), name(call.name, f"{where}.function.name"),
                    arguments(call.arguments, f"{where}.function.arguments"))


class Names:
    """How a request names the fields of its turns in a refusal: chat
    completions' ``messages[3].tool_calls[0].id``, by default. Another API
    whose turns are made from items of its own (the Responses API's
    ``input``) names the item each came from."""

    def turn(self, i: int) -> str:
        return f"messages[{i}]"

    def field(self, i: int, field: str) -> str:
        """A field of turn ``i`` by chat's name (``tool_call_id``, ``reasoning_content``)."""
        return f"{self.turn(i)}.{field}"

    def call(self, i: int, j: int) -> str:
        """Call ``j`` of turn ``i``."""
        return f"{self.turn(i)}.tool_calls[{j}]"

    def call_id(self, i: int, j: int) -> str:
        return f"{self.call(i, j)}.id"


def conversation(messages: Sequence[Message], names: Names | None = None) -> None:
    """What ties the turns together: calls only in assistant turns, each
    call's id used once in the conversation, and every ``tool`` turn the
    result of a call an earlier turn made (what a template writes for it
    names that call). ``names``: how the request names its fields (chat's,
    by default)."""
    names = names or Names()
    made: dict[str, str] = {}  # call id -> where it was made
    for i, m in enumerate(messages):
        at = names.turn(i)
        if m.tool_calls and m.role != "assistant":
            raise BadField(f"{at} is a {m.role} message; only an assistant message makes tool "
                           "calls", names.field(i, "tool_calls"))
        if m.reasoning and m.role != "assistant":
            raise BadField(f"{at} is a {m.role} message; only an assistant message has reasoning",
                           names.field(i, "reasoning_content"))
        for j, call in enumerate(m.tool_calls):
            if call.id in made:
                raise BadField(f"{names.call_id(i, j)} {values.shown(call.id)} is the id of a "
                               f"call {made[call.id]} made already; each call needs its own",
                               names.call_id(i, j))
            made[call.id] = names.call(i, j)
        result_id = names.field(i, "tool_call_id")
        if m.role == "tool":
            if not m.tool_call_id:
                raise BadField(f"{at} is a tool result without the id of the call it answers "
                               f"({result_id})", result_id)
            if m.tool_call_id not in made:
                raise BadField(f"{result_id} {values.shown(m.tool_call_id)} names no call "
                               "made before it", result_id)
        elif m.tool_call_id:
            raise BadField(f"{at} is a {m.role} message; only a tool message answers a call",
                           result_id)


def texts(m: Message):
    """Every text of a message the template writes into the prompt (what
    the prompt's bound in UTF-8 bytes counts)."""
    yield m.content
    yield m.reasoning
    for c in m.tool_calls:
        yield c.name
        yield c.arguments


def prompt_bytes(messages: Sequence[Message], tools: str = "") -> int:
    """The UTF-8 bytes of what a chat template writes into the prompt from
    a request: every message's texts and the tools' JSON, the one count
    ``values.prompt_size`` bounds (the tools apart, a request at every
    bound was 1.6 million tokens, where the prompt's bound is a million)."""
    return values.utf8_size([*(t for m in messages for t in texts(m)), tools])


def call_names(messages: Sequence[Message]) -> dict[str, str]:
    """Each call id of the conversation and the function it called (what
    a template writes for the ``tool`` turn answering it)."""
    return {c.id: c.name for m in messages for c in m.tool_calls}


# -- the chat template's switches ------------------------------------------------------

def switches(value: object, where: str = "chat_template_kwargs") -> tuple[tuple[str, Scalar], ...]:
    """Template variables a request sets: an object of JSON scalars (a
    switch is a flag, a word, a number), bounded in count and in text."""
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        pairs = list(value)  # the engine's own form: (name, value) pairs
    else:
        _wrong(where, "an object of template variables", value)
    _sized(where, "template switches", len(pairs))
    out = []
    chars = 0
    for key, v in pairs:
        at = f"{where}.{key}" if isinstance(key, str) else where
        if not isinstance(key, str) or not key.isidentifier():
            raise BadField(f"{where} keys must be template variable names; got "
                           f"{values.shown(key)}", where)
        if isinstance(v, float) and not math.isfinite(v):
            _wrong(at, "a finite number", v)
        if not isinstance(v, bool | int | float | str) and v is not None:
            _wrong(at, "true, false, a number, text or null (a template switch)", v)
        chars += len(key)  # a name is text a request sends too (one of 200,000 was echoed)
        if isinstance(v, str):
            chars += len(_text(v, at))
        out.append((key, v))
    _sized(where, "characters of template switches", chars)
    return tuple(out)


def effort(value: object, where: str = "reasoning_effort") -> str:
    if value is None or value == "":
        return ""
    if value not in EFFORTS:
        raise BadField(f"{where} must be one of {', '.join(EFFORTS)}; got "
                       f"{values.shown(value)}", where)
    return value


def template_variables(fmt: ChatFormat, pairs: Sequence[tuple[str, Scalar]], wanted: str,
                       where: str = "chat_template_kwargs",
                       effort_where: str = "reasoning_effort") -> dict[str, Scalar]:
    """The variables a request sets for ``fmt``'s template: each switch one
    the template reads, and the reasoning effort ``wanted`` mapped onto the
    template's own switch (none is refused in words, as is one set twice)."""
    out: dict[str, Scalar] = {}
    for key, v in pairs:
        if key not in fmt.switches:
            reads = (f"it reads {', '.join(fmt.switches)}" if fmt.switches
                     else "it reads none a request can set")
            raise BadField(f"{where} sets '{values.shown(key)}', which this model's chat template "
                           f"does not read (it would do nothing); {reads}", f"{where}.{key}")
        out[key] = v
    if not wanted:
        return out
    if not fmt.effort:
        raise BadField("this model's chat template has no reasoning switch, so "
                       f"{effort_where} {wanted!r} cannot be honoured; leave it out", effort_where)
    if fmt.effort in out:
        raise BadField(f"{effort_where} and {where}.{fmt.effort} both set this model's "
                       "reasoning switch; send one of them", effort_where)
    if fmt.effort in ON_OFF_SWITCHES:
        out[fmt.effort] = wanted not in EFFORT_OFF
    elif wanted in EFFORT_LEVELS:
        out[fmt.effort] = wanted
    else:
        raise BadField(f"this model's reasoning takes the efforts {', '.join(EFFORT_LEVELS)}; got "
                       f"{wanted!r}", effort_where)
    return out


def thinking_effort(fmt: ChatFormat, on: bool | None, where: str = "thinking") -> str:
    """Thinking switched on or off (Anthropic's ``thinking``; None: not
    said) as the reasoning effort for ``fmt``'s template ("" leaves its
    default). On is a ceiling, not a promise (Anthropic's budget is one,
    and clients such as Claude Code ask for it whatever the model): a
    template with a switch gets it on (a template of levels its middle
    one), any other model answers as it always does. Off is a promise
    that no reasoning comes back, which only an on/off switch keeps: a
    template without one refuses it, as ``template_variables`` refuses a
    reasoning effort it has no switch for."""
    if on is None:
        return ""
    if on:
        return "medium" if fmt.effort else ""
    if fmt.effort in ON_OFF_SWITCHES:
        return "none"
    how = (f"its {fmt.effort} takes only {', '.join(EFFORT_LEVELS)}" if fmt.effort
           else "it has no reasoning switch")
    raise BadField(f"this model's chat template cannot turn reasoning off ({how}), so {where} "
                   "disabled cannot be honoured; leave it out", where)


def offered(fmt: ChatFormat, has_tools: bool, choice: str) -> None:
    """Tools a request offers must reach the model and its calls be
    readable, or the request is refused in words (a model that cannot take
    them would answer as if it had none)."""
    if not has_tools or choice == "none":
        return
    if not fmt.tools:
        raise BadField("this model's chat template takes no tools (it never writes them into the "
                       "prompt), so it cannot call them; send the request without tools",
                       "tools")
    if not fmt.tool_format:
        raise BadField("SpecChat cannot read this model's tool calls (mlx-lm knows no tool-call "
                       "format for it), so it cannot serve tools; send the request without them",
                       "tools")


def _sized(where: str, name: str, n: int) -> None:
    try:
        values.size(name, n)
    except values.BadValue as exc:
        raise BadField(str(exc), where) from None
