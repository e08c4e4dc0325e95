"""Serving agents (issue 48), driven by the real ``openai`` client over
HTTP against a tiny model whose greedy replies are known
(tinymodels.AGENT_CHAINS: reasoning and two tool calls, or with thinking
off an answer): tool calls and their results round trip, streamed as
OpenAI streams them, tool_choice none/required/named, parallel calls,
reasoning in its own field, the same replies as ``specchat generate``, and
bad input refused with a 400 naming the field, the server going on."""

from __future__ import annotations

import json

import openai
import pytest
from server_support import post
from tinymodels import AGENT_CALLS as CALLS
from tinymodels import AGENT_TEXTS
from tinymodels import AGENT_TOOLS as TOOLS

ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture
def api(agent_api):
    return agent_api


@pytest.fixture
def model(agent_model) -> str:
    return agent_model


def ask(api, model, **kw):
    return api.chat.completions.create(**{"model": model, "temperature": 0, "max_tokens": 40,
                                          "messages": ASK, "tools": TOOLS, **kw})


def calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_a_tool_call_and_its_result_round_trip(api, model):
    r = ask(api, model)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls(choice.message) == CALLS and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == AGENT_TEXTS["reason"]
    ids = [c.id for c in choice.message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    # The client sends the assistant turn back as it got it, and the results.
    turn = choice.message.model_dump(exclude_none=True)
    history = [*ASK, turn, *({"role": "tool", "tool_call_id": i, "content": out}
                             for i, out in zip(ids, ["Sunny, 21 C", "14:05"], strict=True))]
    again = ask(api, model, messages=history)
    assert again.usage.prompt_tokens > r.usage.prompt_tokens + 20  # the calls and results too
    assert calls(again.choices[0].message) == CALLS  # the model's script, after a tool result
    # The turn's reasoning went back to the template (Qwen3's keeps it after
    # the last question): without it the prompt is shorter by it and its markers.
    del turn["reasoning_content"]
    bare = ask(api, model, messages=[*ASK, turn, *history[2:]])
    assert again.usage.prompt_tokens - bare.usage.prompt_tokens >= 3  # <think>, it, </think>


def test_a_streamed_reply_assembles_into_the_same_calls(api, model):
    whole = ask(api, model).choices[0].message
    with api.chat.completions.stream(model=model, temperature=0, max_tokens=40, messages=ASK,
                                     tools=TOOLS) as stream:
        final = stream.get_final_completion()
    got = final.choices[0]
    assert got.finish_reason == "tool_calls" and calls(got.message) == calls(whole)
    assert not got.message.content  # the opening chunk's "" only, as OpenAI's stream
    assert got.message.model_extra["reasoning_content"] == whole.model_extra["reasoning_content"]
    # The raw chunks: reasoning as its own deltas, never in content; each
    # call's id and name first, then its arguments.
    chunks = list(ask(api, model, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == \
        AGENT_TEXTS["reason"]
    assert not any(d.content for d in deltas)
    tool_deltas = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.index, t.id, t.function.name) for t in tool_deltas[::2]] == [
        (0, whole.tool_calls[0].id and tool_deltas[0].id, "get_weather"),
        (1, tool_deltas[2].id, "get_time")]
    assert all(t.id is None and t.function.name is None for t in tool_deltas[1::2])
    assert [json.loads(t.function.arguments) for t in tool_deltas[1::2]] == [a for _, a in CALLS]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_required_and_named(api, model):
    none = ask(api, model, tool_choice="none").choices[0]
    assert none.finish_reason == "stop" and none.message.tool_calls is None
    assert '"name": "get_weather"' in none.message.content  # the model called anyway: text
    assert any("tool_choice is none" in w for w in ask(api, model, tool_choice="none")
               .model_extra["warnings"])
    required = ask(api, model, tool_choice="required").choices[0]
    assert calls(required.message) == CALLS and "reasoning_content" not in \
        required.message.model_extra
    named = ask(api, model, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert calls(named.choices[0].message)[0] == ("get_time", {"tz": "UTC"})
    # A named call the model does not make readable: its text, and why, in words.
    failed = ask(api, model, tool_choice={"type": "function",
                                          "function": {"name": "get_weather"}})
    assert [n for n, _ in calls(failed.choices[0].message)] == ["get_time"]
    assert '"city": Paris' in failed.choices[0].message.content
    assert any("tool_choice asked for a call of get_weather" in w
               for w in failed.model_extra["warnings"])


def test_parallel_calls_and_one_call_at_most(api, model):
    assert len(ask(api, model).choices[0].message.tool_calls) == 2
    one = ask(api, model, parallel_tool_calls=False)
    assert calls(one.choices[0].message) == CALLS[:1]
    assert one.choices[0].finish_reason == "tool_calls"
    assert one.usage.completion_tokens < ask(api, model).usage.completion_tokens


def test_reasoning_is_apart_and_can_be_switched_off(api, model):
    off = ask(api, model, reasoning_effort="none").choices[0]
    assert off.message.content == AGENT_TEXTS["answer"] and off.finish_reason == "stop"
    assert "reasoning_content" not in off.message.model_extra and not off.message.tool_calls
    kwargs = ask(api, model, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kwargs.choices[0].message.content == AGENT_TEXTS["answer"]
    on = ask(api, model, reasoning_effort="high").choices[0].message
    assert on.model_extra["reasoning_content"] == AGENT_TEXTS["reason"]
    assert AGENT_TEXTS["reason"] not in (on.content or "")


def test_a_bad_tools_file_is_a_usage_error_of_one_line(tmp_path):
    """``specchat generate --tools FILE``: the file is read as the API reads
    ``tools`` (a regular file, bounded, nesting counted first), refused
    before any model loads."""
    import subprocess
    import sys

    cases = {"schema.json": (json.dumps([{"type": "function", "function": {
        "name": "f", "parameters": [1]}}]), "tools[0].function.parameters must be a JSON schema "
                                            "object; got a list"),
             "deep.json": ("[" * 100_000 + "]" * 100_000, "nests arrays and objects deeper than "
                                                          "64 levels"),
             "text.json": ("not json", "it is not valid JSON")}
    for name, (text, words) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        out = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target",
                              "/nonexistent/model", "--prompt", "hi", "--tools", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and "argument --tools: " in out.stderr
        assert words in out.stderr, out.stderr


def test_stop_strings_end_the_answer_not_the_reasoning(api, model):
    r = ask(api, model, stop=["weather", "Paris"])  # both in the reasoning and the calls
    assert r.choices[0].message.model_extra["reasoning_content"] == AGENT_TEXTS["reason"]
    assert calls(r.choices[0].message) == CALLS and r.choices[0].finish_reason == "tool_calls"
    off = ask(api, model, reasoning_effort="none", stop=["sunny"]).choices[0]
    assert (off.message.content, off.finish_reason) == ("It is ", "stop")
    streamed = list(ask(api, model, reasoning_effort="none", stop=["sunny"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "It is "


def test_the_same_replies_as_specchat_generate(api, model, agent_target, agent_draft, home,
                                               tmp_path, capsys):
    from specchat import cli

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS, indent=2))
    for extra, kw in (([], {}), (["--no-thinking"], {"reasoning_effort": "none"})):
        assert cli.main(["generate", "--target", str(agent_target), "--draft", str(agent_draft),
                         "--k", "4", "--prompt", ASK[0]["content"], "--tools", str(tools),
                         "--max-tokens", "40", "--json", *extra]) == 0
        cli_out = json.loads(capsys.readouterr().out)
        r = ask(api, model, **kw)
        message = r.choices[0].message
        answer = cli_out["answer"] if cli_out["answer"].strip() or not cli_out["tool_calls"] \
            else None  # the API's content of a reply that only calls tools
        assert (message.model_extra.get("reasoning_content", ""), message.content,
                calls(message)) == (cli_out["reasoning"], answer,
                                    [(c["name"], json.loads(c["arguments"]))
                                     for c in cli_out["tool_calls"]])
        assert r.usage.completion_tokens == cli_out["stats"]["new_tokens"]


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(10_000)]},
     "tools"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
     "tools[0].function.name"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "hi"}]},
     "messages[1].tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "a", "content": "1"},
                   {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}]},
     "messages[3].tool_calls[0].id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {
            "name": "get_time", "arguments": "[" * 100_000 + "]" * 100_000}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"chat_template_kwargs": {"no_such_switch": True}}, "chat_template_kwargs.no_such_switch"),
    ({"chat_template_kwargs": {"enable_thinking": [True]}},
     "chat_template_kwargs.enable_thinking"),
    ({"reasoning_effort": "enormous"}, "reasoning_effort"),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
     "reasoning_effort"),
]


@pytest.mark.parametrize("kw,param", BAD, ids=[p for _, p in BAD])
def test_bad_input_gets_a_400_naming_the_field_and_loses_nothing(api, model, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(api, model, **{k: v for k, v in kw.items() if k != "chat_template_kwargs"},
            **({"extra_body": {"chat_template_kwargs": kw["chat_template_kwargs"]}}
               if "chat_template_kwargs" in kw else {}))
    assert e.value.body["param"] == param
    assert param.split(".")[0].split("[")[0] in e.value.body["message"]
    assert calls(ask(api, model).choices[0].message) == CALLS  # the server goes on


def test_json_escapes_of_text_that_is_not_utf8_are_refused(agent_server, model):
    """A lone surrogate sent as a JSON escape (which the openai client
    cannot even send) parses to text no tokenizer or answer can encode."""
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": "@"}'}}
    for fields, param, escape in (
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "description": "@"}}}]}, "tools", "\\udcff"),
            ({"tools": [{"type": "function", "function": {"name": "f", "description": "@"}}]},
             "tools[0].function.description", "\\udcff"),
            ({"messages": [*ASK, {"role": "assistant", "tool_calls": [call]}]},
             "messages[1].tool_calls[0].function.arguments", "\\\\udcff")):
        body = json.dumps({"model": model, "max_tokens": 2, "messages": ASK, **fields})
        status, _, text = post(agent_server, "/chat/completions",
                               body.replace("@", escape).encode())
        assert status == 400, text
        assert json.loads(text)["error"]["param"] == param, text
