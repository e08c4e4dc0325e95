"""Benchmark prompts: a JSONL file, one ``{"id", "kind", "messages"}`` a line
(benchmarks/prompts.jsonl), read by the bench and the scripts in
benchmarks/."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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


def load_prompts(path: str | Path) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
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
