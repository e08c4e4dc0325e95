"""Anthropic's Messages API, driven by the real ``anthropic`` client over
HTTP (as Claude Code-style clients with ANTHROPIC_BASE_URL talk to it)
against the scripted agent model (tinymodels.AGENT_CHAINS: thinking, then
two tool calls, or with thinking off an answer): messages, their streams as
the SDK assembles them, tool_use and tool_result round trips, thinking
apart, stop sequences, count_tokens, the prompt cache's reuse, the same
replies as ``specchat generate``; bad input refused with a 400 in
Anthropic's shape naming the field, the server going on; the key and the
Host/Origin/Content-Type guard on its paths."""

from __future__ import annotations

import hashlib
import json

import anthropic
import pytest
from server_support import call, post
from tinymodels import AGENT_TEXTS, AGENT_TOOLS

ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]
# AGENT_TOOLS in Anthropic's shape.
TOOLS = [{"name": t["function"]["name"],
          **({"description": t["function"]["description"]} if "description" in t["function"]
             else {}),
          "input_schema": t["function"]["parameters"]} for t in AGENT_TOOLS]
GREEDY = {"temperature": 0}  # the SDK no longer has a temperature argument
OFF = {"type": "disabled"}


def root(server) -> str:
    """ANTHROPIC_BASE_URL: the server without OpenAI's /v1."""
    return server.url.removesuffix("/v1")


@pytest.fixture
def claude(agent_server):
    with anthropic.Anthropic(base_url=root(agent_server), api_key="unused", max_retries=0,
                             timeout=120) as client:
        yield client


@pytest.fixture
def model(agent_target) -> str:
    return agent_target.name


def ask(claude, model, **kw):
    return claude.messages.create(**{"model": model, "max_tokens": 40, "messages": ASK,
                                     "tools": TOOLS, "extra_body": GREEDY, **kw})


def calls(message) -> list[tuple[str, dict]]:
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def kinds(message) -> list[str]:
    return [b.type for b in message.content]


def text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def same(a, b) -> None:
    """Two messages the same but for their ids and how their prompt's
    tokens split between the cache and the input."""
    def plain(m):
        d = m.model_dump(exclude_none=True)
        d.pop("id")
        d.pop("speculative", None)
        for block in d["content"]:
            if block["type"] == "tool_use":
                assert block.pop("id").startswith("toolu_")
        u = d.pop("usage")
        return d, u["input_tokens"] + u["cache_read_input_tokens"], u["output_tokens"]

    assert plain(a) == plain(b)


def test_a_message_and_its_stream_are_the_same(claude, model):
    whole = ask(claude, model)
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert whole.model == model and whole.stop_reason == "tool_use"
    assert kinds(whole) == ["thinking", "tool_use", "tool_use"] and calls(whole) == CALLS
    assert whole.content[0].thinking == AGENT_TEXTS["reason"]
    assert whole.content[0].signature == hashlib.sha256(
        AGENT_TEXTS["reason"].encode()).hexdigest()
    spec = whole.model_extra["speculative"]
    assert spec["mode"] == "hybrid" and spec["accepted"] <= spec["drafted"]
    assert sum(spec["tokens_by_origin"].values()) == whole.usage.output_tokens
    with claude.messages.stream(model=model, max_tokens=40, messages=ASK, tools=TOOLS,
                                extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    same(streamed, whole)
    off = ask(claude, model, thinking=OFF)
    with claude.messages.stream(model=model, max_tokens=40, messages=ASK, tools=TOOLS,
                                thinking=OFF, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == AGENT_TEXTS["answer"]
        same(stream.get_final_message(), off)
    assert (kinds(off), text(off), off.stop_reason) == (["text"], AGENT_TEXTS["answer"],
                                                        "end_turn")


def events(server, body: dict) -> list[tuple[str, dict]]:
    """A streamed reply's raw events: (event name, data)."""
    status, headers, raw = post(server, "/messages", json.dumps({**body, "stream": True}).encode())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    out = []
    for chunk in raw.split("\n\n"):
        if chunk:
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: "), chunk
            out.append((name[7:], json.loads(data[6:])))
    return out


def test_the_stream_is_anthropic_s_event_sequence(agent_server, model):
    got = events(agent_server, {"model": model, "max_tokens": 40, "messages": ASK,
                                "tools": TOOLS, **GREEDY})
    assert all(name == data["type"] for name, data in got)
    names = [name for name, _ in got]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta",
                                                                     "message_stop"]
    start = got[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["role"]) == ([], None, "assistant")
    blocks = [(data["index"], data["content_block"]) for name, data in got
              if name == "content_block_start"]
    assert [(i, b["type"]) for i, b in blocks] == [(0, "thinking"), (1, "tool_use"),
                                                  (2, "tool_use")]
    assert blocks[1][1]["input"] == {} and blocks[1][1]["id"].startswith("toolu_")
    deltas = [(data["index"], data["delta"]) for name, data in got
              if name == "content_block_delta"]
    assert [(i, d["type"]) for i, d in deltas][-3:] == [
        (0, "signature_delta"), (1, "input_json_delta"), (2, "input_json_delta")]
    assert "".join(d["thinking"] for _, d in deltas if d["type"] == "thinking_delta") == \
        AGENT_TEXTS["reason"]
    # Each block opens, gets its deltas and closes before the next opens.
    order = [(name, data["index"]) for name, data in got[2:-2]]
    assert [i for _, i in order] == sorted(i for _, i in order)
    for i in range(3):
        mine = [n for n, j in order if j == i]
        assert mine[0] == "content_block_start" and mine[-1] == "content_block_stop"
        assert set(mine[1:-1]) == {"content_block_delta"}
    end = got[-2][1]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["output_tokens"] > 0 and "speculative" in end


def test_a_tool_use_and_its_result_round_trip(claude, model):
    first = ask(claude, model)
    ids = [b.id for b in first.content if b.type == "tool_use"]
    turn = {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                             for b in first.content]}
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": i, "content": out}
        for i, out in zip(ids, ["Sunny, 21 C", [{"type": "text", "text": "14:05"}]],
                          strict=True)]}
    history = [*ASK, turn, results]
    again = ask(claude, model, messages=history)
    assert calls(again) == CALLS  # the model's script, after a tool result
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens > \
        first.usage.input_tokens + first.usage.cache_read_input_tokens + 20
    # The turn's thinking went back to the template (Qwen3's keeps it after
    # the last question): without it the prompt is shorter by it and its markers.
    count = claude.messages.count_tokens(model=model, messages=history, tools=TOOLS)
    bare = {**turn, "content": [b for b in turn["content"] if b["type"] != "thinking"]}
    shorter = claude.messages.count_tokens(model=model, tools=TOOLS,
                                           messages=[*ASK, bare, results])
    assert count.input_tokens - shorter.input_tokens >= 3
    # An error result is said to the model (the only way a template hears it).
    failed = {**results, "content": [{**results["content"][0], "is_error": True},
                                     results["content"][1]]}
    assert claude.messages.count_tokens(model=model, tools=TOOLS, messages=[
        *ASK, turn, failed]).input_tokens > count.input_tokens


def test_thinking_is_apart_and_switches_with_the_template(claude, model):
    assert kinds(ask(claude, model, thinking=OFF)) == ["text"]
    on = ask(claude, model, thinking={"type": "enabled", "budget_tokens": 2048})
    assert kinds(on) == ["thinking", "tool_use", "tool_use"]
    assert AGENT_TEXTS["reason"] not in json.dumps([b.model_dump() for b in on.content[1:]])
    adaptive = ask(claude, model, thinking={"type": "adaptive"})  # what Claude Code sends
    assert kinds(adaptive) == kinds(on)
    hidden = ask(claude, model, thinking={"type": "enabled", "budget_tokens": 2048,
                                          "display": "omitted"})
    assert hidden.content[0].thinking == "" and \
        hidden.content[0].signature == on.content[0].signature


def test_a_model_without_a_switch_takes_thinking_on_but_not_off(live, tiny_target):
    """Claude Code asks for thinking whatever the model (enabled, or
    adaptive): a model without a reasoning switch answers as it always
    does. Off is a promise it cannot keep in words: refused, naming the field."""
    server, _ = live
    with anthropic.Anthropic(base_url=root(server), api_key="unused", max_retries=0) as c:
        kw = {"model": tiny_target.name, "max_tokens": 3, "extra_body": GREEDY,
              "messages": [{"role": "user", "content": "Hello"}]}
        plain = c.messages.create(**kw)
        for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}):
            assert c.messages.create(thinking=thinking, **kw).content == plain.content
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(thinking=OFF, **kw)
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert e.value.body["error"]["message"].startswith(
            "this model's chat template cannot turn reasoning off (it has no reasoning "
            "switch), so thinking disabled cannot be honoured")
        assert c.messages.create(**kw).content == plain.content


def test_thinking_maps_onto_each_kind_of_switch():
    """On/off switches (Qwen3's, DeepSeek's) go on and off; a template of
    levels (gpt-oss's) is on at its middle level and cannot go off; a
    template without a switch takes on (it answers as it always does), not off."""
    from specchat.engine.chat_rules import BadField, thinking_effort
    from specchat.engine.events import ChatFormat

    qwen = ChatFormat(template=True, reasoning="markers", switches=("enable_thinking",),
                      effort="enable_thinking")
    oss = ChatFormat(template=True, reasoning="harmony", switches=("reasoning_effort",),
                     effort="reasoning_effort")
    plain = ChatFormat(template=True)
    assert [thinking_effort(f, on) for f in (qwen, oss, plain) for on in (None, True)] == [
        "", "medium", "", "medium", "", ""]
    assert thinking_effort(qwen, False) == "none"
    for fmt, how in ((oss, "its reasoning_effort takes only low, medium, high"),
                     (plain, "it has no reasoning switch")):
        with pytest.raises(BadField) as e:
            thinking_effort(fmt, False)
        assert e.value.param == "thinking" and how in str(e.value)


def test_stop_sequences_end_the_answer_and_are_named(claude, model):
    r = ask(claude, model, thinking=OFF, stop_sequences=["sunny", "rain"])
    assert (text(r), r.stop_reason, r.stop_sequence) == ("It is ", "stop_sequence", "sunny")
    with claude.messages.stream(model=model, max_tokens=40, messages=ASK, tools=TOOLS,
                                thinking=OFF, stop_sequences=["sunny", "rain"],
                                extra_body=GREEDY) as stream:
        same(stream.get_final_message(), r)
    # One the thinking or a call writes does not end the reply.
    both = ask(claude, model, stop_sequences=["weather", "Paris"])
    assert calls(both) == CALLS and both.stop_reason == "tool_use" and both.stop_sequence is None
    assert both.content[0].thinking == AGENT_TEXTS["reason"]
    short = ask(claude, model, thinking=OFF, max_tokens=1)
    assert (short.stop_reason, short.usage.output_tokens) == ("max_tokens", 1)


def test_the_same_replies_as_specchat_generate(claude, model, agent_target, agent_draft, home,
                                               tmp_path, capsys):
    from specchat import cli

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(AGENT_TOOLS, indent=2))
    for extra, kw in (([], {}), (["--no-thinking"], {"thinking": OFF}),
                      (["--system", "Be brief."], {"system": "Be brief."}),
                      (["--system", "Be brief.", "--no-thinking"],
                       {"system": [{"type": "text", "text": "Be brief."}], "thinking": OFF})):
        assert cli.main(["generate", "--target", str(agent_target), "--draft", str(agent_draft),
                         "--k", "4", "--prompt", ASK[0]["content"], "--tools", str(tools),
                         "--max-tokens", "40", "--json", *extra]) == 0
        cli_out = json.loads(capsys.readouterr().out)
        r = ask(claude, model, **kw)
        thinking = [b.thinking for b in r.content if b.type == "thinking"]
        assert thinking == ([cli_out["reasoning"]] if cli_out["reasoning"] else [])
        answer = cli_out["answer"] if cli_out["answer"].strip() or not cli_out["tool_calls"] \
            else ""  # a reply that only calls tools has no text block
        assert text(r) == answer
        assert calls(r) == [(c["name"], json.loads(c["arguments"]))
                            for c in cli_out["tool_calls"]]
        assert r.usage.output_tokens == cli_out["stats"]["new_tokens"]
        assert r.stop_reason == {"tool_calls": "tool_use", "stop": "end_turn"}[
            cli_out["finish_reason"]]


def test_a_plain_model_answers_as_specchat_generate(live, tiny_target, tiny_draft, home,
                                                    capsys):
    from specchat import cli

    prompt = "Hello, world! How are you today?"
    assert cli.main(["generate", "--target", str(tiny_target), "--draft", str(tiny_draft),
                     "--system", "You are terse.", "--prompt", prompt, "--max-tokens", "24",
                     "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    server, _ = live
    with anthropic.Anthropic(base_url=root(server), api_key="unused", max_retries=0) as c:
        r = c.messages.create(model=tiny_target.name, max_tokens=24, system="You are terse.",
                              messages=[{"role": "user", "content": prompt}], extra_body=GREEDY)
    assert text(r) == expected["text"] and kinds(r) == ["text"]
    assert r.usage.output_tokens == expected["stats"]["new_tokens"]
    assert r.model_extra["speculative"]["mode"] == expected["mode"]


def test_count_tokens_is_the_rendered_prompt(claude, model, agent_target):
    """The prompt the target reads, rendered by its template with the
    tools and the thinking switch: transformers' own rendering of the same
    conversation, token for token as many."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(agent_target))
    system = [{"role": "system", "content": "Be brief."}]
    for thinking, switch in (({}, {}), ({"thinking": OFF}, {"enable_thinking": False})):
        ids = tok.apply_chat_template([*system, *ASK], tools=AGENT_TOOLS, return_dict=False,
                                      tokenize=True, add_generation_prompt=True, **switch)
        counted = claude.messages.count_tokens(model=model, system="Be brief.", messages=ASK,
                                               tools=TOOLS, **thinking)
        assert counted.input_tokens == len(ids)
        r = ask(claude, model, system="Be brief.", **thinking)
        assert r.usage.input_tokens + r.usage.cache_read_input_tokens == len(ids)


def test_the_prompt_cache_s_reuse_is_reported(claude, model, agent_server):
    """The second time a prompt is read, the target's cache holds all of it
    but the token the reply starts from: Anthropic's cache_read_input_tokens
    and OpenAI's cached_tokens say so, from the engine's one count."""
    from openai import OpenAI

    ask(claude, model)
    again = ask(claude, model)
    total = claude.messages.count_tokens(model=model, messages=ASK, tools=TOOLS).input_tokens
    assert again.usage.cache_read_input_tokens == total - 1 and again.usage.input_tokens == 1
    assert again.usage.cache_creation_input_tokens == 0
    with OpenAI(base_url=agent_server.url, api_key="unused", max_retries=0) as api:
        r = api.chat.completions.create(model=model, max_tokens=40, temperature=0,
                                        messages=ASK, tools=AGENT_TOOLS)
    assert r.usage.prompt_tokens == total
    assert r.usage.prompt_tokens_details.cached_tokens == total - 1


def nested(depth: int) -> str:
    """A tool_result whose content nests tool_result blocks ``depth`` deep."""
    return ('{"type": "tool_result", "tool_use_id": "a", "content": [' * depth + '"x"'
            + "]}" * depth)


BAD = [
    ({"messages": [*ASK, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "hi"}]}]},
     "messages[1].content[0].tool_use_id"),
    ({"messages": [*ASK, {"role": "user", "content": [  # the rules' own marks, as an id
        {"type": "tool_result", "tool_use_id": "\x009\x00", "content": "hi"}]}]},
     "messages[1].content[0].tool_use_id"),
    ({"tools": [{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(10_000)]},
     "tools"),
    ({"tools": [{"name": "f", "input_schema": [1]}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "no spaces"}]}, "tools[0].name"),
    ({"tools": [*TOOLS, {**TOOLS[1]}]}, "tools[2].name"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}, "tools": None}, "tool_choice"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": [*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "get_time", "input": {}}]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
                   {"role": "assistant", "content": [
                       {"type": "tool_use", "id": "a", "name": "get_time", "input": {}}]},
                   {"role": "user", "content": "and?"}]},
     "messages[3].content[0].id"),
    ({"messages": [*ASK, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me see."},
        {"type": "tool_use", "id": "a", "name": "get_time", "input": [1]}]}, *ASK]},
     "messages[1].content[1].input"),
    ({"messages": [*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "no spaces", "input": {}}]}, *ASK]},
     "messages[1].content[0].name"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}]},
     "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "tool_use", "id": "a", "name": "f",
                                         "input": {}}]}]},
     "messages[0].content[1].type"),
    ({"messages": [*ASK, {"role": "assistant", "content": "It is"}]}, "messages[1]"),
    ({"messages": [{"role": "system", "content": "Be brief."}, *ASK]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages[0].content[0].text"),
    ({"system": [{"type": "image", "source": {}}]}, "system[0].type"),
    ({"thinking": {"type": "maybe"}}, "thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"max_tokens": 10**7}, "max_tokens"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}},
     "output_config.format"),
]


@pytest.mark.parametrize("kw,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_gets_a_400_naming_the_field_and_loses_nothing(claude, model, kw, field):
    request = {"model": model, "max_tokens": 40, "messages": ASK, "tools": TOOLS,
               "extra_body": GREEDY, **kw}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(**{k: v for k, v in request.items() if v is not None})
    assert e.value.status_code == 400
    body = e.value.body
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert field in body["error"]["message"], body
    assert calls(ask(claude, model)) == CALLS  # the server goes on


def test_what_the_client_cannot_send_is_refused_in_words(agent_server, claude, model):
    """Nesting past the body's bound (blocks 100,000 deep), named where it
    is, before it is parsed; a request without max_tokens."""
    start = json.dumps({"model": model, "max_tokens": 9})[:-1] + ', "messages": ['
    deep = (start + json.dumps(ASK[0]) + ', {"role": "user", "content": ['
            + nested(100_000) + "]}]}").encode()
    status, _, text = post(agent_server, "/messages", deep)
    assert status == 400 and json.loads(text)["error"] == {
        "type": "invalid_request_error", "message": "The request body nests JSON deeper than "
        "64 levels (at messages[1].content[0].content[0].content[0]...)."}
    status, _, text = post(agent_server, "/messages/count_tokens", deep)
    assert status == 400 and "messages[1].content[0].content[0]" in text
    status, _, text = post(agent_server, "/messages",
                           json.dumps({"model": model, "messages": ASK}).encode())
    assert status == 400 and json.loads(text)["error"]["message"].startswith(
        "max_tokens is required")
    assert calls(ask(claude, model)) == CALLS


def test_the_error_shape_of_each_status(tiny_client, live, tiny_target):
    """Another model is not_found_error (404); no model loaded yet is
    Anthropic's overloaded_error (529), which its clients retry; an
    error after a stream began is an ``error`` event, which the SDK raises."""
    from specchat.server.anthropic import Reply, parse
    from specchat.server.errors import ApiError
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService

    server, _ = live
    with anthropic.Anthropic(base_url=root(server), api_key="unused", max_retries=0) as c:
        with pytest.raises(anthropic.NotFoundError) as e:
            c.messages.create(model="claude-sonnet-9", max_tokens=3, messages=ASK)
        assert e.value.body["error"]["type"] == "not_found_error"
        assert f"this server serves {tiny_target.name!r}" in e.value.body["error"]["message"]
    client, _ = tiny_client
    empty = LocalServer(ApiService(client, None), port=0)
    empty.start()
    try:
        with anthropic.Anthropic(base_url=root(empty), api_key="unused", max_retries=0) as c:
            with pytest.raises(anthropic.OverloadedError) as e:
                c.messages.create(model=tiny_target.name, max_tokens=3, messages=ASK)
            assert e.value.status_code == 529
            assert e.value.body["error"]["type"] == "overloaded_error"
            assert e.value.body["error"]["message"].startswith("No model is loaded yet")
    finally:
        empty.stop()
    req = parse({"model": "m", "max_tokens": 3, "messages": ASK})
    reply = Reply(req, "m")
    failed = [reply.frame(e) for e in reply.error(ApiError(500, "Internal error (a bug)"))]
    assert failed == ['event: error\ndata: {"type": "error", "error": {"type": "api_error", '
                      '"message": "Internal error (a bug)"}}\n\n']


def test_x_api_key_or_bearer_and_nothing_else(tiny_client, tiny_target, monkeypatch):
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    client, pair = tiny_client
    server = LocalServer(ApiService(client, Served.of(pair, "plain")), port=0, api_key="s3cret")
    server.start()
    kw = {"model": tiny_target.name, "max_tokens": 2, "messages": ASK}
    try:
        for key in ({"api_key": "wrong"}, {"default_headers": {"x-api-key": "wrong"}},
                    {"default_headers": {"x-api-key": "s3cret2"}}):
            with anthropic.Anthropic(base_url=root(server), max_retries=0, **key) as bad:
                with pytest.raises(anthropic.AuthenticationError) as e:
                    bad.messages.create(**kw)
                assert e.value.body["error"]["type"] == "authentication_error"
                assert "x-api-key" in e.value.body["error"]["message"]
                with pytest.raises(anthropic.AuthenticationError):
                    bad.messages.count_tokens(model=tiny_target.name, messages=ASK)
        for key in ({"default_headers": {"x-api-key": "s3cret"}}, {"auth_token": "s3cret"},
                    {"api_key": "s3cret"}):
            with anthropic.Anthropic(base_url=root(server), max_retries=0, **key) as good:
                assert good.messages.create(**kw).model_extra["speculative"]["mode"] == "plain"
    finally:
        server.stop()


def test_the_guard_holds_on_anthropic_s_paths(live, tiny_target):
    """The Host, Origin and Content-Type checks of every endpoint, refused
    before any work in Anthropic's shape; a path or method it does not
    have too."""
    server, recorder = live
    before = len(recorder.seen)
    port = server.port
    body = json.dumps({"model": tiny_target.name, "max_tokens": 2, "messages": ASK}).encode()
    for path in ("/messages", "/messages/count_tokens"):
        cases = [({"Host": "attacker.example"}, 421, "invalid_request_error"),
                 ({"Host": f"localhost.evil.example:{port}"}, 421, "invalid_request_error"),
                 ({"Origin": "http://evil.example"}, 403, "permission_error"),
                 ({"Origin": "null"}, 403, "permission_error"),
                 ({"Content-Type": "text/plain"}, 415, "invalid_request_error"),
                 ({"Content-Type": None}, 415, "invalid_request_error")]
        for headers, status, kind in cases:
            got, _, text = call(port, "POST", path, body, headers)
            assert got == status, (path, headers, text)
            assert json.loads(text) == {"type": "error", "error": {
                "type": kind, "message": json.loads(text)["error"]["message"]}}
    assert len(recorder.seen) == before  # nothing was queued
    status, _, text = call(port, "POST", "/messages/batches", body)
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    assert "POST /v1/messages" in json.loads(text)["error"]["message"]
    status, _, text = call(port, "GET", "/messages")
    assert status == 405 and json.loads(text)["error"]["type"] == "invalid_request_error"
    status, _, text = call(port, "POST", "/messages", body, {"Origin": f"http://127.0.0.1:{port}"})
    assert status == 200 and json.loads(text)["type"] == "message"
