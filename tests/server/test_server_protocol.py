"""OpenAI's bodies to engine requests and back, without HTTP: what a client
may send, what is refused (by name, as a 400), and the shapes answered."""

from __future__ import annotations

import pytest
from specchat.engine.events import GenerationResult, Message, Summary
from specchat.server import protocol
from specchat.server.errors import ApiError

USER = [{"role": "user", "content": "hi"}]


def refused(kind, body) -> ApiError:
    with pytest.raises(ApiError) as e:
        protocol.parse(kind, {"model": "m", **body})
    assert e.value.status == 400 and "\n" not in e.value.message
    return e.value


def test_a_chat_request_becomes_the_engines():
    req = protocol.parse("chat", {
        "model": "m", "temperature": 0.2, "top_p": 0.9, "top_k": 5, "seed": -1,
        "max_completion_tokens": 33, "stop": "END", "user": "ignored", "tools": [],
        "messages": [{"role": "developer", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None}]})
    g = req.generate_request("hybrid", 4)
    assert g.messages == (Message("system", "Be brief."), Message("user", "ab"),
                          Message("assistant", ""))
    assert (g.sampling.temperature, g.sampling.top_p, g.sampling.top_k) == (0.2, 0.9, 5)
    assert g.sampling.seed == 2 ** 64 - 1  # folded into 64 bits, as everywhere
    assert g.max_tokens == 33 and g.stop_strings == ("END",) and g.prompt_ids is None
    assert (g.draft.mode, g.draft.k) == ("hybrid", 4)
    assert req.id.startswith("chatcmpl-") and not req.stream


def test_defaults_follow_openai_and_the_cap():
    req = protocol.parse("chat", {"model": "m", "messages": USER, "stream": True,
                                  "stream_options": {"include_usage": True}})
    assert req.sampling.temperature == 1.0 and req.include_usage
    assert req.generate_request("plain", None, cap=100).max_tokens == 100
    assert protocol.parse("completion", {"model": "m", "prompt": ["x"]}).prompt == "x"
    assert protocol.parse("completion", {"model": "m", "prompt": [[1, 2]]}).prompt_ids == (1, 2)


def tool(name: str, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description}}


def calls(n: int, turn: int) -> dict:
    """An assistant turn that made ``n`` calls."""
    return {"role": "assistant", "tool_calls": [
        {"id": f"{turn}-{j}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for j in range(n)]}


@pytest.mark.parametrize("kind,body,param", [
    ("chat", {"messages": USER, "temperature": -1}, "temperature"),
    ("chat", {"messages": USER, "temperature": "0.5"}, "temperature"),
    ("chat", {"messages": USER, "top_p": 0}, "top_p"),
    ("chat", {"messages": USER, "max_tokens": 0}, "max_tokens"),
    ("chat", {"messages": USER, "seed": True}, "seed"),
    ("chat", {"messages": USER, "stop": ["ok", ""]}, "stop"),
    ("chat", {"messages": USER, "stop": 5}, "stop"),
    ("chat", {"messages": USER, "n": 2}, "n"),
    ("chat", {"messages": USER, "logprobs": True}, "logprobs"),
    ("chat", {"messages": USER, "stream": "yes"}, "stream"),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("chat", {"messages": [{"role": "system", "content": "x"}]}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": "bad \udcff byte"}]},
     "messages[0].content"),
    ("completion", {"prompt": ["a", "b"]}, "prompt"),
    ("completion", {"prompt": ""}, "prompt"),
    ("completion", {"prompt": [1, -2]}, "prompt"),
    ("completion", {"prompt": "x", "echo": True}, "echo"),
    ("completion", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("chat", {"messages": USER, "tools": {"type": "function"}}, "tools"),
    ("chat", {"messages": USER, "tools": ["f"]}, "tools[0]"),
    # Each list one past its bound (specchat.values).
    ("chat", {"messages": USER, "stop": ["x"] * 65}, "stop"),
    ("chat", {"messages": USER, "stop": ["x" * 4096, "y"]}, "stop"),
    ("chat", {"messages": USER * 10_001}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1001}]},
     "messages[0].content"),
    ("chat", {"messages": USER, "tools": [{}] * 129}, "tools"),
    ("chat", {"messages": USER, "tools": [tool("f", "é" * 500_000)]}, "tools"),
    ("chat", {"messages": [{"role": "user", "content": "é" * 500_001}]}, "messages"),
    ("completion", {"prompt": "é" * 500_001}, "prompt"),
    ("completion", {"prompt": [1] * 1_000_001}, "prompt"),
    # Counted in all, before the turn that passes the bound is read: 76,800
    # calls (128 in each of 600 turns) held the engine thread for 8 s.
    ("chat", {"messages": USER + [calls(128, i) for i in range(78)] + [calls(128, 78)]},
     "messages[79].tool_calls"),
    # The tools are written into the prompt too: counted with the messages
    # (apart, a request at every bound was 1.6 million tokens).
    ("chat", {"messages": [{"role": "user", "content": "é" * 300_000}],
              "tools": [tool("f", "é" * 250_000)]}, "messages"),
    # A switch's name is text the request sends too (one of 200,000
    # characters was echoed whole in the 400).
    ("chat", {"messages": USER, "chat_template_kwargs": {"k" * 4096 + "x": True}},
     "chat_template_kwargs"),
])
def test_bad_fields_are_refused_by_name(kind, body, param):
    assert refused(kind, body).param == param


def test_lists_at_their_bounds_are_taken():
    """One item or byte less than each refusal above."""
    req = protocol.parse("chat", {
        "model": "m", "stop": ["x" * 64] * 64, "tools": [tool(f"f{i}") for i in range(128)],
        "messages": USER * 9_999 + [{"role": "user", "content": [
            {"type": "text", "text": "é"}] * 1000}]})
    assert len(req.messages) == 10_000 and len(req.stop) == 64
    protocol.parse("chat", {"model": "m", "messages": USER, "tools": [tool("f", "é" * 499_950)]})
    assert len(protocol.parse("completion", {"model": "m", "prompt": "é" * 500_000}).prompt) \
        == 500_000
    assert len(protocol.parse("completion", {"model": "m", "prompt": [1] * 1_000_000})
               .prompt_ids) == 1_000_000
    req = protocol.parse("chat", {"model": "m", "messages": USER + [
        calls(100, i) for i in range(100)]})
    assert sum(len(m.tool_calls) for m in req.messages) == 10_000


def test_a_model_is_required():
    with pytest.raises(ApiError) as e:
        protocol.parse("chat", {"messages": USER})
    assert e.value.param == "model"
    with pytest.raises(ApiError):
        protocol.parse("chat", ["not", "an", "object"])


def summary(**kw) -> Summary:
    base = dict(mode="hybrid", finish_reason="stop_string", new_tokens=5, steps=2, drafted=4,
                accepted=3, acceptance_rate=0.75, tokens_per_step=2.5, tokens_per_s=10.0,
                ttft_s=0.1, wall_s=0.5, prompt_tokens=7, reused_prompt_tokens=0,
                prefill_s=0.05, forward_s=0.3, overhead_s=0.1)
    return Summary(**{**base, **kw})


def test_answers_have_usage_and_the_extension():
    req = protocol.parse("chat", {"model": "m", "messages": USER, "stream": True,
                                  "stream_options": {"include_usage": True}})
    result = GenerationResult("Hello!", (1, 2, 3, 4, 5), summary(reused_prompt_tokens=6))
    body = protocol.response(req, result, "m")
    assert body["choices"][0]["finish_reason"] == "stop"  # a stop string is OpenAI's "stop"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 6}}
    assert body["speculative"] == {"mode": "hybrid", "drafted": 4, "accepted": 3,
                                   "acceptance_rate": 0.75, "tokens_per_step": 2.5}
    chunks = protocol.Chunks(req, "m")
    out = chunks.start() + chunks.text("Hel") + chunks.end(result)
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # The text the steps held back (here "lo!") comes before the finish.
    assert [c["choices"][0]["delta"].get("content") for c in out[1:3]] == ["Hel", "lo!"]
    assert out[3]["choices"][0]["finish_reason"] == "stop" and "speculative" in out[3]
    assert out[4]["choices"] == [] and out[4]["usage"]["total_tokens"] == 12
    if "tokens_by_origin" in Summary.__dataclass_fields__:
        with_origins = summary(tokens_by_origin={"target": 2, "draft": 3})
        assert protocol.speculative(with_origins)["tokens_by_origin"] == {"target": 2,
                                                                          "draft": 3}


def test_a_long_stream_costs_the_same_per_step():
    """A streamed reply's text is kept in its pieces: adding each to one
    string copied all of it every step, on the server's loop (200,000
    steps took 17 s, every other connection waiting)."""
    import time

    req = protocol.parse("completion", {"model": "m", "prompt": "x", "stream": True})

    def steps(n: int) -> float:
        chunks = protocol.Chunks(req, "m")
        started = time.perf_counter()
        for _ in range(n):
            chunks.text("abcd")
        return time.perf_counter() - started

    # Ten times the steps, about ten times the time (the copy made it a hundred).
    assert steps(200_000) < 30 * steps(20_000)
    chunks = protocol.Chunks(req, "m")
    for _ in range(200_000):
        chunks.text("abcd")
    result = GenerationResult(text="abcd" * 200_000 + "!", token_ids=(), summary=summary())
    tail = chunks.end(result)
    assert tail[0]["choices"][0]["text"] == "!"  # what the steps held back
