"""Engine.generate checks the whole request before any MLX call: a bad value
from any caller (window, Compare, CLI, API) is the one line from
specchat.values, never an exception from sampling or the tokenizer that the
engine thread would report as "Internal error". A model cannot draft for
itself, in the same words as ``specchat models check``."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import pytest
from specchat import values
from specchat.engine.client import EngineClient
from specchat.engine.compat import SAME_MODEL
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    Message,
    SamplingParams,
    ToolCall,
)
from specchat.engine.session import Engine
from specchat.engine.worker import EngineThread, JobFailed
from specchat.errors import SpecChatError

BASE = GenerateRequest(messages=(Message("user", "Hello there"),), max_tokens=4,
                       draft=DraftSettings(mode="plain"))

BAD = {
    "temperature nan": (replace(BASE, sampling=SamplingParams(float("nan"))), "temperature must"),
    "temperature inf": (replace(BASE, sampling=SamplingParams(float("inf"))), "temperature must"),
    "temperature negative": (replace(BASE, sampling=SamplingParams(-1.0)), "temperature must"),
    "top-p 0": (replace(BASE, sampling=SamplingParams(1.0, 0.0)), "top-p must"),
    "top-p nan": (replace(BASE, sampling=SamplingParams(1.0, float("nan"))), "top-p must"),
    "top-k negative": (replace(BASE, sampling=SamplingParams(1.0, 1.0, -5)), "top-k must"),
    "max tokens 0": (replace(BASE, max_tokens=0), "max tokens must"),
    "max tokens 2.5": (replace(BASE, max_tokens=2.5), "max tokens must"),
    "K 0": (replace(BASE, draft=DraftSettings(mode="draft", k=0)), "K must"),
    "K 33": (replace(BASE, draft=DraftSettings(mode="draft", k=33)), "K must"),
    "acceptance": (replace(BASE, sampling=SamplingParams(1.0),
                           draft=DraftSettings(mode="draft", acceptance="maybe")), "acceptance"),
    "prompt not UTF-8": (replace(BASE, messages=(Message("user", "ab\udcffc"),)),
                         "the message is not valid UTF-8 text: byte 0xFF at character 3"),
    "system not UTF-8": (replace(BASE, messages=(Message("system", "\udcc3("),
                                                 Message("user", "hi"))),
                         "the system prompt is not valid UTF-8"),
    "stop string not UTF-8": (replace(BASE, stop_strings=("\udcff",)),
                              "a stop string is not valid UTF-8"),
    "stop string empty": (replace(BASE, stop_strings=("ok", "")),
                          "a stop string must not be empty"),
    # Counted in UTF-8 bytes (a bound on its tokens) before the template and
    # the tokenizer see it (tokenizing megabytes held the engine for seconds).
    "prompt past the bound": (replace(BASE, messages=(Message("system", "x" * 600_000),
                                                      Message("user", "y" * 400_001))),
                              "the prompt is 1,000,001 bytes of UTF-8 text, more than SpecChat "
                              "reads at once (1,000,000 bytes, at most as many tokens); "
                              "shorten it"),
    # Under a million characters, but 4 bytes each (and 3 tokens each of
    # the tiny tokenizer: 3 million tokens).
    "prompt of emoji": (replace(BASE, messages=(Message("user", "🙂" * 999_000),)),
                        "the prompt is 3,996,000 bytes of UTF-8 text"),
    # The tools' JSON is written into the prompt too, and counted with it.
    "prompt with its tools past the bound": (replace(
        BASE, messages=(Message("user", "y" * 600_000),), tools=json.dumps([{
            "type": "function", "function": {"name": "f", "description": "x" * 400_000}}])),
        "the prompt is 1,000,0"),
    # Within the bound as sent, past it as the template writes it (its text
    # around each turn): the tokenizer reads the latter, so it is bounded too.
    "prompt past the bound as the template writes it": (replace(
        BASE, messages=(Message("user", "x" * 99),) * 10_000),
        "the prompt as the chat template writes it is 1,"),
    "prompt ids past the bound": (GenerateRequest(prompt_ids=(5,) * 1_000_001, max_tokens=2),
                                  "the prompt is 1,000,001 tokens, more than SpecChat reads "
                                  "at once (1,000,000); shorten it"),
    # Every list a request carries, one past its bound.
    "stop strings past the count": (replace(BASE, stop_strings=("x",) * 65),
                                    "too many stop strings: 65; at most 64 in one request"),
    "stop strings past the length": (replace(BASE, stop_strings=("x" * 4000, "y" * 97)),
                                     "too many characters of stop strings: 4,097; at most "
                                     "4,096 in one request"),
    "messages past the count": (replace(BASE, messages=(Message("user", "hi"),) * 10_001),
                                "too many messages: 10,001; at most 10,000 in one request"),
    # 128 calls in each of 79 turns: 76,800 of them held the engine for 8 s.
    "tool calls past the count in all": (replace(BASE, messages=(Message("user", "hi"),) + tuple(
        Message("assistant", "", tool_calls=tuple(ToolCall(f"{i}-{j}", "f", "{}")
                                                  for j in range(128))) for i in range(79))),
        "too many tool calls in all: 10,112; at most 10,000 in one request"),
    "prompt id not a number": (GenerateRequest(prompt_ids=(1, 2.5), max_tokens=2),
                               "prompt token id must be a whole number"),
}


@pytest.fixture(scope="module")
def client(tiny_target, tiny_draft):
    c = EngineClient()
    c.load(str(tiny_target), str(tiny_draft)).wait()
    yield c
    c.close()


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_fails_with_its_one_line(client, case):
    request, words = BAD[case]
    job = client.generate(request)
    with pytest.raises(EngineError):
        job.wait()
    assert isinstance(job.outcome, JobFailed)
    message = job.outcome.message
    assert words in message, message
    assert not message.startswith("Internal error") and "\n" not in message


def test_a_request_past_a_bound_costs_the_engine_no_tokenizing(client):
    """Refused by the request check, which reads no tokenizer and runs
    first in ``Engine.generate``, before the chat template and the tokenizer
    (which took 3 s for these 999,000 emoji) see any of it: the engine
    refuses in the very words of the check alone."""
    from specchat.engine import request_check

    for case in ("prompt of emoji", "prompt ids past the bound", "messages past the count"):
        with pytest.raises(values.BadValue) as alone:
            request_check.checked(BAD[case][0])
        with pytest.raises(EngineError) as refused:
            client.generate(BAD[case][0]).wait()
        assert str(alone.value) in str(refused.value), case


@pytest.mark.parametrize("typed", [-1, -(10 ** 30), 10 ** 30, 2 ** 64])
def test_any_integer_is_a_seed_folded_into_64_bits(tiny_engine, typed):
    """MLX's key takes an unsigned 64-bit seed (a negative or larger one is
    a TypeError there); the engine folds, so -1 samples as 2**64 - 1 does."""
    folded = values.check("seed", typed)
    assert 0 <= folded < 2 ** 64
    mx.random.key(folded)  # what the engine's KeyStream calls

    def run(seed):
        tiny_engine.reset_cache()
        return tiny_engine.generate(replace(
            BASE, max_tokens=6, sampling=SamplingParams(1.0, seed=seed))).token_ids

    assert run(typed) == run(folded)


def test_checked_values_reach_the_sampler(tiny_engine):
    """A K of "auto" typed as text and a temperature of 0 as an int are
    values like any other, not errors (the check converts them)."""
    r = tiny_engine.generate(replace(BASE, sampling=SamplingParams(0, 1, 0, None),
                                     draft=DraftSettings(mode="draft", k="auto")))
    assert r.summary.new_tokens == 4


def test_a_model_cannot_draft_for_itself(tiny_target, tmp_path):
    engine = Engine()
    link = tmp_path / "same-model"
    link.symlink_to(tiny_target)  # another path to the same folder
    for draft in (tiny_target, link, f"{tiny_target}/"):
        with pytest.raises(EngineError) as caught:
            engine.load(tiny_target, draft)
        assert SAME_MODEL in str(caught.value)
    assert engine.target is None  # refused before anything was loaded


def test_a_real_bug_is_still_reported_as_one_line():
    """The generic wrapper stays for real bugs: it says so, names the
    exception and keeps to one line (the traceback is in the detail)."""
    def broken(_job):
        raise ValueError("first line\nsecond line")

    job = EngineThread(name="test-bug").submit(broken)
    with pytest.raises(EngineError):
        job.wait()
    assert job.outcome.message == ("Internal error (a bug in SpecChat, please report it): "
                                   "ValueError: first line")
    assert "Traceback" in job.outcome.detail
    assert not issubclass(ValueError, SpecChatError)


def test_a_bad_dtype_in_the_environment_fails_the_load_in_one_line(tiny_target, monkeypatch):
    """What the window shows when a load fails: SPECCHAT_DTYPE's one line,
    not an internal error (it used to be a ValueError, reported as a bug)."""
    monkeypatch.setenv("SPECCHAT_DTYPE", "float8")
    c = EngineClient()
    try:
        job = c.load(str(tiny_target))
        with pytest.raises(EngineError):
            job.wait(120)
        assert job.outcome.message == ("SPECCHAT_DTYPE must be float32, float16, bfloat16 or "
                                       "q4; got float8")
    finally:
        c.close()
