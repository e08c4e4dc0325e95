"""The local API driven by the real ``openai`` client over HTTP: replies,
streams, usage, the ``speculative`` extension, cancel by disconnect, a
queue of concurrent requests, and errors in OpenAI's shape."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from server_support import post

PROMPT = "Hello, world! How are you today?"
IDS = list(range(40, 80))  # a token-id prompt the tiny target does not end early


def wait_for(cond, timeout: float = 60.0) -> None:
    """Until ``cond()`` holds (the server reports from its own thread)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.01)


def test_models_lists_the_served_pair(api, tiny_target):
    models = api.models.list()
    assert [m.id for m in models.data] == [tiny_target.name]
    extra = models.data[0].model_extra["speculative"]
    assert extra == {"mode": "hybrid", "draft": "draft-noisy"}


def test_greedy_chat_equals_specchat_generate(api, tiny_target, tiny_draft, home, capsys):
    """The same prompt, models and budget give the same text through the
    API as through ``specchat generate``, with usage and the extension."""
    from specchat import cli

    assert cli.main(["generate", "--target", str(tiny_target), "--draft", str(tiny_draft),
                     "--prompt", PROMPT, "--max-tokens", "24", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    r = api.chat.completions.create(model=tiny_target.name, temperature=0, max_tokens=24,
                                    messages=[{"role": "user", "content": PROMPT}])
    assert r.choices[0].message.content == expected["text"]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].finish_reason == ("length" if expected["stats"]["new_tokens"] == 24
                                          else "stop")
    assert r.usage.completion_tokens == expected["stats"]["new_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 24
    spec = r.model_extra["speculative"]
    assert spec["mode"] == expected["mode"] == "hybrid"
    assert (spec["drafted"], spec["accepted"]) == (expected["stats"]["drafted"],
                                                   expected["stats"]["accepted"])
    assert spec["accepted"] <= spec["drafted"] and 0 <= spec["acceptance_rate"] <= 1
    assert spec["tokens_per_step"] >= 1
    if "tokens_by_origin" in spec:
        assert sum(spec["tokens_by_origin"].values()) == r.usage.completion_tokens


def test_streamed_chat_is_the_same_text(api, tiny_target):
    kwargs = dict(model=tiny_target.name, temperature=0, max_tokens=30,
                  messages=[{"role": "user", "content": PROMPT}])
    whole = api.chat.completions.create(**kwargs)
    chunks = list(api.chat.completions.create(stream=True,
                                              stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-2].model_extra["speculative"]["mode"] == "hybrid"
    last = chunks[-1]  # include_usage: a last chunk with no choices and the usage
    assert last.choices == [] and last.usage.model_dump() == whole.usage.model_dump()
    # Without include_usage, no usage chunk.
    plain = list(api.chat.completions.create(stream=True, **kwargs))
    assert all(c.choices and c.usage is None for c in plain)


def test_completions_take_text_or_token_ids(api, tiny_target):
    r = api.completions.create(model=tiny_target.name, prompt=IDS, max_tokens=12,
                               temperature=0)
    assert r.object == "text_completion" and r.usage.prompt_tokens == len(IDS)
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    streamed = api.completions.create(model=tiny_target.name, prompt=IDS, max_tokens=12,
                                      temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text
    t = api.completions.create(model=str(tiny_target), prompt="def fibonacci(n):",
                               max_tokens=8, temperature=0, stop=["\n\n"])
    assert t.model == tiny_target.name  # the reference it was loaded from is a name for it
    assert 0 < t.usage.prompt_tokens < len("def fibonacci(n):")  # the target's tokens
    assert "\n\n" not in t.choices[0].text


def test_sampling_with_a_seed_repeats(api, tiny_target):
    def once():
        return api.chat.completions.create(
            model=tiny_target.name, temperature=0.9, top_p=0.95, seed=7, max_tokens=16,
            messages=[{"role": "user", "content": PROMPT}]).choices[0].message.content

    assert once() == once()


def test_a_client_that_disconnects_cancels_its_engine_job(api, live, tiny_target):
    server, recorder = live
    stream = api.completions.create(model=tiny_target.name, prompt=IDS, max_tokens=1500,
                                    temperature=0, stream=True)
    chunk = next(iter(stream))
    rid = chunk.id
    stream.close()  # the connection goes away mid-reply
    wait_for(lambda: any(a.request_id == rid for a in recorder.ended()))
    end = next(a for a in recorder.ended() if a.request_id == rid)
    assert end.finished == "cancelled" and end.tokens < 1500
    assert end.summary.finish_reason == "cancelled"  # the engine's own word: the job stopped
    assert end.summary.new_tokens == end.tokens
    # The engine is free again: the next request runs to its end.
    r = api.completions.create(model=tiny_target.name, prompt=IDS, max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5


def test_a_client_that_goes_away_before_a_whole_reply_cancels_it(live, tiny_target):
    """Not streaming: the server watches the connection while it generates."""
    import socket

    server, recorder = live
    before = len(recorder.seen)
    body = json.dumps({"model": tiny_target.name, "prompt": IDS, "max_tokens": 1500,
                       "temperature": 0}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (server.port, len(body), body))

    def running():
        return next((a for a in recorder.seen[before:]
                     if a.state == "generating" and a.tokens > 0), None)

    wait_for(running)
    rid = running().request_id
    sock.close()
    wait_for(lambda: any(a.request_id == rid for a in recorder.ended()))
    end = next(a for a in recorder.ended() if a.request_id == rid)
    assert end.finished == "cancelled" and end.tokens < 1500
    assert end.summary.finish_reason == "cancelled"  # the engine's own word: the job stopped
    assert end.summary.new_tokens == end.tokens


def test_concurrent_requests_are_queued_in_order(api, live, tiny_target):
    """A second request made while one streams waits for it, then runs."""
    server, recorder = live
    first = api.completions.create(model=tiny_target.name, prompt=IDS, max_tokens=200,
                                   temperature=0, stream=True)
    it = iter(first)
    a_id = next(it).id
    b_result = {}

    def second():
        b_result["r"] = api.chat.completions.create(
            model=tiny_target.name, temperature=0, max_tokens=10,
            messages=[{"role": "user", "content": PROMPT}])

    t = threading.Thread(target=second)
    t.start()
    wait_for(lambda: any(a.waiting for a in recorder.seen if a.request_id == a_id))
    a_text = "".join(c.choices[0].text for c in it)  # A runs to its end meanwhile
    t.join(120)
    b = b_result["r"]
    assert len(a_text) > 0 and b.usage.completion_tokens > 0
    order = [(a.request_id, a.state, a.finished) for a in recorder.seen
             if a.request_id in (a_id, b.id)]
    a_end = order.index(next(o for o in order if o[0] == a_id and o[2] is not None))
    b_start = order.index(next(o for o in order if o[0] == b.id))
    assert a_end < b_start  # B began only once A had finished
    assert order[a_end][2] == "length"


def test_bad_requests_get_openai_errors(api, live, tiny_target):
    msgs = [{"role": "user", "content": PROMPT}]
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=tiny_target.name, messages=msgs, temperature=9)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "temperature"
    assert e.value.body["message"].startswith("temperature must be a number from 0 to 5")
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=tiny_target.name, messages=msgs,
                                    max_tokens=10**7)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=tiny_target.name, messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError) as e:
        api.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):  # a prompt longer than the context
        api.completions.create(model=tiny_target.name, prompt=[5] * 3000, max_tokens=4)


def test_raw_http_errors_keep_the_shape(live, tiny_target):
    server, _ = live
    status, _, text = post(server, "/chat/completions", b"{not json")
    assert status == 400
    assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}
    # A body announced as larger than the limit is refused before it is read.
    status, _, text = post(server, "/chat/completions", b"{}",
                           {"Content-Length": str(9 * 1024 * 1024)})
    assert status == 413 and json.loads(text)["error"]["code"] == "request_too_large"
    status, _, text = post(server, "/nowhere", b"{}")
    assert status == 404 and "GET /v1/models" in json.loads(text)["error"]["message"]
    status, headers, text = post(server, "/chat/completions", json.dumps({
        "model": tiny_target.name, "stream": True, "max_tokens": 3,
        "messages": [{"role": "user", "content": PROMPT}]}).encode())
    events = [e for e in text.split("\n\n") if e]
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_an_api_key_is_required_when_set(tiny_client, tiny_target):
    from openai import OpenAI
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    client, pair = tiny_client
    server = LocalServer(ApiService(client, Served.of(pair, "plain")), port=0, api_key="s3cret")
    server.start()
    try:
        with OpenAI(base_url=server.url, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError) as e:
                bad.models.list()
            assert e.value.body["code"] == "invalid_api_key"
        with OpenAI(base_url=server.url, api_key="s3cret", max_retries=0) as good:
            r = good.chat.completions.create(model=tiny_target.name, max_tokens=3,
                                             messages=[{"role": "user", "content": PROMPT}])
            assert r.model_extra["speculative"]["mode"] == "plain"
    finally:
        server.stop()


def test_a_body_over_the_limit_is_refused_as_it_streams(tiny_client):
    """Without a Content-Length (chunked), the body is counted as it comes."""
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    client, pair = tiny_client
    server = LocalServer(ApiService(client, Served.of(pair, "plain")), port=0, max_body=1000)
    server.start()
    try:
        status, _, text = post(server, "/completions", iter([b"x" * 600, b"y" * 600]))
        assert status == 413 and "1,000 bytes" in json.loads(text)["error"]["message"]
        body = json.dumps({"model": pair.target.name, "prompt": IDS, "max_tokens": 2})
        status, _, text = post(server, "/completions", iter([body.encode()]))
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 2
    finally:
        server.stop()
