"""A reply split, as it streams, into its parts: reasoning, answer, tool calls.

Built on mlx-lm's own pieces: ``make_text_state_machine`` reads the
tokenizer wrapper's markers (``think_start``/``think_end``,
``tool_call_start``/``tool_call_end``, a Python renderer's response format)
into a ``TextStateMachine``, which follows the decoded text, strips the
markers and holds back what may still become one; a call's text is read by
the wrapper's ``tool_parser`` (mlx-lm's ``tool_parsers``). gpt-oss's
harmony format, which mlx-lm has no parser for, is a transition table of
the same machine here (``HARMONY``): its messages are channels
(``<|channel|>analysis<|message|>`` ... ``<|end|>`` is reasoning, ``final``
the answer, ``commentary to=functions.NAME ... <|message|>`` a call).

The split is only over what was decoded: the ids are the loop's, whatever
the split makes of them, so speculation keeps greedy output token for token
plain decoding's. Each piece of text a token releases goes in once
(``feed``): it returns the (part, text) segments it released, the token's
part (a marker belongs to the part it opens or closes), and the calls it
completed. A call that cannot be read is kept as answer text, its reason
said in ``notes`` and the log, never raised.

A prompt may open a part itself: a template that ends its generation
prompt with ``<think>`` (the reply starts as reasoning, as in mlx-lm's
server), or a tool call SpecChat starts for ``tool_choice`` (``prefill``:
the call's opening, and its function's name where the format writes it
first, appended to the prompt), which ``prime`` reads before the reply.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mlx_lm.generate import TextStateMachine, make_text_state_machine

from specchat import records
from specchat.engine import chat_rules
from specchat.engine.events import ANSWER, REASONING, TOOL, ChatFormat, GenerateRequest, ToolCall

log = logging.getLogger("specchat.engine")

# The machine's states and the parts they are; any other state is the
# format's own structure (a harmony header), in no part.
PART_OF = {"normal": ANSWER, "reasoning": REASONING, "tool": TOOL, "toolhead": TOOL}
# gpt-oss's harmony format as transitions of mlx-lm's TextStateMachine. A
# reply starts in a header (the prompt ends with ``<|start|>assistant``);
# a header's channel says what its message is; a message ends with
# ``<|end|>`` (``<|return|>`` and ``<|call|>`` end the reply, as end tokens).
_ENDS = [("<|end|>", "between"), ("<|return|>", "between"), ("<|call|>", "between")]
HARMONY = {
    "header": [("<|channel|>analysis<|message|>", "reasoning"),
               ("<|channel|>final<|message|>", "normal"),
               ("to=functions.", "toolhead"),
               ("<|message|>", "normal")],  # another channel (a preamble): the answer
    "toolhead": [("<|message|>", "tool")],  # the function's name, then its format
    "reasoning": _ENDS,
    "normal": _ENDS,
    "tool": _ENDS,
    "between": [("<|start|>", "header")],
}
_HARMONY_NAME = re.compile(r"\s*([A-Za-z0-9_-]+)")


@dataclass
class Released:
    """What one piece of text released: its (part, text) segments, the
    part of the token that released it, and the calls it completed."""

    segments: list[tuple[str, str]] = field(default_factory=list)
    part: str = ANSWER
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, other: Released) -> None:
        self.segments += other.segments
        self.calls += other.calls


def merged(segments: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Segments with the empty ones dropped and neighbours of one part joined."""
    out: list[tuple[str, str]] = []
    for part, text in segments:
        if not text:
            continue
        if out and out[-1][0] == part:
            out[-1] = (part, out[-1][1] + text)
        else:
            out.append((part, text))
    return tuple(out)


class ReplySplitter:
    """One reply's parts, as its text streams in (no MLX; one per request).

    ``machine``: mlx-lm's TextStateMachine for the format, or None for a
    reply that is all answer (a model without markers, a completion).
    ``parse(head, text)``: a call's text (and, in harmony, its header) as
    mlx-lm's parsers return calls. ``refused``: why no call is taken (the
    request offered no tools, or tool_choice none): a call the model
    writes anyway is returned as text. ``required``/``tool_name``: what
    tool_choice asked for, said in ``notes`` when the reply did not make it.
    """

    def __init__(self, machine: TextStateMachine | None = None, initial: str = "normal",
                 parse: Callable[[str, str], object] | None = None, *, refused: str = "",
                 required: bool = False, tool_name: str = "", parallel: bool = True):
        self._machine = machine
        self._state = machine.make_state(initial) if machine is not None else None
        self._where = initial
        self._parse = parse
        self._refused = refused  # why a call is not taken: no tools, tool_choice none
        self._required = required
        self._tool_name = tool_name
        self._parallel = parallel
        self._call: list[str] = []  # the text of the call being written
        self._head: list[str] = []  # its header (harmony: the function's name)
        self._finished = False
        self.answer: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.notes: list[str] = []

    @property
    def done(self) -> bool:
        """The reply should end here: one call was asked for at most
        (``parallel_tool_calls`` false) and it has been made."""
        return not self._parallel and bool(self.calls)

    def prime(self, text: str) -> None:
        """Read what the prompt wrote of the reply (a call SpecChat started
        for tool_choice): it moves the machine and starts the call's text,
        and is no part of the reply."""
        if self._machine is None or not text:
            return
        self._state, segments = TextStateMachine.split(self._state, text)
        for state, piece in segments:
            self._enter(state, Released())
            if state == "tool":
                self._call.append(piece)
            elif state == "toolhead":
                self._head.append(piece)

    def feed(self, text: str) -> Released:
        """One token's text (possibly empty: held back)."""
        if self._machine is None:
            self.answer.append(text)
            return Released([(ANSWER, text)] if text else [], ANSWER)
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._take(segments)

    def finish(self) -> Released:
        """The reply ended: what the machine held back (a marker's start
        that never completed is text), an open call read as it stands, and
        the notes for a tool_choice the reply did not honour. Idempotent."""
        out = Released()
        if self._finished:
            return out
        self._finished = True
        if self._machine is not None:
            self._state, held, state = TextStateMachine.flush(self._state)
            out = self._take([(state, held)])
            if state in ("tool", "toolhead"):
                self._close(out)
        if self._required and not any(c.name == self._tool_name or not self._tool_name
                                       for c in self.calls):
            asked = f"a call of {self._tool_name}" if self._tool_name else "a tool call"
            self._note(f"tool_choice asked for {asked}, but the model did not make one that "
                       "could be read: its reply is returned as text")
        return out

    def _take(self, segments: list[tuple[str | None, str]]) -> Released:
        out = Released()
        label = None
        for state, text in segments:
            self._enter(state, out)
            part = PART_OF.get(state)
            if label is None and part in (REASONING, TOOL):
                label = part
            if state == "tool":
                self._call.append(text)
                out.segments.append((TOOL, text))
            elif state == "toolhead":
                self._head.append(text)
            elif part is not None:  # answer or reasoning
                (self.reasoning if part == REASONING else self.answer).append(text)
                out.segments.append((part, text))
        out.part = label or ANSWER
        return out

    def _enter(self, state: str | None, out: Released) -> None:
        """Moving from one state to another: leaving a call reads it;
        entering a call's header starts a new one."""
        if state == self._where:
            return
        if self._where == "tool":
            self._close(out)
        if state == "toolhead" or (state == "tool" and self._where != "toolhead"):
            self._call, self._head = [], []
        self._where = state

    def _close(self, out: Released) -> None:
        """A call's text is complete: read it, or keep it as answer text."""
        text, head = "".join(self._call), "".join(self._head)
        self._call, self._head = [], []
        calls, why = self._read(head, text)
        if calls:
            self.calls += calls
            out.calls += calls
            return
        self._note(f"the model wrote a tool call, but {why}: it is returned as text"
                   if self._refused else
                   f"the model's tool call could not be read ({why}): it is returned as text")
        self.answer.append(text)
        out.segments.append((ANSWER, text))

    def _read(self, head: str, text: str) -> tuple[list[ToolCall], str]:
        """The calls in a call's text, or ([], why not)."""
        if self._refused:
            return [], self._refused
        if self._parse is None:
            return [], "SpecChat knows no tool-call format for this model"
        if records.nested_deeper(text, chat_rules.JSON_DEPTH):
            return [], f"it nests deeper than {chat_rules.JSON_DEPTH} levels"
        try:
            parsed = self._parse(head, text)
            items = parsed if isinstance(parsed, list) else [parsed]
            return [_tool_call(item) for item in items], "" if items else "it holds no call"
        except Exception as exc:  # noqa: BLE001 - any parser's failure is the reply's, said in words
            return [], f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    def _note(self, text: str) -> None:
        log.warning("%s", text)
        self.notes.append(text)


def _tool_call(item: object) -> ToolCall:
    """One call as mlx-lm's parsers return it ({"name", "arguments"}, maybe
    an "id"), checked as a call a request may carry."""
    if not isinstance(item, dict):
        raise ValueError(f"the parser returned {type(item).__name__}, not a call")
    args = item.get("arguments")
    if isinstance(args, str):
        args = records.parse_json(args, max_depth=chat_rules.JSON_DEPTH) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("its arguments are not an object")
    cid = item.get("id")
    if not (isinstance(cid, str) and cid.strip() and cid.isprintable()
            and len(cid) <= chat_rules.ID_CHARS):
        cid = f"call_{uuid.uuid4().hex[:24]}"  # OpenAI's form
    name = chat_rules.name(item.get("name"), "the function's name")
    return ToolCall(cid, name, chat_rules.json_text(args, "its arguments"))


def harmony_call(head: str, text: str) -> dict:
    """A harmony call: the function's name from its header
    (``to=functions.NAME``), its arguments the message's JSON."""
    found = _HARMONY_NAME.match(head)
    if found is None:
        raise ValueError("its header names no function")
    return {"name": found.group(1),
            "arguments": records.parse_json(text.strip(), max_depth=chat_rules.JSON_DEPTH)}


# -- a request's splitter --------------------------------------------------------------

def splitter(tokenizer, fmt: ChatFormat, prompt_ids: Sequence[int], request: GenerateRequest,
             tools: Sequence[dict], prefilled: str = "") -> ReplySplitter:
    """The splitter for a chat reply of ``request`` (its ``tools``, parsed)
    to ``prompt_ids`` (which end with ``prefilled``, if SpecChat started a
    call)."""
    harmony = fmt.reasoning == "harmony" or fmt.tool_format == "harmony"
    if harmony:
        machine = TextStateMachine(HARMONY)
    elif _has_transitions(tokenizer):
        machine = make_text_state_machine(tokenizer)
    else:
        return ReplySplitter()
    initial = "header" if harmony else _initial_state(tokenizer, prompt_ids, prefilled)
    if harmony:
        parse = harmony_call
    elif tokenizer.tool_parser is not None:
        def parse(_head: str, text: str, parser=tokenizer.tool_parser) -> object:
            return parser(text, tools)
    else:
        parse = None
    refused = ("the request offered no tools" if not tools else
               "tool_choice is none" if request.tool_choice == "none" else "")
    out = ReplySplitter(machine, initial, parse, refused=refused, required=request.tool_choice == "required",
                        tool_name=request.tool_name, parallel=request.parallel_tool_calls)
    out.prime(prefilled)
    return out


def _has_transitions(tokenizer) -> bool:
    """Whether mlx-lm's machine for this tokenizer has any marker to follow."""
    return bool(getattr(tokenizer, "has_thinking", False)
                or getattr(tokenizer, "has_tool_calling", False)
                or getattr(tokenizer, "structural_markers", ())
                or getattr(tokenizer, "response_transitions", {}))


def _initial_state(tokenizer, prompt_ids: Sequence[int], prefilled: str) -> str:
    """As mlx-lm's server: a prompt whose last thinking start has no end
    after it opens the reply as reasoning; a Python renderer's response
    format may name its own first state. (A prefilled call's opening is
    read by ``prime`` from here.)"""
    first = getattr(tokenizer, "response_initial_state", None)
    if first:
        return first
    if getattr(tokenizer, "has_thinking", False) and not prefilled:
        if tokenizer.rfind_think_start(prompt_ids) > tokenizer.rfind_think_end(prompt_ids):
            return "reasoning"
    return "normal"


def prefill(tokenizer, fmt: ChatFormat, prompt_ids: Sequence[int], request: GenerateRequest) -> str:
    """What SpecChat writes of the reply itself to honour ``tool_choice``
    required or named: the format's call opening (and the function's name
    where the format writes it first: Qwen's and Hermes' JSON, Qwen3-Coder's
    XML, harmony's header), closing reasoning the prompt opened first; ""
    for any other choice."""
    if request.tool_choice != "required" or not fmt.calls_tools:
        return ""
    name = request.tool_name
    if fmt.tool_format == "harmony":
        return ("<|channel|>commentary to=functions." + (f"{name} <|constrain|>json<|message|>"
                                                        if name else ""))
    start = tokenizer.tool_call_start
    named = {"json_tools": f'{start}\n{{"name": "{name}", "arguments":',
             "qwen3_coder": f"{start}\n<function={name}>\n"}
    text = named.get(fmt.tool_format, start) if name else start
    if (getattr(tokenizer, "has_thinking", False)
            and tokenizer.rfind_think_start(prompt_ids) > tokenizer.rfind_think_end(prompt_ids)):
        text = f"{tokenizer.think_end}\n\n{text}"
    return text
