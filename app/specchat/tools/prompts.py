"""Benchmark prompts: a JSONL file, one ``{"id", "kind", "messages"}`` a line
(benchmarks/prompts.jsonl), read by the bench and the scripts in
benchmarks/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.engine.errors import EngineError
from specchat.engine.events import Message

# multiturn: earlier user and assistant turns, then a follow-up (edit the code,
# test it, rewrite the text): what suffix drafting over the conversation is for.
# first / again (benchmarks/prompts-history.jsonl): a user's day in new chats,
# the same kind of request asked again later: what the history index is for.
KINDS = ("code", "explain", "grounded", "repetitive", "multiturn", "first", "again")


@dataclass
class Prompt:
    id: str
    kind: str
    messages: tuple[Message, ...]


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
            msgs = tuple(Message(m["role"], m["content"]) for m in obj["messages"])
            prompts.append(Prompt(str(obj["id"]), kind, msgs))
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{path}:{n}: not a prompt line ({exc})") from exc
    if not prompts:
        raise EngineError(f"{path}: no prompts")
    return prompts
