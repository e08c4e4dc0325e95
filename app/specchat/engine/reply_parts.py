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
(``feed``): it returns the text now safe to hand out, the (part, text)
segments it released, the token's part (a marker belongs to the part it
opens or closes), and the calls it completed. The request's stop strings
are found here, in the answer only (one in the reasoning or a call does
not end the reply), so a reply with no markers is all answer and stops as
it always did. A call that cannot be read is kept as answer text, its
reason said in ``notes`` and the log, never raised.

A small model offered tools in a JSON format (Qwen 2.5's and Hermes'
``<tool_call>{...}</tool_call>``) often writes the call without its
markers, as its whole reply, bare or in a ```json fence (the bundled
Qwen2.5-Coder 1.5B does, every time). Such a reply is held back until it
ends and read as the call it is when it is one: an object (or a list of
them) naming an offered function and its arguments (``bare``); anything
else is the answer, handed out at the end. Only a reply that starts like
one (``{`` or ```json) is held, so an ordinary answer streams as ever.

A prompt may open a part itself: a template that ends its generation
prompt with ``<think>`` (the reply starts as reasoning, as in mlx-lm's
server), or a tool call SpecChat starts for ``tool_choice`` (``prefill``:
the call's opening, and its function's name where the format writes it
first, appended to the prompt), which ``prime`` reads before the reply.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mlx_lm.generate import TextStateMachine, make_text_state_machine

from specchat import records, values
from specchat.engine import chat_rules
from specchat.engine.events import ANSWER, REASONING, TOOL, ChatFormat, GenerateRequest, ToolCall
from specchat.engine.stops import StopMatcher

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
# mlx-lm's tool-call formats whose calls are a JSON object of a name and arguments.
JSON_CALLS = frozenset({"json_tools"})


@dataclass
class Released:
    """What one piece of text released: the text the reply wrote that is
    now safe to hand out (``raw``: markers included), its (part, text)
    segments, the part of the token that released it, and the calls it
    completed."""

    raw: str = ""
    segments: list[tuple[str, str]] = field(default_factory=list)
    part: str = ANSWER
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, other: Released) -> None:
        self.raw += other.raw
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
    mlx-lm's parsers return calls. ``stops``: the request's stop strings,
    found in the answer only (as hosted APIs scope them to the content):
    the reply ends where the first one begins, and a tail of the answer
    that may still become one is held back, with the text around it, so
    nothing handed out is ever taken back. ``refused``: why no call is
    taken (the request offered no tools, or tool_choice none): a call the
    model writes anyway is returned as text. ``required``/``tool_name``:
    what tool_choice asked for, said in ``notes`` when the reply did not.

    The text fed is released again as ``Released.raw`` less what is held
    back: a marker's start the machine has not decided on yet, and the
    answer's possible stop string (both always the tail of what was fed).
    """

    def __init__(self, machine: TextStateMachine | None = None, initial: str = "normal",
                 parse: Callable[[str, str], object] | None = None, *,
                 stops: Sequence[str] = (), refused: str = "", required: bool = False,
                 tool_name: str = "", parallel: bool = True, bare: Sequence[str] = ()):
        self._machine = machine
        self._state = machine.make_state(initial) if machine is not None else None
        self._where = initial
        self._parse = parse
        stops = [s for s in stops if s]
        self._stops = StopMatcher(stops) if stops else None
        self._refused = refused  # why a call is not taken: no tools, tool_choice none
        self._required = required
        self._tool_name = tool_name
        self._parallel = parallel
        self._raw = ""  # text fed and not released: the held answer, then the machine's buffer
        self._held = ""  # the answer's tail that may still become a stop string
        self._call: list[str] = []  # the text of the call being written
        self._head: list[str] = []  # its header (harmony: the function's name)
        self._finished = False
        # A call written without its markers (``bare``: the offered functions'
        # names): "unknown" until the answer's start says, "candidate" while
        # held, "no" once handed out as answer.
        self._offered = frozenset(bare)
        self._bare_state = "unknown" if bare and not refused else "no"
        self._bare: list[str] = []
        self.stopped = False  # a stop string ended the reply
        self.stop_string = ""  # which one (Anthropic's answers name it)
        self.answer: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.notes: list[str] = []

    @property
    def part(self) -> str:
        """The part the reply is in now (once it ended: the part it ended
        in; a reply that stopped inside its reasoning has no answer after
        it); "" between parts (harmony's headers)."""
        return PART_OF.get(self._where, "")

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
        self._state, held, state = TextStateMachine.flush(self._state)
        for piece_state, piece in [*segments, (state, held)]:
            self._enter(piece_state, Released())
            if piece_state == "tool":
                self._call.append(piece)
            elif piece_state == "toolhead":
                self._head.append(piece)

    def feed(self, text: str) -> Released:
        """One token's text (possibly empty: held back by the detokenizer).
        The machine reads it a character at a time, so that each piece of
        answer it releases begins where the text it has not released yet
        begins: a stop string's place in the text is then known."""
        out = Released()
        if self.stopped or self._finished:
            return out
        if self._machine is None:
            self._raw += text
            self._answer(text, out)
            self._release(out)
            return out
        label = None
        for ch in text or [""]:
            self._raw += ch
            self._state, segments = TextStateMachine.split(self._state, ch)
            touched = self._take(segments, out)
            label = label or touched
            self._release(out)
            if self.stopped:
                break
        out.part = label or ANSWER
        return out

    def finish(self) -> Released:
        """The reply ended: what the machine held back (a marker's start
        that never completed is text), the answer's held tail (no stop
        string after all), an open call read as it stands, and the notes
        for a tool_choice the reply did not honour. Idempotent."""
        out = Released()
        if self._finished:
            return out
        if self._machine is not None and not self.stopped:
            self._state, held, state = TextStateMachine.flush(self._state)
            self._take([(state, held)], out)
            if state in ("tool", "toolhead"):
                self._close(out)
        self._finished = True
        if not self.stopped:
            self._answer_out(self._held, out)
            self._held = ""
        self._resolve_bare(out, at_end=True)
        if not self.stopped:
            out.raw += self._raw
            self._raw = ""
        if self._required and not any(c.name == self._tool_name or not self._tool_name
                                       for c in self.calls):
            asked = f"a call of {self._tool_name}" if self._tool_name else "a tool call"
            self._note(f"tool_choice asked for {asked}, but the model did not make one that "
                       "could be read: its reply is returned as text")
        return out

    def _release(self, out: Released) -> None:
        """Hand out the text fed but for its held tail (none once stopped:
        the rest was cut already). After it, the text not handed out is the
        held answer, then the machine's buffer: where the next character's
        answer continues."""
        if self.stopped:
            return
        buffered = len(self._state[3]) if self._machine is not None else 0
        keep = len(self._raw) if self._bare else len(self._held) + buffered
        if len(self._raw) > keep:
            out.raw += self._raw[:len(self._raw) - keep]
            self._raw = self._raw[len(self._raw) - keep:]

    def _take(self, segments: list[tuple[str | None, str]], out: Released) -> str | None:
        """The machine's segments into the parts; the first part among
        reasoning and calls they touch (the token's part), if any."""
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
            elif part == REASONING:
                self.reasoning.append(text)
                out.segments.append((REASONING, text))
            elif part == ANSWER:
                self._answer(text, out)
            if self.stopped:
                break
        return label

    def _answer(self, text: str, out: Released) -> None:
        """Answer text, through the stop strings: what can no longer
        become one goes out; a stop string cuts the answer, and the text
        fed, where it begins (the held answer, then ``text``, are where the
        text not released yet begins)."""
        if self._stops is None:
            self._answer_out(text, out)
            return
        combined = self._held + text
        found = self._stops.feed(text)
        if found is not None:
            end, length = found
            cut = len(self._held) + end - length
            self.stop_string = combined[cut:cut + length]
            self._answer_out(combined[:cut], out)
            out.raw += self._raw[:cut]
            self._raw, self._held = "", ""
            self.stopped = True
            return
        keep = self._stops.held
        self._answer_out(combined[:len(combined) - keep], out)
        self._held = combined[len(combined) - keep:]

    def _answer_out(self, text: str, out: Released) -> None:
        if not text:
            return
        if self._bare_state != "no":  # a reply that may be a bare call: held
            self._bare.append(text)
            if self._bare_state == "unknown":
                self._bare_state = _bare_start("".join(self._bare))
                if self._bare_state == "no":
                    self._resolve_bare(out)
            return
        self.answer.append(text)
        out.segments.append((ANSWER, text))

    def _resolve_bare(self, out: Released, at_end: bool = False) -> None:
        """The held answer, as the call it is (at the reply's end) or as
        the answer text it turned out to be."""
        text, self._bare, state = "".join(self._bare), [], self._bare_state
        self._bare_state = "no"
        calls = _bare_calls(text, self._offered) if at_end and state == "candidate" else []
        if calls:
            self.calls += calls
            out.calls += calls
            self._note("the model wrote its tool call without the format's markers; it was "
                       "read as a call")
        else:
            self._answer_out(text, out)

    def _enter(self, state: str | None, out: Released) -> None:
        """Moving from one state to another: leaving the answer releases
        its held tail (a stop string does not cross a marker); leaving a
        call reads it; entering a call's header starts a new one."""
        if state == self._where:
            return
        if self._where == "normal":
            self._answer_out(self._held, out)
            self._held = ""
            if self._bare:  # markers after it: it was no bare call
                self._resolve_bare(out)
            if self._stops is not None:
                self._stops.state = 0
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
        self._answer_out(text, out)

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


_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n(.*?)\n?```\s*\Z", re.S)


def _bare_start(text: str) -> str:
    """Whether an answer that starts with ``text`` may be a bare call:
    "candidate" (it opens a JSON object or a ```json fence), "unknown" (too
    little to say), or "no"."""
    t = text.lstrip()
    if t.startswith("{") or t.startswith("```json"):
        return "candidate"
    return "unknown" if not t or "```json".startswith(t) else "no"


def _bare_calls(text: str, offered: frozenset[str]) -> list[ToolCall]:
    """The calls a whole reply is, written without markers: JSON (fenced
    or not) of one call, a list of them or several in a row, each naming an
    offered function and its arguments (an object); [] if it is anything
    else (its depth was bounded before it is parsed)."""
    t = text.strip()
    fenced = _FENCE.match(t)
    t = fenced.group(1).strip() if fenced else t
    if t.startswith("{{") and t.endswith("}}"):
        # Qwen 2.5's template shows the call as {{"name": ..., "arguments": ...}}
        # (its braces doubled) and the model copies it; no JSON value starts so.
        t = t[1:-1].strip()
    if not t.startswith(("{", "[")) or records.nested_deeper(t, chat_rules.JSON_DEPTH):
        return []
    items = _json_values(t)
    if len(items) == 1 and isinstance(items[0], list):  # a list of calls
        items = items[0]
    if not items or not all(isinstance(i, dict) and i.get("name") in offered
                            and isinstance(i.get("arguments", i.get("parameters")), dict)
                            for i in items):
        return []
    try:
        return [_tool_call({"name": i["name"], "arguments": i.get("arguments",
                                                                  i.get("parameters"))})
                for i in items]
    except (ValueError, values.BadValue):
        return []


def _json_values(text: str) -> list:
    """The JSON values ``text`` is, one after another with only white space
    between them (several calls a small model wrote in a row), or []."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return []
        out.append(value)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


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
        return ReplySplitter(stops=request.stop_strings)
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
    # Formats whose calls are JSON objects: a small model may write one bare.
    bare = [t["function"]["name"] for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)] if fmt.tool_format in JSON_CALLS \
        and parse is not None else []
    out = ReplySplitter(machine, initial, parse, stops=request.stop_strings, refused=refused,
                        required=request.tool_choice == "required", tool_name=request.tool_name,
                        parallel=request.parallel_tool_calls, bare=bare)
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
