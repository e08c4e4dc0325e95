"""Each part of a reply counted apart (issue 49): the Summary says how the
reasoning, the answer and the calls were decoded (tokens, seconds, drafted,
accepted, where the tokens came from), the parts add up to the reply in
every mode, a counter fed the reply's events (as the window's gauges are)
counts the same, and a reply that ends inside its reasoning says so."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from specchat.engine.events import ANSWER, REASONING, DraftSettings, GenerateRequest, Message
from specchat.engine.part_stats import PartCounter
from specchat.engine.session import Engine
from tinymodels import AGENT_TOOLS

ASK = (Message("user", "What's the weather in Paris?"),)
# The same question again: the suffix drafter finds the first reply in it.
AGAIN = (*ASK, Message("assistant", "", reasoning="\nThe user wants the weather in Paris.\n"),
         Message("user", "What's the weather in Paris?"))


@pytest.fixture(scope="module")
def agent_engine(agent_target, agent_draft) -> Engine:
    e = Engine()
    e.load(agent_target, agent_draft)
    return e


@pytest.mark.parametrize("mode", ["plain", "draft", "hybrid", "suffix"])
def test_the_parts_add_up_to_the_reply_and_are_counted_as_its_events_are(agent_engine, mode):
    drafted = 0
    for messages in (ASK, AGAIN):
        events = []
        r = agent_engine.generate(GenerateRequest(messages=messages, tools=json.dumps(AGENT_TOOLS),
                                                  max_tokens=40, draft=DraftSettings(
                                                      mode=mode, k=3 if mode == "draft" else None)),
                                  on_step=events.append)
        s, parts = r.summary, r.summary.by_part
        assert {p: n["tokens"] for p, n in parts.items()} == dict(Counter(r.parts))
        assert REASONING in parts and not s.ended_in_reasoning
        assert sum(n["tokens"] for n in parts.values()) == s.new_tokens
        assert sum(n["drafted"] for n in parts.values()) == s.drafted
        assert sum(n["accepted"] for n in parts.values()) == s.accepted
        by_origin = Counter()
        for n in parts.values():
            assert sum(n["tokens_by_origin"].values()) == n["tokens"]
            assert 0 <= n["accepted"] <= n["drafted"]
            by_origin.update(n["tokens_by_origin"])
        assert by_origin == Counter(s.tokens_by_origin)
        assert 0 < sum(n["seconds"] for n in parts.values()) <= s.wall_s
        assert parts[REASONING]["first_s"] <= min(n["first_s"] for n in parts.values())
        counter = PartCounter()  # what the window's gauges do with the same events
        for ev in events:
            counter.add(ev)
        assert counter.record() == parts
        drafted += s.drafted
    assert drafted > 0 or mode == "plain"


def test_a_reply_that_ends_inside_its_reasoning_says_so(agent_engine):
    cut = agent_engine.generate(GenerateRequest(messages=ASK, max_tokens=2))
    assert cut.summary.ended_in_reasoning and cut.summary.finish_reason == "length"
    assert set(cut.summary.by_part) == {REASONING}
    off = agent_engine.generate(GenerateRequest(messages=ASK, max_tokens=8,
                                                reasoning_effort="none"))
    assert set(off.summary.by_part) == {ANSWER} and not off.summary.ended_in_reasoning
    assert off.to_json()["by_part"] == off.summary.by_part


def test_the_command_line_says_each_parts_speed(agent_target):
    p = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target",
                        str(agent_target), "--prompt", "What's the weather in Paris?",
                        "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "thinking " in p.stderr and "tok/s" in p.stderr.split("thinking ")[1]
