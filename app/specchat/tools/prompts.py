"""Benchmark prompts: a JSONL file, one ``{"id", "kind", "messages"}`` a line
(benchmarks/prompts.jsonl), read by the bench and the scripts in
benchmarks/. An agent's request (kind ``agent``, benchmarks/prompts-agent.jsonl,
recorded by benchmarks/record_agent.py) is a chat completion's body as the
agent sent it: its messages in OpenAI's shape (tool calls, tool results)
and its ``tools``, read by the local API's own parser, so the bench renders
exactly the prompt the server rendered."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerateRequest, Message
from specchat.server import protocol
from specchat.server.errors import ApiError

# multiturn: earlier user and assistant turns, then a follow-up (edit the code,
# test it, rewrite the text): what suffix drafting over the conversation is for.
# first / again (benchmarks/prompts-history.jsonl): a user's day in new chats,
# the same kind of request asked again later: what the history index is for.
# agent: a coding agent's request (benchmarks/prompts-agent.jsonl): files it
# read, tool results, earlier turns, and the tools it offers.
KINDS = ("code", "explain", "grounded", "repetitive", "multiturn", "first", "again", "agent")


@dataclass
class Prompt:
    id: str
    kind: str
    messages: tuple[Message, ...]
    tools: str = ""  # JSON text of the tools offered (an agent's request), as the engine takes them

    def request(self, **kw) -> GenerateRequest:
        """The engine's request for this prompt (``kw``: its other fields)."""
        return GenerateRequest(messages=self.messages, tools=self.tools, **kw)


# A prompts file is a few hundred KB; read as every file SpecChat reads
# (records: a regular file, bounded), each line's JSON nesting counted first.
MAX_BYTES = records.MAX_JSON_BYTES
DEPTH = 64


def load_prompts(path: str | Path) -> list[Prompt]:
    try:
        text = records.read_file(path, MAX_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError, records.BadRecord) as exc:
        why = ("it is not UTF-8 text" if isinstance(exc, UnicodeDecodeError)
               else getattr(exc, "strerror", None) or exc)
        raise EngineError(f"{path} cannot be read: {why}") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = records.parse_json(line, max_depth=DEPTH)
            kind = obj["kind"]
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {', '.join(KINDS)}")
            if kind == "agent" or "tools" in obj:
                prompts.append(_as_sent(obj, kind))
                continue
            msgs = tuple(Message(m["role"], m["content"]) for m in obj["messages"])
            prompts.append(Prompt(str(obj["id"]), kind, msgs))
        except (ValueError, KeyError, TypeError, ApiError) as exc:
            raise EngineError(f"{path}:{n}: not a prompt line ({exc})") from exc
    if not prompts:
        raise EngineError(f"{path}: no prompts")
    return prompts


def _as_sent(obj: dict, kind: str) -> Prompt:
    """A request as a client sent it, read by the API's own parser."""
    req = protocol.parse("chat", {"model": "bench", "messages": obj["messages"],
                                  **({"tools": obj["tools"]} if obj.get("tools") else {})})
    return Prompt(str(obj["id"]), kind, req.messages, req.tools)
