"""The Responses API (issue 48), driven by the real ``openai`` client over
HTTP against the scripted agent model (tinymodels.AGENT_CHAINS: reasoning
and two tool calls, or with thinking off an answer): items in and out,
function calls and their outputs round trip, reasoning apart, the stream's
typed events assembling into the non-streamed response, the same replies
as the chat completions and ``specchat generate``, nothing stored (and
anything that needs it refused in words), and bad input refused with a
400 naming the field, the server going on."""

from __future__ import annotations

import json

import openai
import pytest
from server_support import call, error
from tinymodels import AGENT_CALLS as CALLS
from tinymodels import AGENT_TEXTS
from tinymodels import AGENT_TOOLS as CHAT_TOOLS

ASK = "What's the weather in Paris?"
# The same tools in the Responses API's shape: a function's fields on the tool.
TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]


def ask(api, model, **kw):
    return api.responses.create(**{"model": model, "temperature": 0, "max_output_tokens": 40,
                                   "input": ASK, "tools": TOOLS, "store": False, **kw})


def calls(response) -> list[tuple[str, dict]]:
    return [(o.name, json.loads(o.arguments)) for o in response.output
            if o.type == "function_call"]


def reasoning(response) -> str:
    return "".join(c.text for o in response.output if o.type == "reasoning"
                   for c in o.content or [])


def items(response) -> list[dict]:
    """The output items without their ids (new for each response)."""
    return [{k: v for k, v in o.model_dump(exclude_none=True).items()
             if k not in ("id", "call_id", "parsed_arguments")} for o in response.output]


def test_a_function_call_and_its_output_round_trip(agent_api, agent_model):
    r = ask(agent_api, agent_model)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert [o.type for o in r.output] == ["reasoning", "function_call", "function_call"]
    assert reasoning(r) == AGENT_TEXTS["reason"] and r.output[0].summary == []
    assert calls(r) == CALLS and r.output_text == ""  # a reply that only calls: no message
    call_ids = [o.call_id for o in r.output[1:]]
    assert all(i.startswith("call_") for i in call_ids) and len(set(call_ids)) == 2
    assert [o.id[:3] for o in r.output] == ["rs_", "fc_", "fc_"]
    assert r.usage.output_tokens_details.reasoning_tokens >= 3  # <think>, it, </think>
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.model_extra["speculative"]["mode"] == "hybrid"
    # The client sends the output back as it got it, with the results.
    sent = [o.model_dump(exclude_none=True) for o in r.output]
    history = [{"role": "user", "content": ASK}, *sent,
               *({"type": "function_call_output", "call_id": i, "output": out}
                 for i, out in zip(call_ids, ["Sunny, 21 C", "14:05"], strict=True))]
    again = ask(agent_api, agent_model, input=history)
    assert again.usage.input_tokens > r.usage.input_tokens + 20  # the calls and results too
    assert calls(again) == CALLS  # the model's script, after a tool result
    # The prompt cache's reuse: the first request's prompt was still cached.
    cached = again.usage.input_tokens_details.cached_tokens
    assert r.usage.input_tokens - 1 <= cached < again.usage.input_tokens
    # The reasoning item went back to the template as that turn's reasoning
    # (Qwen3's keeps it after the last question): without it, fewer tokens.
    bare = ask(agent_api, agent_model, input=[history[0], *history[2:]])
    assert again.usage.input_tokens - bare.usage.input_tokens >= 3
    # The same conversation as chat completions: the same prompt, the same reply.
    chat = agent_api.chat.completions.create(
        model=agent_model, temperature=0, max_tokens=40, tools=CHAT_TOOLS, messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "reasoning_content": AGENT_TEXTS["reason"], "tool_calls": [
                {"id": i, "type": "function", "function": {"name": o.name,
                                                           "arguments": o.arguments}}
                for i, o in zip(call_ids, r.output[1:], strict=True)]},
            *({"role": "tool", "tool_call_id": h["call_id"], "content": h["output"]}
              for h in history[4:])])
    assert chat.usage.prompt_tokens == again.usage.input_tokens
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in chat.choices[0].message.tool_calls] == calls(again)


def test_a_stream_assembles_into_the_non_streamed_response(agent_api, agent_model):
    for kw in ({}, {"reasoning": {"effort": "none"}}, {"max_output_tokens": 3}):
        whole = ask(agent_api, agent_model, **kw)
        events = list(ask(agent_api, agent_model, stream=True, **kw))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type == f"response.{whole.status}"
        final = events[-1].response
        assert final.id == events[0].response.id and items(final) == items(whole)
        assert final.usage.output_tokens == whole.usage.output_tokens
        # Each item's deltas add up to the item.
        for i, item in enumerate(final.output):
            mine = [e for e in events if getattr(e, "output_index", None) == i]
            assert mine[0].type == "response.output_item.added"
            assert mine[-1].type == "response.output_item.done" and mine[-1].item == item
            deltas = "".join(e.delta for e in mine if e.type.endswith(".delta"))
            assert deltas == (item.arguments if item.type == "function_call" else
                              "".join(c.text for c in item.content))
        if whole.status == "completed":  # the client's own assembly of the stream
            with agent_api.responses.stream(model=agent_model, temperature=0, input=ASK,
                                            max_output_tokens=40, tools=TOOLS, store=False,
                                            **kw) as stream:
                got = stream.get_final_response()
            assert items(got) == items(whole) and got.output_text == whole.output_text
    types = {e.type for e in list(ask(agent_api, agent_model, stream=True))}
    assert {"response.reasoning_text.delta", "response.reasoning_text.done",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.completed"} <= types
    assert "response.output_text.delta" not in types  # a reply that only calls tools
    answer = list(ask(agent_api, agent_model, stream=True, reasoning={"effort": "none"}))
    assert "".join(e.delta for e in answer if e.type == "response.output_text.delta") == \
        AGENT_TEXTS["answer"]


def test_the_answers_are_what_the_client_s_own_types_say(agent_server, agent_model):
    """Every event of a stream, and the whole response, validated (strictly,
    as pydantic does) against the ``openai`` package's own types: every
    field they require, of the type they say. (The client itself builds
    them without checking.) A failure after the stream began is an error
    event and response.failed."""
    import pydantic
    from openai.types.responses import Response, ResponseStreamEvent
    from specchat.server import responses
    from specchat.server.errors import ApiError

    events = pydantic.TypeAdapter(ResponseStreamEvent)
    for kw in ({"tools": TOOLS}, {"reasoning": {"effort": "none"}}, {"max_output_tokens": 3}):
        body = {"model": agent_model, "temperature": 0, "input": ASK, "instructions": "Be brief.",
                "metadata": {"run": "1"}, **kw}
        status, _, text = call(agent_server.port, "POST", "/responses", json.dumps(body).encode())
        assert status == 200, text
        Response.model_validate_json(text)
        status, headers, text = call(agent_server.port, "POST", "/responses",
                                     json.dumps({**body, "stream": True}).encode())
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        for block in text.strip().split("\n\n"):
            name, data = block.split("\n")
            event = events.validate_json(data.removeprefix("data: "))
            assert name == f"event: {event.type}"
    stream = responses.Events(responses.parse({"model": agent_model, "input": ASK}), agent_model)
    failed = stream.start() + stream.error(ApiError(500, "Internal error (a bug)"))
    assert [e["type"] for e in failed][2:] == ["error", "response.failed"]
    assert [events.validate_python(e).sequence_number for e in failed] == [0, 1, 2, 3]
    assert failed[-1]["response"]["error"] == {"code": "server_error",
                                               "message": "Internal error (a bug)"}


def test_a_reply_cut_by_its_budget_is_incomplete(agent_api, agent_model):
    r = ask(agent_api, agent_model, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].type == "reasoning" and r.output[-1].status == "incomplete"
    assert r.usage.output_tokens == 3


def test_instructions_are_a_system_turn_first(agent_api, agent_model):
    r = ask(agent_api, agent_model, instructions="Answer briefly.", reasoning={"effort": "none"})
    chat = agent_api.chat.completions.create(
        model=agent_model, temperature=0, max_tokens=40, tools=CHAT_TOOLS, reasoning_effort="none",
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": ASK}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content == AGENT_TEXTS["answer"]
    assert r.instructions == "Answer briefly."
    plain = ask(agent_api, agent_model, reasoning={"effort": "none"})
    assert plain.usage.input_tokens < r.usage.input_tokens
    # The same in items: a developer message first, content as parts.
    parts = ask(agent_api, agent_model, reasoning={"effort": "none"}, input=[
        {"type": "message", "role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}])
    assert parts.usage.input_tokens == r.usage.input_tokens


def test_tool_choice_none_required_and_named(agent_api, agent_model):
    none = ask(agent_api, agent_model, tool_choice="none")
    assert not calls(none) and '"name": "get_weather"' in none.output_text  # called anyway: text
    assert any("tool_choice is none" in w for w in none.model_extra["warnings"])
    required = ask(agent_api, agent_model, tool_choice="required")
    assert calls(required) == CALLS and not reasoning(required)
    named = ask(agent_api, agent_model, tool_choice={"type": "function", "name": "get_time"})
    assert calls(named)[0] == ("get_time", {"tz": "UTC"})
    assert named.tool_choice.name == "get_time"
    one = ask(agent_api, agent_model, parallel_tool_calls=False)
    assert calls(one) == CALLS[:1] and one.parallel_tool_calls is False


def test_reasoning_is_apart_and_can_be_switched_off(agent_api, agent_model):
    off = ask(agent_api, agent_model, reasoning={"effort": "none", "summary": "auto"})
    assert [o.type for o in off.output] == ["message"]
    assert off.output_text == AGENT_TEXTS["answer"] and off.output[0].status == "completed"
    assert off.reasoning.effort == "none" and off.usage.output_tokens_details.reasoning_tokens == 0
    on = ask(agent_api, agent_model, reasoning={"effort": "high"})
    assert reasoning(on) == AGENT_TEXTS["reason"] and AGENT_TEXTS["reason"] not in on.output_text


def test_the_same_replies_as_specchat_generate(agent_api, agent_model, agent_target, agent_draft,
                                               home, tmp_path, capsys):
    from specchat import cli

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(CHAT_TOOLS))
    for extra, kw in (([], {}), (["--no-thinking"], {"reasoning": {"effort": "none"}})):
        assert cli.main(["generate", "--target", str(agent_target), "--draft", str(agent_draft),
                         "--k", "4", "--prompt", ASK, "--tools", str(tools),
                         "--max-tokens", "40", "--json", *extra]) == 0
        cli_out = json.loads(capsys.readouterr().out)
        r = ask(agent_api, agent_model, **kw)
        answer = cli_out["answer"] if cli_out["answer"].strip() or not cli_out["tool_calls"] \
            else ""  # a reply that only calls tools has no message
        assert (reasoning(r), r.output_text, calls(r)) == (
            cli_out["reasoning"], answer,
            [(c["name"], json.loads(c["arguments"])) for c in cli_out["tool_calls"]])
        assert r.usage.output_tokens == cli_out["stats"]["new_tokens"]


def test_nothing_is_stored_and_what_needs_it_is_refused_in_words(agent_api, agent_model):
    r = ask(agent_api, agent_model, store=None)  # left out: answered, and said not stored
    assert r.model_extra["store"] is False
    for kw, param in (({"previous_response_id": r.id}, "previous_response_id"),
                      ({"conversation": "conv_1"}, "conversation"),
                      ({"store": True}, "store"), ({"background": True}, "background")):
        with pytest.raises(openai.BadRequestError) as e:
            ask(agent_api, agent_model, **kw)
        assert e.value.body["param"] == param
        assert "this server stores no responses" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:  # nothing to fetch
        agent_api.responses.retrieve(r.id)
    assert "it stores no responses" in e.value.body["message"]


BAD = [
    ({"tools": [{"type": "function", "name": "f", "parameters": [1]}]}, "tools[0].parameters"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [*TOOLS, {"type": "function", "name": "get_time"}]}, "tools[2].name"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "required", "tools": []}, "tool_choice"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call_output", "call_id": "call_x", "output": "hi"}]},
     "input[1].call_id"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call", "call_id": "a", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "a", "output": "1"},
                {"type": "function_call", "call_id": "a", "name": "get_time", "arguments": "{}"}]},
     "input[3].call_id"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call", "call_id": "a", "name": "get_time",
                 "arguments": "[" * 100_000 + "]" * 100_000}]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call", "call_id": "a", "name": "get_time",
                 "arguments": "[1]"}]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call", "call_id": "", "name": "get_time"}]},
     "input[1].call_id"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "function_call_output", "output": "1"}]}, "input[1].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": []}, "input"),
    ({"input": [{"role": "system", "content": "only a system turn"}]}, "input"),
    ({"input": [{"role": "user", "content": ASK},
                {"type": "reasoning", "summary": "not a list"}]}, "input[1].summary"),
    ({"reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"instructions": ["not", "text"]}, "instructions"),
    ({"metadata": {"a": {"nested": 1}}}, "metadata"),
    ({"max_tool_calls": 3}, "max_tool_calls"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
]


@pytest.mark.parametrize("kw,param", BAD, ids=[p for _, p in BAD])
def test_bad_input_gets_a_400_naming_the_field_and_loses_nothing(agent_api, agent_model, kw,
                                                                 param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(agent_api, agent_model, **kw)
    assert e.value.body["param"] == param, e.value.body
    field = param.split(".")[0].split("[")[0]
    # A number out of its range is said in the words of specchat.values' table.
    assert {"max_output_tokens": "max tokens"}.get(field, field) in e.value.body["message"]
    assert calls(ask(agent_api, agent_model)) == CALLS  # the server goes on


def test_long_lists_are_refused_before_their_items_are_read(agent_server, agent_model):
    """10,000 tools, 10,001 items, 129 calls in one turn: each list counted
    before its items are read (sent as raw HTTP: the client takes seconds
    to serialize them)."""
    user = {"role": "user", "content": ASK}
    many_calls = [user, *({"type": "function_call", "call_id": f"c{i}", "name": "get_time"}
                          for i in range(129))]
    for fields, param, words in (
            ({"tools": [{"type": "function", "name": f"f{i}"} for i in range(10_000)]}, "tools",
             "too many tools: 10,000; at most 128 in one request"),
            ({"input": [user] * 10_001}, "input",
             "too many input items: 10,001; at most 10,000 in one request"),
            ({"input": many_calls}, "input[129]",
             "too many tool calls: 129; at most 128 in one message")):
        body = json.dumps({"model": agent_model, "input": ASK, **fields}).encode()
        status, _, text = call(agent_server.port, "POST", "/responses", body)
        assert status == 400 and error(text)["param"] == param, text
        assert error(text)["message"] == words


def test_deep_items_are_refused_before_they_are_parsed(agent_server, agent_model):
    """Items nested 100,000 deep: the body's nesting is counted before it
    is parsed (as every endpoint's is); a 400 that says so."""
    deep = (b'{"model": "%s", "input": ' % agent_model.encode() + b"[" * 100_000 + b"]" * 100_000
            + b"}")
    status, _, text = call(agent_server.port, "POST", "/responses", deep)
    assert status == 400, text
    assert error(text)["message"] == ("The request body nests JSON deeper than 64 levels (at "
                                      "input[0][0][0][0][0][0][0]...).")
    assert error(text)["param"] == "input[0][0][0][0][0][0][0]..."


@pytest.fixture
def tiny_api(live):
    """A client of the tiny model, whose template has no reasoning switch
    and takes no tools."""
    from openai import OpenAI

    server, _ = live
    with OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_a_reasoning_effort_the_model_has_no_switch_for_is_refused(tiny_api, tiny_target):
    """Refused by name rather than silently doing nothing."""
    with pytest.raises(openai.BadRequestError) as e:
        tiny_api.responses.create(model=tiny_target.name, input="Hi", max_output_tokens=2,
                                  reasoning={"effort": "high"})
    assert e.value.body["param"] == "reasoning.effort"
    assert "reasoning.effort 'high' cannot be honoured" in e.value.body["message"]


def test_an_empty_list_of_tools_is_none(tiny_api, tiny_target):
    """``tools: []`` (what the Agents SDK sends for an agent without tools)
    offers no tools, so a model that takes none answers, on both endpoints."""
    r = tiny_api.responses.create(model=tiny_target.name, input="Hi", max_output_tokens=2,
                                  tools=[])
    assert r.usage.output_tokens <= 2 and r.tools == []
    chat = tiny_api.chat.completions.create(model=tiny_target.name, max_tokens=2, tools=[],
                                            messages=[{"role": "user", "content": "Hi"}])
    assert chat.usage.completion_tokens <= 2


def test_the_guard_covers_the_responses_endpoint(live, tiny_target):
    """A foreign Host (421), a page of another origin (403) and a body not
    declared JSON (415) are refused here as on every endpoint."""
    server, recorder = live
    before = len(recorder.seen)
    body = json.dumps({"model": tiny_target.name, "input": "Hi",
                       "max_output_tokens": 2}).encode()
    port = server.port
    for headers, status_code, code in (
            ({"Host": "attacker.example"}, 421, "host_not_allowed"),
            ({"Origin": "http://evil.example"}, 403, "origin_not_allowed"),
            ({"Content-Type": "text/plain"}, 415, "unsupported_media_type")):
        status, _, text = call(port, "POST", "/responses", body, headers)
        assert status == status_code and error(text)["code"] == code, text
    assert len(recorder.seen) == before
    status, _, text = call(port, "POST", "/responses", body)
    assert status == 200 and json.loads(text)["object"] == "response"


def test_the_openai_agents_sdk_runs_a_tool_call(agent_server, agent_model):
    """The OpenAI Agents SDK with its default model (the Responses API, its
    own settings: store left out) runs the scripted model through its tool
    calls, and sends back what it got (the reasoning and call items) with
    the results; the model calls again (its script), and the run stops."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    ran = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(("get_weather", {"city": city}))
        return "Sunny, 21 C"

    @agents.function_tool
    def get_time(tz: str) -> str:
        """The time in a time zone."""
        ran.append(("get_time", {"tz": tz}))
        return "14:05"

    def after(_context, results):  # a second round of calls ends the run
        outputs = [r.output for r in results]
        return agents.ToolsToFinalOutputResult(is_final_output=len(ran) > 2,
                                               final_output=" / ".join(outputs))

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=agent_server.url, api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="weather", instructions="Answer about the weather.", tools=[get_weather, get_time],
        tool_use_behavior=after,
        model=agents.OpenAIResponsesModel(model=agent_model, openai_client=client),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=40))
    result = agents.Runner.run_sync(agent, ASK, max_turns=3)
    # Both rounds' calls ran (the SDK may run a round's calls in any order).
    assert sorted(ran, key=str) == sorted(CALLS * 2, key=str)
    assert result.final_output == "Sunny, 21 C / 14:05"
    assert len(result.raw_responses) == 2
    second = result.raw_responses[1].usage
    assert second.input_tokens > result.raw_responses[0].usage.input_tokens + 20
