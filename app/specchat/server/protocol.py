"""OpenAI's request and response bodies, and the engine's values they map to.

Pure functions over plain dicts (no HTTP, no engine thread), so every rule
about what a client may send is in one place and testable on its own. Each
number goes through ``specchat.values``, the table the CLI, the settings
dialog and the engine check against, so a bad temperature gets the same one
line here as anywhere else, as a 400 naming its parameter.

Fields this server cannot honour (``n`` above 1, log-probabilities, several
prompts at once) are refused by name rather than ignored, so a client never
gets less than it asked for without knowing; fields that only shape the
reply's form for OpenAI's own service (``user`` and the like) are ignored,
as OpenAI-style local servers do.

Tools, tool calls and the chat template's switches follow the engine's own
rules (``engine/chat_rules.py``): the same checks, each refusal a 400 naming
its field (``messages[3].tool_call_id``). What depends on the model (does
its template take tools, which switches does it read) is checked against
the served pair's ``ChatFormat`` before the request waits (``check_format``).
A reply comes back in its parts: ``content``, ``reasoning_content`` (the
name DeepSeek's API, vLLM and LM Studio use) and ``tool_calls``, streamed as
OpenAI streams them; what did not go as asked is said in ``warnings``.

Every list a request carries is bounded in count and in total length
(``specchat.values``: stop strings, messages, a message's content parts and
tool calls, tools, template switches, the prompt in UTF-8 bytes or token
ids), each before its items are read, so no request costs the engine
thread more than those bounds allow: one past a bound never waits for its
turn.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from specchat import values
from specchat.engine import chat_rules
from specchat.engine.events import (
    ANSWER,
    REASONING,
    ChatFormat,
    DraftSettings,
    GenerateRequest,
    GenerationResult,
    Message,
    SamplingParams,
    StepEvent,
    Summary,
    ToolCall,
)
from specchat.server import fields, reply_stream
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
    tools: str = ""  # JSON text (chat_rules.tools)
    tool_choice: str = "auto"
    tool_name: str = ""
    parallel_tool_calls: bool = True
    switches: tuple[tuple[str, chat_rules.Scalar], ...] = ()  # chat_template_kwargs
    reasoning_effort: str = ""

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
            tools=self.tools,
            tool_choice=self.tool_choice,
            tool_name=self.tool_name,
            parallel_tool_calls=self.parallel_tool_calls,
            template_switches=self.switches,
            reasoning_effort=self.reasoning_effort,
        )


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


# -- requests ---------------------------------------------------------------------

def parse(kind: Kind, body: object, cap: int = MAX_TOKENS_CAP) -> ApiRequest:
    """A chat or completion request body, checked; ``ApiError`` (400) names
    the first field that is not acceptable."""
    model = fields.model(body)
    _refuse_unsupported(kind, body)
    stream = fields.flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_value("stream_options must be an object", "stream_options")
    include_usage = stream and fields.flag(options or {}, "include_usage", "stream_options")
    budget = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    common = dict(kind=kind, id=new_id(kind), model=model, stream=stream,
                  include_usage=include_usage, max_tokens=fields.max_tokens(body, cap, budget),
                  sampling=fields.sampling(body), stop=fields.stop(body.get("stop")))
    if kind == "chat":
        tools = fields.ruled(chat_rules.tools, body.get("tools"))
        names = [t["function"]["name"] for t in body["tools"]] if tools else []
        choice, name = _tool_choice(body.get("tool_choice"), names)
        messages = _messages(body.get("messages"))
        fields.ruled(chat_rules.conversation, messages)
        fields.bounded(chat_rules.prompt_bytes(messages, tools), "messages")
        parallel = body.get("parallel_tool_calls") is None or fields.flag(body, "parallel_tool_calls")
        return ApiRequest(messages=messages, tools=tools, tool_choice=choice, tool_name=name,
                          parallel_tool_calls=parallel,
                          switches=fields.ruled(chat_rules.switches, body.get("chat_template_kwargs")),
                          reasoning_effort=fields.ruled(chat_rules.effort, body.get("reasoning_effort")),
                          **common)
    text, ids = _prompt(body.get("prompt"))
    if text is not None:
        fields.bounded(values.utf8_size([text]), "prompt")
    return ApiRequest(prompt=text, prompt_ids=ids, **common)


def check_format(req: ApiRequest, fmt: ChatFormat, effort_where: str = "reasoning_effort") -> None:
    """What depends on the served model, checked before the request waits
    for its turn: each template switch one its template reads, a
    reasoning effort it has a switch for, and tools it can take (a 400
    naming the field; the engine checks the same for every caller)."""
    if req.kind != "chat":
        return
    fields.ruled(chat_rules.template_variables, fmt, req.switches, req.reasoning_effort,
           effort_where=effort_where)
    fields.ruled(chat_rules.offered, fmt, bool(req.tools), req.tool_choice)


def _tool_choice(choice: object, names: list[str]) -> tuple[str, str]:
    """OpenAI's tool_choice: a word, or {"type": "function", "function":
    {"name": ...}} (a call of that function is required)."""
    if choice is None:
        return "auto", ""
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
            raise bad_value("tool_choice must be auto, none, required or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}} (allowed_tools and custom tools are "
                            "not supported here)", "tool_choice")
        name = choice["function"].get("name")
        if not isinstance(name, str) or not name:
            raise bad_value("tool_choice.function.name must name one of the request's tools",
                            "tool_choice.function.name")
        return fields.ruled(chat_rules.tool_choice, "required", name, names)
    return fields.ruled(chat_rules.tool_choice, choice, "", names)


def _refuse_unsupported(kind: Kind, body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_value("this server returns one choice per request: n must be 1", "n")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) not in (None, False, 0):  # absent or off
            raise bad_value("log-probabilities are not supported by this server", name)
    if kind == "chat":
        for name in ("functions", "function_call"):  # OpenAI's deprecated form of tools
            if body.get(name) is not None:
                raise bad_value(f"{name} is the deprecated form of tools; send tools (and "
                                "tool_choice) instead", name)
    if kind == "completion":
        if body.get("echo"):
            raise bad_value("echo is not supported by this server", "echo")
        if body.get("best_of") not in (None, 1):
            raise bad_value("best_of must be 1 on this server", "best_of")
        if body.get("suffix"):
            raise bad_value("suffix (fill-in-the-middle) is not supported by this server",
                            "suffix")


def _messages(messages: object) -> tuple[Message, ...]:
    out = []
    calls = 0  # in all, each message's counted before its calls are read
    for where, m in fields.objects(messages, "messages", "messages", "{role, content} objects",
                             "an object with a role and a content", empty=False):
        if isinstance(m.get("tool_calls"), list):
            calls += len(m["tool_calls"])
            fields.sized(f"{where}.tool_calls", "tool calls in all", calls)
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise bad_value(f"{where}.role must be one of {', '.join(ROLES)}; "
                            f"got {fields.shown(m.get('role'))}", f"{where}.role")
        reasoning_key = "reasoning_content" if m.get("reasoning_content") is not None \
            else "reasoning"  # DeepSeek's and vLLM's name, or vLLM's newer one
        reasoning = m.get(reasoning_key)
        out.append(Message(
            role, fields.content(m.get("content"), f"{where}.content"),
            reasoning=fields.text(f"{where}.{reasoning_key}", reasoning, f"{where}.{reasoning_key}")
            if reasoning is not None else "",
            tool_calls=_tool_calls(m.get("tool_calls"), f"{where}.tool_calls"),
            tool_call_id=fields.text(f"{where}.tool_call_id", m.get("tool_call_id"),
                               f"{where}.tool_call_id") if m.get("tool_call_id") is not None
            else ""))
    fields.asks(out, "messages")
    return tuple(out)


def _tool_calls(calls: object, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's calls in OpenAI's shape: {id, type:
    "function", function: {name, arguments}}."""
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise bad_value(f"{where} must be a list of tool calls", where)
    fields.sized(where, "tool calls", len(calls))
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_value(f"{at} must be a tool call: {{id, type: \"function\", function: "
                            "{name, arguments}}", at)
        if call.get("type", "function") != "function":
            raise bad_value(f"{at}.type must be \"function\"; got {fields.shown(call.get('type'))}",
                            f"{at}.type")
        fn = call["function"]
        arguments = fields.ruled(chat_rules.arguments, fn.get("arguments"), f"{at}.function.arguments")
        out.append(fields.ruled(chat_rules.tool_call, ToolCall(call.get("id"), fn.get("name"),
                                                         arguments), at))
    return tuple(out)


def _prompt(prompt: object) -> tuple[str | None, tuple[int, ...] | None]:
    """A completion's prompt: text or token ids (OpenAI takes both), one of them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return fields.text("the prompt", prompt, "prompt"), None
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str | list):
        fields.as_400("prompt", values.prompt_tokens, len(prompt))  # before reading them
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return None, tuple(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(
            isinstance(p, str | list) for p in prompt):
        raise bad_value("this server takes one prompt per request", "prompt")
    raise bad_value("prompt must be a non-empty string or a list of token ids", "prompt")


# -- responses ----------------------------------------------------------------------

def finish_reason(summary: Summary) -> str:
    """OpenAI's words: "length" when the token budget ran out, "tool_calls"
    for a reply that ended calling tools, "stop" for an end token or a stop
    string."""
    if summary.finish_reason in ("length", "tool_calls"):
        return summary.finish_reason
    return "stop"


def usage(summary: Summary) -> dict:
    """The token counts; ``cached_tokens``: the prompt's tokens the
    target's cache already held (a conversation's earlier turns), which
    were not read again."""
    return {"prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.new_tokens,
            "total_tokens": summary.prompt_tokens + summary.new_tokens,
            "prompt_tokens_details": {"cached_tokens": summary.reused_prompt_tokens}}


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


def tool_call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def content(result: GenerationResult) -> str | None:
    """A reply's answer; none (null, as OpenAI's) for one that only calls
    tools, whatever whitespace it wrote around its calls."""
    return None if result.tool_calls and not result.answer.strip() else result.answer


def _extras(result: GenerationResult) -> dict:
    """What did not go as asked (a call that could not be read, a required
    call not made), in words: an extension clients keep as they find it."""
    return {"warnings": list(result.notes)} if result.notes else {}


def response(req: ApiRequest, result: GenerationResult, model: str) -> dict:
    """The whole answer of a request that did not stream."""
    s, chat = result.summary, req.kind == "chat"
    if chat:
        message = {"role": "assistant", "content": content(result)}
        if result.reasoning:
            message["reasoning_content"] = result.reasoning
        if result.tool_calls:
            message["tool_calls"] = [tool_call(c) for c in result.tool_calls]
        text = {"message": message}
    else:
        text = {"text": result.text}
    choice = {"index": 0, **text, "logprobs": None, "finish_reason": finish_reason(s)}
    return {**_head(req, "chat.completion" if chat else "text_completion", int(time.time()), model),
            "choices": [choice], "usage": usage(s), "speculative": speculative(s),
            **_extras(result)}


class Chunks:
    """The streamed form of one answer: the chunks, in order. A chat reply
    streams its parts (``ReplyStream``) as OpenAI's deltas: ``content``,
    ``reasoning_content`` and each tool call once it is complete (its id
    and name, then its arguments), so what a client assembles is the call
    the whole answer carries."""

    closing = "data: [DONE]\n\n"  # the line after the last chunk

    def __init__(self, req: ApiRequest, model: str):
        self.req = req
        self.model = model
        self.created = int(time.time())
        self.parts = reply_stream.ReplyStream(split=req.kind == "chat")
        self._calls = 0  # tool calls streamed

    @staticmethod
    def frame(chunk: dict) -> str:
        """One chunk as a server-sent event."""
        return reply_stream.sse(chunk)

    def _chunk(self, choice: dict | None, **extra) -> dict:
        obj = "chat.completion.chunk" if self.req.kind == "chat" else "text_completion"
        return {**_head(self.req, obj, self.created, self.model),
                "choices": [choice] if choice is not None else [], **extra}

    def _choice(self, delta: dict, finish: str | None = None) -> dict:
        if self.req.kind == "chat":
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta.get("content") or "", "logprobs": None,
                "finish_reason": finish}

    def _delta(self, delta: dict) -> dict:
        return self._chunk(self._choice(delta))

    def start(self) -> list[dict]:
        """A chat stream opens with the assistant's role, as OpenAI's does."""
        return [self._delta({"role": "assistant", "content": ""})] if self.req.kind == "chat" \
            else []

    def _deltas(self, parts: list[reply_stream.Part]) -> list[dict]:
        out = []
        for part, value in parts:
            if part == ANSWER:
                out.append(self._delta({"content": value}))
            elif part == REASONING:
                out.append(self._delta({"reasoning_content": value}))
            else:  # a complete call: its index, id and name, then its arguments
                index = self._calls
                self._calls += 1
                out += [self._delta({"tool_calls": [{"index": index, "id": value.id,
                                                     "type": "function", "function": {
                                                         "name": value.name, "arguments": ""}}]}),
                        self._delta({"tool_calls": [{"index": index,
                                                     "function": {"arguments": value.arguments}}]})]
        return out

    def text(self, text: str) -> list[dict]:
        """Answer text (a completion's text) as its deltas."""
        return self._deltas(self.parts.answer(text))

    def step(self, ev: StepEvent) -> list[dict]:
        return self._deltas(self.parts.step(ev))

    def end(self, result: GenerationResult) -> list[dict]:
        """Anything the steps did not carry, the finish reason with the
        ``speculative`` extension (and ``warnings``), and the usage chunk
        if it was asked for."""
        s = result.summary
        out = self._deltas(self.parts.end(result))
        out.append(self._chunk(self._choice({}, finish_reason(s)), speculative=speculative(s),
                               **_extras(result)))
        if self.req.include_usage:
            out.append(self._chunk(None, usage=usage(s), speculative=speculative(s)))
        return out

    def error(self, exc: ApiError) -> list[dict]:
        """A failure after the stream began: OpenAI's error body, which its
        clients raise."""
        return [exc.body()]


