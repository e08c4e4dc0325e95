"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``):
its request and response bodies, as another face of the engine request
OpenAI's chat completions make.

A Messages request maps onto the same ``ApiRequest`` (and so the same
``GenerateRequest``) as a chat completion, and every rule it meets is the
one the OpenAI side meets: the bounds of ``specchat.values`` and the rules
of ``engine/chat_rules.py`` for tools, calls, the turns around them and the
template's switches. Only the shapes differ, and the names: a refusal
names the field as Anthropic's API spells it (``tools[3].input_schema``,
``messages[2].content[0].tool_use_id``), since the rules' own words name
OpenAI's (``_ruled``, ``_BlockNames``).

How the shapes map:

- ``system`` (text or text blocks) is the conversation's system turn;
  a turn's text blocks are joined by a newline, as paragraphs.
- A user turn's ``tool_result`` blocks are ``tool`` turns (their
  ``tool_use_id`` the call they answer; ``is_error`` says ``Error:`` before
  the result, the only way a chat template hears it), its text one user turn.
- An assistant turn's ``thinking`` blocks are its reasoning, ``tool_use``
  blocks its calls (``input`` the arguments object), text its content;
  ``redacted_thinking`` (Anthropic's encrypted reasoning) is nothing a
  model here can read and is left out.
- ``thinking`` maps onto the template's reasoning switch
  (``chat_rules.thinking_effort``): ``enabled`` and ``adaptive`` are what
  Claude Code sends by default, and are never refused; ``disabled`` is
  refused by a model that cannot turn its reasoning off.
- ``tool_choice`` ``auto``/``any``/``tool``/``none`` are OpenAI's
  ``auto``/``required``/a named function/``none``;
  ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``.

A reply (``Reply``) is built from the engine's steps, streamed or not, so
the message a client assembles from the stream is the message a request
that did not stream gets: content blocks in the order the reply wrote
them (``thinking``, ``text``, ``tool_use``), in Anthropic's event sequence.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field, replace
from typing import NoReturn

from specchat import values
from specchat.engine import chat_rules
from specchat.engine.events import (
    ANSWER,
    REASONING,
    ChatFormat,
    GenerationResult,
    Message,
    StepEvent,
    Summary,
    ToolCall,
)
from specchat.server import fields, reply_stream
from specchat.server.errors import ApiError, bad_value
from specchat.server.protocol import (
    MAX_TOKENS_CAP,
    ApiRequest,
    speculative,
)
from specchat.server.protocol import (
    check_format as check_chat,
)

PATH = "/v1/messages"
JOIN = "\n"  # between a turn's text blocks
THINKING = ('thinking must be {"type": "enabled", "budget_tokens": N}, {"type": "adaptive"}, '
            '{"type": "between_tools"} or {"type": "disabled"}')
# Thinking on, off, or as the model decides (None: the template's default).
THINKING_ON = {"enabled": True, "adaptive": None, "between_tools": None, "disabled": False}
TOOL_CHOICE = ('tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "tool", '
               '"name": ...} or {"type": "none"}')
CHOICES = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop_string": "stop_sequence"}
# OpenAI's names in the rules' words, and Anthropic's for the same fields.
_RENAMED = ((".function.parameters", ".input_schema"), (".function.arguments", ".input"),
            (".function.", "."), (".tool_call_id", ".tool_use_id"))


@dataclass(frozen=True)
class Request:
    """One checked Messages request: the engine's request in the API's
    common form, and what is Anthropic's own: thinking asked on or off
    (None: not said, or ``adaptive``), and whether its text is shown."""

    api: ApiRequest
    thinking: bool | None = None
    show_thinking: bool = True


def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


# -- requests ---------------------------------------------------------------------

def parse(body: object, cap: int = MAX_TOKENS_CAP, counting: bool = False) -> Request:
    """A Messages request body (``counting``: count_tokens', which has no
    max_tokens and does not stream), checked; ``ApiError`` (400) names the
    first field that is not acceptable."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_value("model must name the served model (GET /v1/models lists it)", "model")
    _refuse_unsupported(body)
    if not counting and body.get("max_tokens") is None:
        raise bad_value("max_tokens is required: the most tokens the reply may have, its "
                        "thinking included", "max_tokens")
    tools = _ruled(chat_rules.tools, _tools(body.get("tools")))
    names = [t["name"] for t in body["tools"]] if tools else []
    choice, name, parallel = _tool_choice(body.get("tool_choice"), names)
    thinking, show = _thinking(body.get("thinking"))
    api = ApiRequest(
        kind="chat", id=new_id(), model=model,
        stream=not counting and fields.flag(body, "stream"),
        messages=_conversation(body), max_tokens=None if counting else
        fields.max_tokens(body, cap, ("max_tokens",)),
        sampling=fields.sampling(body), stop=_stop(body.get("stop_sequences")),
        tools=tools, tool_choice=choice, tool_name=name, parallel_tool_calls=parallel)
    return Request(api, thinking, show)


def check_format(req: Request, fmt: ChatFormat) -> ApiRequest:
    """What depends on the served model, before the request waits for its
    turn: thinking mapped onto its template's switch, then the chat
    completions' own check (tools it can take)."""
    effort = _ruled(chat_rules.thinking_effort, fmt, req.thinking)
    api = replace(req.api, reasoning_effort=effort)
    check_chat(api, fmt)
    return api


def _ruled(rule, *args):
    """``rule(*args)`` from ``engine/chat_rules.py``, a refusal a 400 in
    Anthropic's names for the fields."""
    try:
        return rule(*args)
    except chat_rules.BadField as exc:
        raise bad_value(_renamed(str(exc)), _renamed(exc.param)) from None


def _renamed(text: str) -> str:
    for openai, anthropic in _RENAMED:
        text = text.replace(openai, anthropic)
    return text


def _refuse_unsupported(body: dict) -> None:
    """What this server cannot honour, refused by name rather than dropped
    (fields that only shape Anthropic's service, such as metadata or
    cache_control, are ignored)."""
    config = body.get("output_config")
    for name, value in (("output_format", body.get("output_format")),
                        ("output_config.format",
                         config.get("format") if isinstance(config, dict) else None)):
        if value is not None:
            raise bad_value(f"{name}: structured outputs (a JSON schema the reply must follow) "
                            "are not supported by this server", name)
    if body.get("mcp_servers"):
        raise bad_value("this server connects to no MCP servers itself; send their tools as "
                        "tools and run them yourself", "mcp_servers")


def _stop(stops: object) -> tuple[str, ...]:
    if stops is None:
        return ()
    if not isinstance(stops, list):
        raise bad_value("stop_sequences must be a list of strings", "stop_sequences")
    return fields.as_400("stop_sequences", values.stop_strings, stops)


def _tools(value: object) -> list[dict] | None:
    """Anthropic's custom tools ({name, description, input_schema}) in
    OpenAI's shape, which the rules check and the template reads; their
    count bounded before they are read."""
    if value is None:
        return None
    out = []
    for at, tool in fields.objects(value, "tools", "tools", "tools ({name, description, "
                             "input_schema})", "a tool object ({name, description, "
                             "input_schema})"):
        if tool.get("type") not in (None, "custom"):
            raise bad_value(f"{at}.type {fields.shown(tool.get('type'))} is a tool Anthropic defines; "
                            "the models here call custom tools only ({name, description, "
                            "input_schema})", f"{at}.type")
        fn = {"name": tool.get("name")}
        for theirs, ours in (("description", "description"), ("input_schema", "parameters"),
                             ("strict", "strict")):
            if tool.get(theirs) is not None:
                fn[ours] = tool[theirs]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: object, names: list[str]) -> tuple[str, str, bool]:
    """(OpenAI's choice, the tool it names or "", parallel calls allowed)."""
    if value is None:
        return "auto", "", True
    if not isinstance(value, dict) or value.get("type") not in CHOICES:
        raise bad_value(TOOL_CHOICE, "tool_choice")
    parallel = not fields.flag(value, "disable_parallel_tool_use",
                         "tool_choice.disable_parallel_tool_use")
    name = ""
    if value["type"] == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise bad_value("tool_choice.name must name one of the request's tools",
                            "tool_choice.name")
    choice, name = _ruled(chat_rules.tool_choice, CHOICES[value["type"]], name, names)
    return choice, name, parallel


def _thinking(value: object) -> tuple[bool | None, bool]:
    """(thinking on, off or not said, its text shown). ``budget_tokens`` is
    a ceiling this server does not keep apart: max_tokens bounds thinking
    and answer together, as it does at Anthropic."""
    if value is None:
        return None, True
    if not isinstance(value, dict) or value.get("type") not in THINKING_ON:
        raise bad_value(THINKING, "thinking")
    budget = value.get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                               or budget < 0):
        raise bad_value(f"thinking.budget_tokens must be a whole number of tokens; got "
                        f"{fields.shown(budget)}", "thinking.budget_tokens")
    display = value.get("display")
    if display not in (None, "summarized", "omitted"):
        raise bad_value(f"thinking.display must be summarized or omitted; got {fields.shown(display)}",
                        "thinking.display")
    return THINKING_ON[value["type"]], display != "omitted"


# -- the conversation -------------------------------------------------------------

@dataclass
class _Turns:
    """The engine's messages made so far, and for each the Anthropic names
    of the fields the rules name it by: "" for the message itself, then
    OpenAI's suffixes (``.tool_calls[0].id``)."""

    messages: list[Message] = field(default_factory=list)
    names: list[dict[str, str]] = field(default_factory=list)

    def add(self, message: Message, names: dict[str, str]) -> None:
        self.messages.append(message)
        self.names.append(names)


def _conversation(body: dict) -> tuple[Message, ...]:
    """``system`` and ``messages`` as the engine's turns, checked by the
    rules the chat completions meet (``chat_rules.conversation``: every
    tool_result answers a call an earlier turn made, each call's id used
    once), their texts bounded as a prompt."""
    turns = _Turns()
    if body.get("system") is not None:
        system = _texts(body["system"], "system", ("text",))
        if system:
            turns.add(Message("system", system), {"": "system"})
    messages = fields.objects(body.get("messages"), "messages", "messages", "{role, content} objects",
                        "an object with a role and a content", empty=False)
    for at, m in messages:
        if m.get("role") not in ("user", "assistant"):
            raise bad_value(f"{at}.role must be user or assistant (the system prompt is the "
                            f"request's system field); got {fields.shown(m.get('role'))}",
                            f"{at}.role")
        blocks = _blocks(m.get("content"), f"{at}.content")
        (_user if m["role"] == "user" else _assistant)(blocks, at, turns)
    last, final = messages[-1]
    if final["role"] == "assistant":
        raise bad_value(f"{last} is an assistant turn: continuing a reply the request began "
                        "(a prefill) is not supported by this server; end with a user turn",
                        last)
    out = turns.messages
    fields.sized("messages", "messages", len(out))  # tool results are turns of their own
    fields.asks(out, "messages")
    fields.bounded(values.utf8_size(t for m in out for t in chat_rules.texts(m)), "messages")
    try:
        chat_rules.conversation(out, _BlockNames(turns.names))
    except chat_rules.BadField as exc:
        raise bad_value(str(exc), exc.param) from None
    return tuple(out)


class _BlockNames(chat_rules.Names):
    """The engine's turn i as Anthropic names it: the block (or message)
    it came from, and the field by Anthropic's name (``tool_use_id``)."""

    def __init__(self, names: list[dict[str, str]]):
        self.names = names

    def _named(self, i: int, suffix: str) -> str:
        table = self.names[i]
        return table.get(suffix) or table[""] + _renamed(suffix)

    def turn(self, i: int) -> str:
        return self.names[i][""]

    def field(self, i: int, field: str) -> str:
        return self._named(i, f".{field}")

    def call(self, i: int, j: int) -> str:
        return self._named(i, f".tool_calls[{j}]")

    def call_id(self, i: int, j: int) -> str:
        return self._named(i, f".tool_calls[{j}].id")


def _blocks(content: object, where: str) -> list[tuple[str, dict]]:
    """A turn's content as (where, block): text is one text block."""
    if isinstance(content, str):
        return [(where, {"type": "text", "text": content})]
    item = "a content block (an object with a type)"
    out = fields.objects(content, where, "content parts", "content blocks (or text)", item)
    for at, block in out:
        if not isinstance(block.get("type"), str):
            raise bad_value(f"{at} must be {item}", at)
    return out


def _refused(block: dict, where: str, takes: str) -> NoReturn:
    raise bad_value(f"{where}.type is {fields.shown(block['type'])}: {takes}", f"{where}.type")


def _user(blocks: list[tuple[str, dict]], at: str, turns: _Turns) -> None:
    """A user turn: its text one turn, each tool_result a ``tool`` turn."""
    texts: list[str] = []

    def said() -> None:
        if texts:
            turns.add(Message("user", JOIN.join(texts)), {"": at})
            texts.clear()

    for where, block in blocks:
        if block["type"] == "text":
            texts.append(fields.text(f"{where}.text", block.get("text"), f"{where}.text"))
        elif block["type"] == "tool_result":
            said()
            result = _texts(block.get("content") or "", f"{where}.content", ("text",))
            if fields.flag(block, "is_error", f"{where}.is_error"):
                result = f"Error: {result}"
            call = block.get("tool_use_id")
            turns.add(Message("tool", result, tool_call_id=fields.text(
                f"{where}.tool_use_id", call, f"{where}.tool_use_id")), {"": where})
        else:
            _refused(block, where, "a user turn here takes text and tool_result blocks (the "
                                   "models read text only)")
    said()


def _assistant(blocks: list[tuple[str, dict]], at: str, turns: _Turns) -> None:
    """An assistant turn: its text, its reasoning (thinking blocks) and its
    calls (tool_use blocks), each call checked as the rules check one."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    names = {"": at}
    fields.sized(f"{at}.content", "tool calls", sum(b["type"] == "tool_use" for _, b in blocks))
    for where, block in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(fields.text(f"{where}.text", block.get("text"), f"{where}.text"))
        elif kind == "thinking":  # its signature is Anthropic's, or ours: nothing to check
            thoughts.append(fields.text(f"{where}.thinking", block.get("thinking"),
                                  f"{where}.thinking"))
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted reasoning: no model here can read it
        elif kind == "tool_use":
            given = block.get("input")
            if not isinstance(given, dict):
                raise bad_value(f"{where}.input must be an object (the tool's arguments by "
                                "name)", f"{where}.input")
            arguments = _ruled(chat_rules.arguments, given, f"{where}.function.arguments")
            calls.append(_ruled(chat_rules.tool_call,
                                ToolCall(block.get("id"), block.get("name"), arguments), where))
            names[f".tool_calls[{len(calls) - 1}]"] = where
            names[f".tool_calls[{len(calls) - 1}].id"] = f"{where}.id"
        else:
            _refused(block, where, "an assistant turn here takes text, thinking and tool_use "
                                   "blocks")
    turns.add(Message("assistant", JOIN.join(texts), reasoning=JOIN.join(thoughts),
                      tool_calls=tuple(calls)), names)


def _texts(value: object, where: str, kinds: tuple[str, ...]) -> str:
    """Text, or a list of text blocks joined (a system prompt, a tool
    result); another kind of block is refused, not dropped."""
    if isinstance(value, str):
        return fields.text(where, value, where)
    texts = []
    for at, block in _blocks(value, where):
        if block["type"] not in kinds:
            _refused(block, at, "here this server takes text blocks only")
        texts.append(fields.text(f"{at}.text", block.get("text"), f"{at}.text"))
    return JOIN.join(texts)


# -- responses ----------------------------------------------------------------------

def stop_reason(result: GenerationResult) -> tuple[str, str | None]:
    """Anthropic's words for why the reply ended, and the stop sequence
    that ended it, if one did."""
    reason = STOP_REASONS.get(result.summary.finish_reason, "end_turn")
    return reason, (result.stop_string or None) if reason == "stop_sequence" else None


def usage(summary: Summary) -> dict:
    """The token counts as Anthropic splits them: the prompt's tokens the
    target's cache already held are read from it (``cache_read``), the
    rest are input; nothing is written to a cache on request."""
    reused = summary.reused_prompt_tokens
    return {"input_tokens": summary.prompt_tokens - reused, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reused, "output_tokens": summary.new_tokens}


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: the SHA-256 of its text, in hex.
    Anthropic's is its proof that the block is the model's own; here it
    is only a fingerprint (no secret, never checked when the block comes
    back), there so that clients keep the block and send it back."""
    return hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def tool_id(call: ToolCall) -> str:
    """A call's id in Anthropic's form (``toolu_...``)."""
    return "toolu_" + call.id.removeprefix("call_") if call.id.startswith("call_") else call.id


def _event(obj: dict) -> dict:
    """An event of the stream (framed by ``Reply.frame``, named by its type)."""
    return obj


@dataclass
class _Block:
    """A content block as the reply writes it (its text in pieces, joined
    once at the end)."""

    kind: str
    pieces: list[str] = field(default_factory=list)
    call: ToolCall | None = None
    signature: str = ""

    def opened(self) -> dict:
        """The block as content_block_start carries it: empty."""
        if self.kind == "tool_use":
            return {"type": "tool_use", "id": tool_id(self.call), "name": self.call.name,
                    "input": {}}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "text", "text": ""}

    def whole(self, show_thinking: bool) -> dict:
        if self.kind == "tool_use":
            return {**self.opened(), "input": json.loads(self.call.arguments)}
        if self.kind == "thinking":
            return {"type": "thinking", "signature": self.signature,
                    "thinking": "".join(self.pieces) if show_thinking else ""}
        return {"type": "text", "text": "".join(self.pieces)}


class Reply:
    """One answer in Anthropic's form, built from the engine's steps: the
    events of a stream (``message_start``, ``ping``, then per block
    ``content_block_start``, its deltas and ``content_block_stop``, then
    ``message_delta`` and ``message_stop``), and the whole message.

    The reply's parts come in the order a stream sends them
    (``reply_stream.ReplyStream``, as every API face streams them); a block
    opens when the part changes: its reasoning is a thinking block
    (``thinking_delta``s, then its ``signature_delta``), its answer a text
    block, each call, once complete, a tool_use block (its arguments in one
    ``input_json_delta``). A reply that only calls tools has no text block."""

    closing = ""  # no line after the last event: message_stop ends it

    def __init__(self, req: Request, model: str):
        self.req, self.model = req, model
        self.parts = reply_stream.ReplyStream()
        self.content: list[_Block] = []
        self._open: _Block | None = None
        self._final: dict = {}

    @staticmethod
    def frame(event: dict) -> str:
        """One event as a server-sent event, named by its type."""
        return reply_stream.sse(event, named=True)

    def _message(self, content: list[dict], reason: str | None, sequence: str | None,
                 counts: dict) -> dict:
        return {"id": self.req.api.id, "type": "message", "role": "assistant",
                "model": self.model, "content": content, "stop_reason": reason,
                "stop_sequence": sequence, "usage": counts}

    def start(self) -> list[dict]:
        """The message's head: its counts come with ``message_delta`` (the
        prompt's are known when the reply ends)."""
        counts = {"input_tokens": 0, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 0}
        return [_event({"type": "message_start",
                        "message": self._message([], None, None, counts)}),
                _event({"type": "ping"})]

    def step(self, ev: StepEvent) -> list[dict]:
        return self._send(self.parts.step(ev))

    def end(self, result: GenerationResult) -> list[dict]:
        """What the steps did not carry, the last block closed, then why
        the reply ended, its counts and the ``speculative`` extension."""
        out = self._send(self.parts.end(result)) + self._close()
        reason, sequence = stop_reason(result)
        counts = usage(result.summary)
        extras = {"speculative": speculative(result.summary),
                  **({"warnings": list(result.notes)} if result.notes else {})}
        self._final = {**self._message([b.whole(self.req.show_thinking) for b in self.content],
                                       reason, sequence, counts), **extras}
        return out + [_event({"type": "message_delta",
                              "delta": {"stop_reason": reason, "stop_sequence": sequence},
                              "usage": counts, **extras}),
                      _event({"type": "message_stop"})]

    def error(self, error: ApiError) -> list[dict]:
        """An error after the stream began: Anthropic's ``error`` event."""
        return [error.answer(PATH)[1]]

    def body(self, result: GenerationResult) -> dict:
        """The whole message, as the stream's events assemble it."""
        self.end(result)
        return self._final

    def _send(self, parts: list[reply_stream.Part]) -> list[dict]:
        out = []
        for part, value in parts:
            out += (self._thinking(value) if part == REASONING else
                    self._text(value) if part == ANSWER else self._call(value))
        return out

    # -- the blocks -----------------------------------------------------------------
    def _index(self) -> int:
        return len(self.content) - 1

    def _begin(self, block: _Block) -> list[dict]:
        out = self._close()
        self._open = block
        self.content.append(block)
        return out + [_event({"type": "content_block_start", "index": self._index(),
                              "content_block": block.opened()})]

    def _delta(self, delta: dict) -> dict:
        return _event({"type": "content_block_delta", "index": self._index(), "delta": delta})

    def _close(self) -> list[dict]:
        block, self._open = self._open, None
        if block is None:
            return []
        out = []
        if block.kind == "thinking":
            block.signature = signature("".join(block.pieces))
            out.append(self._delta({"type": "signature_delta", "signature": block.signature}))
        return out + [_event({"type": "content_block_stop", "index": self._index()})]

    def _writing(self, kind: str) -> bool:
        return self._open is not None and self._open.kind == kind

    def _write(self, text: str) -> list[dict]:
        self._open.pieces.append(text)
        if self._open.kind == "thinking":
            return [self._delta({"type": "thinking_delta", "thinking": text})] \
                if self.req.show_thinking else []
        return [self._delta({"type": "text_delta", "text": text})]

    def _thinking(self, text: str) -> list[dict]:
        out = [] if self._writing("thinking") else self._begin(_Block("thinking"))
        return out + self._write(text)

    def _text(self, text: str) -> list[dict]:
        out = [] if self._writing("text") else self._begin(_Block("text"))
        return out + self._write(text)

    def _call(self, call: ToolCall) -> list[dict]:
        out = self._begin(_Block("tool_use", call=call))
        out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out + self._close()
