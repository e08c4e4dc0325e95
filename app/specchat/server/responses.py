"""OpenAI's Responses API (``POST /v1/responses``): its shapes, mapped onto
the chat completion's request.

The Responses API is what Codex-style clients and the OpenAI Agents SDK
speak by default. It is another face over the same engine request: its
``instructions`` and ``input`` items become the chat's messages (a
``function_call`` item a call of the assistant turn it follows, a
``function_call_output`` a ``tool`` turn, a ``reasoning`` item that turn's
reasoning), its flat function tools chat's tools, and every value is
checked by the rules the chat completions are (``engine/chat_rules.py``,
``specchat.values``), each refusal a 400 naming the field as this API names
it (``input[3].call_id``, ``tools[0].parameters``, ``reasoning.effort``).

The answer is a ``response`` object whose ``output`` holds a reasoning item
(the model's reasoning in the clear, under ``content``; no summaries are
written), a message item and one ``function_call`` item per call; streamed,
the same items arrive as the API's typed events, built from the same
reply parts the chat completions stream (``reply_stream.ReplyStream``), and
``response.completed`` carries the whole response, so a client's
assembled answer is the non-streamed one.

Nothing is stored: a response cannot be fetched, continued
(``previous_response_id``, ``conversation``) or run in the background
later, and a request that asks for any of that (or for ``store: true``)
is refused in words; ``store`` left out is answered as ``store: false``.
A client carries the conversation in ``input``, as the Agents SDK does
by default (and any client that sends ``store: false``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from specchat import values
from specchat.engine import chat_rules
from specchat.engine.events import (
    ANSWER,
    REASONING,
    ChatFormat,
    GenerationResult,
    Message,
    StepEvent,
    ToolCall,
)
from specchat.server import fields, protocol, reply_stream
from specchat.server.errors import ApiError, bad_value

# The chat completions' own checks, each a 400 naming its field: one place per rule.
from specchat.server.protocol import (
    MAX_TOKENS_CAP,
    ROLES,
    ApiRequest,
)

# The text parts of a message item, an earlier turn's reasoning, a call's output.
TEXT_PARTS = ("input_text", "output_text")
REASONING_PARTS = ("reasoning_text",)
SUMMARY_PARTS = ("summary_text",)
ITEMS = "message, function_call, function_call_output and reasoning items"
NOTHING_STORED = ("this server stores no responses (it keeps nothing between requests), so "
                  "{what}; send the whole conversation in input, the earlier output items "
                  "included")
# Fields that need a response stored on the server, refused in those words.
STATEFUL = {"previous_response_id": "there is no earlier response to continue",
            "conversation": "there is no conversation to add to",
            "background": "a response cannot run in the background and be fetched later",
            "prompt": "there is no stored prompt to use; send instructions and input"}


@dataclass(frozen=True)
class Asked:
    """A checked Responses request: the engine's request (the chat
    completion's, so it takes the same path), and the settings a
    ``response`` object repeats."""

    request: ApiRequest
    echo: dict = field(default_factory=dict)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- requests ---------------------------------------------------------------------

def parse(body: object, cap: int = MAX_TOKENS_CAP) -> Asked:
    """A Responses request body, checked; ``ApiError`` (400) names the
    first field that is not acceptable."""
    model = fields.model(body)
    _refuse_unsupported(body)
    tools = fields.ruled(chat_rules.tools, body.get("tools"), flat=True)
    names = [t["name"] for t in body["tools"]] if tools else []
    choice, name = _tool_choice(body.get("tool_choice"), names)
    instructions = body.get("instructions")
    if instructions is not None:
        instructions = fields.text("instructions", instructions, "instructions")
    turns = _turns(body.get("input"), instructions)
    messages = tuple(t.message() for t in turns)
    fields.asks(messages, "input")
    fields.ruled(chat_rules.conversation, messages, _ItemNames(turns))
    fields.bounded(values.utf8_size(t for m in messages for t in chat_rules.texts(m)), "input")
    parallel = body.get("parallel_tool_calls") is None or fields.flag(body, "parallel_tool_calls")
    effort = fields.ruled(chat_rules.effort, _object(body, "reasoning").get("effort"),
                    "reasoning.effort")
    sampling = fields.sampling(body)
    max_tokens = fields.max_tokens(body, cap, ("max_output_tokens",))
    request = ApiRequest(
        kind="chat", id=new_id("resp"), model=model, stream=fields.flag(body, "stream"),
        messages=messages, max_tokens=max_tokens, sampling=sampling,
        stop=fields.stop(body.get("stop")), tools=tools, tool_choice=choice, tool_name=name,
        parallel_tool_calls=parallel,
        switches=fields.ruled(chat_rules.switches, body.get("chat_template_kwargs")),
        reasoning_effort=effort)
    echo = {"instructions": instructions, "max_output_tokens": max_tokens,
            "metadata": _metadata(body.get("metadata")), "parallel_tool_calls": parallel,
            "previous_response_id": None, "reasoning": {"effort": effort or None,
                                                        "summary": None},
            "store": False, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "truncation": body.get("truncation") or "disabled",
            "user": body.get("user") if isinstance(body.get("user"), str) else None}
    return Asked(request, echo)


def check_format(asked: Asked, fmt: ChatFormat) -> None:
    """What depends on the served model, as the chat completions check it
    (``protocol.check_format``), the effort named as this API names it."""
    protocol.check_format(asked.request, fmt, effort_where="reasoning.effort")


def _refuse_unsupported(body: dict) -> None:
    """What this server cannot do, refused by name (what only shapes the
    reply for OpenAI's own service, such as ``service_tier``, ``user``,
    ``prompt_cache_key``, ``reasoning.summary`` or ``text.verbosity``, is
    not looked at)."""
    for name, what in STATEFUL.items():
        if body.get(name) not in (None, False):
            raise bad_value(NOTHING_STORED.format(what=what) + f" (leave {name} out)", name)
    if body.get("store") not in (None, False):
        raise bad_value(NOTHING_STORED.format(what="a response cannot be fetched or continued "
                                                   "later by its id") + " (send store false or "
                                                                        "leave it out)", "store")
    if body.get("max_tool_calls") is not None:
        raise bad_value("max_tool_calls is not supported by this server; parallel_tool_calls "
                        "false ends a reply after its first call", "max_tool_calls")
    if body.get("top_logprobs") not in (None, 0):
        raise bad_value("log-probabilities are not supported by this server", "top_logprobs")
    include = body.get("include")
    if include is not None and (not isinstance(include, list)
                                or "message.output_text.logprobs" in include):
        raise bad_value("include may list reasoning.encrypted_content and the like (ignored: "
                        "reasoning comes in the clear); log-probabilities are not supported "
                        "by this server", "include")
    if body.get("context_management") is not None:
        raise bad_value("context_management (compaction on OpenAI's servers) is not available "
                        "here; send the conversation as it should be read", "context_management")
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise bad_value(f"truncation must be auto or disabled; got {fields.shown(body['truncation'])}",
                        "truncation")
    text = _object(body, "text")
    fmt = text.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise bad_value(f"text.format {fields.shown(kind)} (structured output) is not supported by "
                        "this server: it cannot hold a reply to a schema; send {\"type\": "
                        "\"text\"} or leave it out, and ask for JSON in the instructions",
                        "text.format")


def _object(body: dict, name: str) -> dict:
    """An optional object field (``reasoning``, ``text``): {} if absent."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_value(f"{name} must be an object; got {fields.shown(value)}", name)
    return value


def _metadata(value: object) -> dict | None:
    """Echoed back as it came: an object of text values (OpenAI's shape)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise bad_value("metadata must be an object of text values", "metadata")
    return value


def _tool_choice(choice: object, names: list[str]) -> tuple[str, str]:
    """The Responses API's tool_choice: a word, or {"type": "function",
    "name": ...} (a call of that function is required)."""
    if choice is None:
        return "auto", ""
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise bad_value("tool_choice must be auto, none, required or {\"type\": \"function\", "
                            f"\"name\": ...}}; got the type {fields.shown(choice.get('type'))} (only "
                            "function tools are served here)", "tool_choice")
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise bad_value("tool_choice.name must name one of the request's tools",
                            "tool_choice.name")
        return fields.ruled(chat_rules.tool_choice, "required", name, names,
                      name_where="tool_choice.name")
    return fields.ruled(chat_rules.tool_choice, choice, "", names)


@dataclass
class _Turn:
    """One chat message being made from input items, and where each of
    its parts came from (what a refusal names)."""

    role: str
    at: str  # the item it starts at: "input[3]", "input" (text), "instructions"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    call_at: list[str] = field(default_factory=list)
    call_id: str = ""

    def message(self) -> Message:
        return Message(self.role, "".join(self.content), reasoning="\n\n".join(self.reasoning),
                       tool_calls=tuple(self.calls), tool_call_id=self.call_id)


class _ItemNames(chat_rules.Names):
    """A turn's fields named by the input items they came from."""

    def __init__(self, turns: list[_Turn]):
        self.turns = turns

    def turn(self, i: int) -> str:
        return self.turns[i].at

    def field(self, i: int, field: str) -> str:
        return f"{self.turn(i)}.{'call_id' if field == 'tool_call_id' else field}"

    def call(self, i: int, j: int) -> str:
        return self.turns[i].call_at[j]

    def call_id(self, i: int, j: int) -> str:
        return f"{self.call(i, j)}.call_id"


def _turns(value: object, instructions: str | None) -> list[_Turn]:
    """``instructions`` (a system turn first) and ``input``: text (a user
    turn) or a list of items. An assistant turn is made of the items of
    one reply in the order a response gives them: its reasoning, its
    message and its function calls."""
    turns = [_Turn("system", "instructions", [instructions])] if instructions is not None else []
    if isinstance(value, str):
        return [*turns, _Turn("user", "input", [fields.text("input", value, "input")])]
    if not isinstance(value, list) or not value:
        raise bad_value(f"input must be text or a non-empty list of items ({ITEMS})", "input")
    fields.sized("input", "input items", len(value))
    reply: _Turn | None = None  # the assistant turn items of a reply go into

    def replying(at: str, fresh: bool) -> _Turn:
        nonlocal reply
        if reply is None or fresh:
            reply = _Turn("assistant", at)
            turns.append(reply)
        return reply

    for k, item in enumerate(value):
        at = f"input[{k}]"
        if not isinstance(item, dict):
            raise bad_value(f"{at} must be an item object ({ITEMS})", at)
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role is None or role == "tool":
                raise bad_value(f"{at}.role must be one of user, assistant, system, developer; "
                                f"got {fields.shown(item.get('role'))}", f"{at}.role")
            text = fields.content(item.get("content"), f"{at}.content", TEXT_PARTS)
            if role == "assistant":
                replying(at, fresh=bool(reply and (reply.content or reply.calls))).content.append(
                    text)
            else:
                turns.append(_Turn(role, at, [text]))
                reply = None
        elif kind == "reasoning":
            replying(at, fresh=True).reasoning.append(_reasoning(item, at))
        elif kind == "function_call":
            turn = replying(at, fresh=False)
            fields.sized(at, "tool calls", len(turn.calls) + 1)
            turn.calls.append(ToolCall(
                fields.ruled(chat_rules.call_id, item.get("call_id"), f"{at}.call_id"),
                fields.ruled(chat_rules.name, item.get("name"), f"{at}.name"),
                fields.ruled(chat_rules.arguments, item.get("arguments"), f"{at}.arguments")))
            turn.call_at.append(at)
        elif kind == "function_call_output":
            turns.append(_Turn("tool", at, [_output(item.get("output"), f"{at}.output")],
                               call_id=fields.ruled(chat_rules.call_id, item.get("call_id"),
                                              f"{at}.call_id")))
            reply = None
        elif kind == "item_reference":
            raise bad_value(NOTHING_STORED.format(what=f"{at} refers to an item that is not "
                                                       "here"), at)
        else:
            raise bad_value(f"{at} is a {fields.shown(kind)} item; this server takes {ITEMS} (its "
                            "tools are functions only)", f"{at}.type")
    return turns


def _reasoning(item: dict, at: str) -> str:
    """An earlier turn's reasoning: its text (``content``, as this server
    gives it) or else its summary; reasoning encrypted by another service
    cannot be read, and counts as none."""
    content = item.get("content")
    if content:
        return fields.content(content, f"{at}.content", REASONING_PARTS)
    summary = item.get("summary")
    if summary is None:
        return ""
    if not isinstance(summary, list):
        raise bad_value(f"{at}.summary must be a list of summary_text parts", f"{at}.summary")
    fields.sized(f"{at}.summary", "content parts", len(summary))
    return "\n\n".join(fields.content([part], f"{at}.summary", SUMMARY_PARTS) for part in summary)


def _output(value: object, where: str) -> str:
    """A call's result: text, or a list of text parts."""
    if not isinstance(value, str | list):
        raise bad_value(f"{where} must be text or a list of input_text parts", where)
    return fields.content(value, where, TEXT_PARTS)


# -- responses ----------------------------------------------------------------------

def status(result: GenerationResult) -> str:
    """"incomplete" when the token budget ran out, else "completed"."""
    return "incomplete" if result.summary.finish_reason == "length" else "completed"


def usage(result: GenerationResult) -> dict:
    """Tokens in and out; ``cached_tokens``: the prompt's tokens the target's
    cache already held (an earlier request's prefix, not computed again),
    ``cache_write_tokens`` the rest, computed now and kept for the next;
    ``reasoning_tokens``: the reply's tokens of reasoning, its markers included."""
    s = result.summary
    return {"input_tokens": s.prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.reused_prompt_tokens,
                                     "cache_write_tokens": s.prompt_tokens
                                     - s.reused_prompt_tokens},
            "output_tokens": s.new_tokens,
            "output_tokens_details": {"reasoning_tokens": result.parts.count(REASONING)},
            "total_tokens": s.prompt_tokens + s.new_tokens}


def _reasoning_item(text: str | None, item_status: str, item_id: str = "") -> dict:
    """The reasoning, in the clear (``content``); no summary is written."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": [],
            "content": content, "status": item_status}


def _message_item(text: str | None, item_status: str, item_id: str = "") -> dict:
    content = [] if text is None else [_part(ANSWER, text)]
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant",
            "status": item_status, "content": content}


def _call_item(call: ToolCall, arguments: str, item_status: str, item_id: str = "") -> dict:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": arguments, "status": item_status}


def _part(part: str, text: str) -> dict:
    if part == REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": []}


def _cut(items: list[dict], item_status: str) -> list[dict]:
    """A reply cut by its token budget: its last item, unless a complete
    call, is incomplete."""
    if item_status == "incomplete" and items and items[-1]["type"] != "function_call":
        items[-1]["status"] = item_status
    return items


def _response(asked: Asked, model: str, created: int, state: str, output: list[dict],
              result: GenerationResult | None = None, error: ApiError | None = None) -> dict:
    out = {"id": asked.request.id, "object": "response", "created_at": created,
           "status": state, "completed_at": int(time.time()) if result is not None else None,
           "error": None if error is None else {
               "code": "server_error" if error.status >= 500 else "invalid_prompt",
               "message": error.message},
           "incomplete_details": {"reason": "max_output_tokens"} if state == "incomplete"
           else None, "model": model, "output": output, **asked.echo, "usage": None}
    if result is not None:
        s = result.summary
        out.update(usage=usage(result), speculative=protocol.speculative(s),
                   **protocol._extras(result))
    return out


def response(asked: Asked, result: GenerationResult, model: str) -> dict:
    """The whole answer of a request that did not stream: its reasoning,
    its message (none for a reply that only calls tools) and its calls."""
    output = []
    if result.reasoning:
        output.append(_reasoning_item(result.reasoning, "completed"))
    text = protocol.content(result)
    if text:
        output.append(_message_item(text, "completed"))
    output += [_call_item(c, c.arguments, "completed") for c in result.tool_calls]
    state = status(result)
    return _response(asked, model, int(time.time()), state, _cut(output, state), result)


class Events:
    """The streamed form of one answer: the Responses API's typed events,
    each with its ``sequence_number``. Each part of the reply
    (``reply_stream.ReplyStream``) opens its item when it starts (a reasoning
    or a message item, with its one content part) and closes the one
    before; a call is one item, added, its arguments, done. The last event,
    ``response.completed`` (or ``response.incomplete``), carries the whole
    response; a failure after the stream began is an ``error`` event and
    ``response.failed``."""

    closing = ""  # no line after the last event: response.completed ends it

    def __init__(self, asked: Asked, model: str):
        self.asked = asked
        self.model = model
        self.created = int(time.time())
        self.parts = reply_stream.ReplyStream()
        self.output: list[dict] = []  # the items so far, the last maybe open
        self._open: str | None = None  # REASONING or ANSWER: the last item is open for it
        self._texts: list[str] = []  # the open item's text so far
        self._seq = 0

    @staticmethod
    def frame(event: dict) -> str:
        """One event as a server-sent event, named by its type."""
        return reply_stream.sse(event, named=True)

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _state(self, state: str, **kw) -> dict:
        return _response(self.asked, self.model, self.created, state, list(self.output), **kw)

    def start(self) -> list[dict]:
        return [self._event("response.created", response=self._state("in_progress")),
                self._event("response.in_progress", response=self._state("in_progress"))]

    def step(self, ev: StepEvent) -> list[dict]:
        return self._send(self.parts.step(ev))

    def end(self, result: GenerationResult) -> list[dict]:
        """What the steps did not carry, the open item closed, and the
        whole response."""
        state = status(result)
        out = self._send(self.parts.end(result)) + self._close(state)
        out.append(self._event(f"response.{state}", response=self._state(state, result=result)))
        return out

    def error(self, exc: ApiError) -> list[dict]:
        return [self._event("error", code=exc.code, message=exc.message, param=exc.param),
                self._event("response.failed", response=self._state("failed", error=exc))]

    def _send(self, parts: list[reply_stream.Part]) -> list[dict]:
        out = []
        for part, value in parts:
            if part in (REASONING, ANSWER):
                out += self._text(part, value)
            else:
                out += self._close("completed") + self._call(value)
        return out

    def _item(self) -> tuple[int, str]:
        return len(self.output) - 1, self.output[-1]["id"]

    def _text(self, part: str, text: str) -> list[dict]:
        out = [] if self._open == part else self._close("completed") + self._start(part)
        self._texts.append(text)
        index, item_id = self._item()
        if part == REASONING:
            return [*out, self._event("response.reasoning_text.delta", item_id=item_id,
                                      output_index=index, content_index=0, delta=text)]
        return [*out, self._event("response.output_text.delta", item_id=item_id,
                                  output_index=index, content_index=0, delta=text, logprobs=[])]

    def _start(self, part: str) -> list[dict]:
        make = _reasoning_item if part == REASONING else _message_item
        self.output.append(make(None, "in_progress"))
        self._open, self._texts = part, []
        index, item_id = self._item()
        return [self._event("response.output_item.added", output_index=index,
                            item=dict(self.output[-1])),
                self._event("response.content_part.added", item_id=item_id, output_index=index,
                            content_index=0, part=_part(part, ""))]

    def _close(self, state: str) -> list[dict]:
        """The open item done: its text, its part, the item (incomplete
        if the budget ran out in it)."""
        if self._open is None:
            return []
        part, text = self._open, "".join(self._texts)
        index, item_id = self._item()
        make = _reasoning_item if part == REASONING else _message_item
        self.output[-1] = _cut([make(text, "completed", item_id)], state)[0]
        self._open, self._texts = None, []
        done = (self._event("response.reasoning_text.done", item_id=item_id, output_index=index,
                            content_index=0, text=text) if part == REASONING else
                self._event("response.output_text.done", item_id=item_id, output_index=index,
                            content_index=0, text=text, logprobs=[]))
        return [done,
                self._event("response.content_part.done", item_id=item_id, output_index=index,
                            content_index=0, part=_part(part, text)),
                self._event("response.output_item.done", output_index=index,
                            item=self.output[-1])]

    def _call(self, call: ToolCall) -> list[dict]:
        self.output.append(_call_item(call, "", "in_progress"))
        index, item_id = self._item()
        added = self._event("response.output_item.added", output_index=index,
                            item=dict(self.output[-1]))
        self.output[-1] = _call_item(call, call.arguments, "completed", item_id)
        return [added,
                self._event("response.function_call_arguments.delta", item_id=item_id,
                            output_index=index, delta=call.arguments),
                self._event("response.function_call_arguments.done", item_id=item_id,
                            output_index=index, arguments=call.arguments),
                self._event("response.output_item.done", output_index=index,
                            item=self.output[-1])]
