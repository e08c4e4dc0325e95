"""The local API accepts only what a local client sends, over real HTTP
as browsers and attackers send it: a Host of this computer with the
server's port (DNS rebinding sends another), no Origin of another page
(a cross-site form or fetch sends one), JSON bodies only (a "simple"
cross-site POST is text/plain or a form), CORS only for origins the user
listed; bodies, nesting and prompts bounded before any work; connections
that never finish their headers closed."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time

import pytest
from server_support import call, error

PROMPT = "Hello, world! How are you today?"


def chat_body(model: str, content: str = PROMPT, **extra) -> bytes:
    return json.dumps({"model": model, "max_tokens": 2, "temperature": 0,
                       "messages": [{"role": "user", "content": content}], **extra}).encode()


@pytest.fixture
def quiet(live):
    """The server's activity count before a test: a refused request must
    leave it as it was (nothing queued, nothing tokenized)."""
    server, recorder = live
    return server, recorder, len(recorder.seen)


def test_a_foreign_host_is_refused_before_any_work(quiet, tiny_target):
    """DNS rebinding: the attacker's name now points at 127.0.0.1, so the
    browser sends Host: attacker.example (and the page is same-origin to
    itself, so it could read the reply). Anything but a loopback name or
    address with this server's port is refused with 421."""
    server, recorder, before = quiet
    port = server.port
    for host in ("attacker.example", f"attacker.example:{port}", f"localhost.evil.example:{port}",
                 f"127.0.0.1.nip.io:{port}", "127.0.0.1", "localhost", f"127.0.0.1:{port + 1}",
                 f"0.0.0.0:{port}", f"10.0.0.1:{port}", f"[::2]:{port}", f"127.0.0.1:{port}x"):
        status, headers, text = call(port, "GET", "/models", headers={"Host": host})
        assert status == 421, (host, text)
        assert error(text)["code"] == "host_not_allowed"
        assert "access-control-allow-origin" not in headers
        status, _, text = call(port, "POST", "/chat/completions", chat_body(tiny_target.name),
                               {"Host": host, "Origin": f"http://{host}"})
        assert status == 421 and error(text)["code"] == "host_not_allowed", (host, text)
    assert len(recorder.seen) == before  # nothing was queued
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}",
                 f"127.3.2.1:{port}", f"[::1]:{port}"):
        status, _, text = call(port, "GET", "/models", headers={"Host": host})
        assert status == 200 and json.loads(text)["data"][0]["id"] == tiny_target.name, host


def test_a_page_of_another_origin_is_refused(quiet, tiny_target):
    """A cross-site page's request carries its Origin (a sandboxed frame or
    a file sends "null"); refused with 403 whatever it asks. The server's
    own loopback origin passes."""
    server, recorder, before = quiet
    port = server.port
    body = chat_body(tiny_target.name)
    for origin in ("http://evil.example", "null", f"http://localhost:{port + 1}",
                   f"https://127.0.0.1:{port}", f"http://127.0.0.1:{port}.evil.example",
                   "http://127.0.0.1", f"http://attacker.example:{port}"):
        for ctype in ("text/plain;charset=UTF-8", "application/json"):
            status, headers, text = call(port, "POST", "/chat/completions", body,
                                         {"Origin": origin, "Content-Type": ctype})
            assert status == 403, (origin, ctype, text)
            assert error(text)["code"] == "origin_not_allowed"
            assert "access-control-allow-origin" not in headers
        status, _, text = call(port, "GET", "/models", headers={"Origin": origin})
        assert status == 403 and error(text)["code"] == "origin_not_allowed"
    assert len(recorder.seen) == before
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        status, headers, text = call(port, "POST", "/chat/completions", body, {"Origin": origin})
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] <= 2
        # CORS only for the request's own origin (the Host is 127.0.0.1),
        # where a browser does not need it; none for another loopback name.
        assert headers.get("access-control-allow-origin") == (
            origin if "127.0.0.1" in origin else None)


@pytest.mark.parametrize("ctype", [None, "text/plain", "text/plain;charset=UTF-8",
                                   "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "text/json",
                                   "application/jsonx", "application/json-patch+json"])
def test_a_post_that_is_not_json_is_refused(quiet, tiny_target, ctype):
    """Only a JSON body is read: a browser must preflight it, so a page of
    another site cannot send one without CORS (a form, a text/plain fetch
    and a Blob without a type need no preflight)."""
    server, recorder, before = quiet
    status, _, text = call(server.port, "POST", "/chat/completions", chat_body(tiny_target.name),
                           {"Content-Type": ctype})
    assert status == 415, text
    e = error(text)
    assert e["code"] == "unsupported_media_type"
    assert e["message"] == ("Send the request body as JSON, with the header "
                            "'Content-Type: application/json'.")
    assert len(recorder.seen) == before


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=UTF-8"])
def test_json_in_any_spelling_is_read(live, tiny_target, ctype):
    server, _ = live
    status, _, text = call(server.port, "POST", "/chat/completions", chat_body(tiny_target.name),
                           {"Content-Type": ctype})
    assert status == 200, text


def preflight(port: int, origin: str) -> tuple[int, dict, str]:
    """What a browser sends before a cross-origin JSON POST."""
    return call(port, "OPTIONS", "/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})


def test_cors_is_off_unless_origins_are_listed(live):
    server, _ = live
    status, headers, text = preflight(server.port, "http://app.example:5173")
    assert status == 403 and error(text)["code"] == "origin_not_allowed"
    assert not any(h.startswith("access-control-") for h in headers)


def test_a_preflight_from_the_request_s_own_origin_is_answered(quiet, tiny_target):
    """A page's request to its own origin needs no CORS, and browsers send
    no preflight for it; one that comes all the same (a client that asks
    before every request, a tool checking the server) is answered as a
    listed origin's is, not refused with a 400. Another loopback origin of
    the same port (a page of ``localhost`` calling ``127.0.0.1``) is not
    the request's own: still no CORS for it."""
    server, recorder, before = quiet
    port = server.port
    for host in ("127.0.0.1", "localhost", "LocalHost"):
        origin = f"http://{host.lower()}:{port}"
        status, headers, text = call(port, "OPTIONS", "/chat/completions", headers={
            "Host": f"{host}:{port}", "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert status == 200, (host, text)
        assert headers["access-control-allow-origin"] == origin
        assert "POST" in headers["access-control-allow-methods"].split(", ")
        assert headers["access-control-allow-headers"] == "authorization,content-type"
        assert "access-control-allow-credentials" not in headers
    assert len(recorder.seen) == before  # a preflight runs nothing
    status, headers, _ = preflight(port, f"http://localhost:{port}")  # Host: 127.0.0.1
    assert status != 200 and "access-control-allow-origin" not in headers
    status, headers, text = call(port, "POST", "/chat/completions", chat_body(tiny_target.name),
                                 {"Origin": f"http://127.0.0.1:{port}"})
    assert status == 200, text


def test_listed_origins_get_cors_and_others_none(tiny_client, tiny_target):
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    client, pair = tiny_client
    listed = "http://app.example:5173"
    server = LocalServer(ApiService(client, Served.of(pair, "plain")), port=0,
                         cors_origins=(listed,))
    server.start()
    try:
        port = server.port
        status, headers, _ = preflight(port, listed)
        assert status == 200
        assert headers["access-control-allow-origin"] == listed
        assert {"GET", "POST"} <= set(headers["access-control-allow-methods"].split(", "))
        assert headers["access-control-allow-headers"] == "authorization,content-type"
        assert "Origin" in headers["vary"]
        assert "access-control-allow-credentials" not in headers
        body = chat_body(tiny_target.name)
        status, headers, text = call(port, "POST", "/chat/completions", body, {"Origin": listed})
        assert status == 200 and headers["access-control-allow-origin"] == listed
        # The listed page reads the server's errors too.
        status, headers, text = call(port, "POST", "/chat/completions", body,
                                     {"Origin": listed, "Content-Type": "text/plain"})
        assert status == 415 and headers["access-control-allow-origin"] == listed
        for other in ("http://app.example:5174", "https://app.example:5173", "null"):
            status, headers, text = preflight(port, other)
            assert status == 403 and not any(h.startswith("access-control-") for h in headers)
            status, headers, _ = call(port, "POST", "/chat/completions", body, {"Origin": other})
            assert status == 403 and "access-control-allow-origin" not in headers
        # The Host is still checked for a listed origin (rebinding).
        status, _, _ = call(port, "POST", "/chat/completions", body,
                            {"Origin": listed, "Host": f"app.example:{port}"})
        assert status == 421
    finally:
        server.stop()


def test_deep_json_is_refused_before_it_is_parsed(quiet, tiny_target):
    """Nesting is counted before ``json.loads`` (whose recursion a deep
    enough body exhausts): a 400 that says so, and where, not an internal
    error. Brackets inside strings do not count."""
    server, recorder, before = quiet
    deep = (b'{"model": "%s", "tools": ' % tiny_target.name.encode()
            + b"[" * 100_000 + b"]" * 100_000 + b"}")
    status, _, text = call(server.port, "POST", "/chat/completions", deep)
    assert status == 400, text
    assert error(text)["message"] == ("The request body nests JSON deeper than 64 levels (at "
                                      "tools[0][0][0][0][0][0][0]...).")
    assert error(text)["param"] == "tools[0][0][0][0][0][0][0]..."
    messages = json.dumps([{"role": "user", "content": [{"type": "text", "text": "[[{{\"]"}]},
                           {"role": "user", "content": "@"}]).replace('"@"', "[" * 70 + "]" * 70)
    status, _, text = call(server.port, "POST", "/chat/completions",
                           b'{"model": "m", "messages": %s}' % messages.encode())
    assert status == 400 and error(text)["param"] == "messages[1].content[0][0][0][0][0]..."
    assert len(recorder.seen) == before
    nested: object = 1
    for _ in range(61):  # 63 levels with the metadata's and the body's objects: under the bound
        nested = {"a": nested}
    status, _, text = call(server.port, "POST", "/chat/completions",
                           chat_body(tiny_target.name, "[[[[{{{{ \\\" ]]" * 50,
                                     metadata={"a": nested}))
    assert status == 200, text


def test_a_prompt_past_the_bound_is_refused_before_it_is_tokenized(quiet, tiny_target):
    """A prompt is counted in UTF-8 bytes before it reaches the engine (a
    token is at least a byte, so that bounds its tokens too): text,
    messages, emoji (999,000 of them are under a million characters but
    were 3 million tokens, seconds of the engine thread) and token ids, all
    refused at once, none queued."""
    from specchat import values

    server, recorder, before = quiet
    bound = int(values.LIMITS["prompt"].high)
    huge = "word " * (bound // 5 + 1)
    emoji = "🙂" * 999_000

    def completion(prompt) -> bytes:
        return json.dumps({"model": tiny_target.name, "prompt": prompt, "max_tokens": 2},
                          ensure_ascii=False).encode()

    def chat(*contents: str) -> bytes:
        return json.dumps({"model": tiny_target.name, "max_tokens": 2, "messages": [
            {"role": "system", "content": contents[0]},
            *({"role": "user", "content": c} for c in contents[1:])]}, ensure_ascii=False).encode()

    def in_bytes(n: int) -> str:
        return (f"the prompt is {n:,} bytes of UTF-8 text, more than SpecChat reads at once "
                f"({bound:,} bytes, at most as many tokens); shorten it")

    for path, body, param, message in (
            ("/completions", completion(huge), "prompt", in_bytes(len(huge))),
            ("/completions", completion(emoji), "prompt", in_bytes(4 * len(emoji))),
            ("/chat/completions", chat(huge[:bound], "hi there"), "messages",
             in_bytes(bound + len("hi there"))),
            ("/chat/completions", chat("", emoji), "messages", in_bytes(4 * len(emoji))),
            ("/completions", completion([5] * (bound + 1)), "prompt",
             f"the prompt is {bound + 1:,} tokens, more than SpecChat reads at once "
             f"({bound:,}); shorten it")):
        started = time.monotonic()
        status, _, text = call(server.port, "POST", path, body)
        e = error(text)
        assert status == 400 and e["param"] == param, text
        assert e["message"] == message
        assert time.monotonic() - started < 5
    assert len(recorder.seen) == before  # never queued for the engine


def test_a_prompt_just_within_the_bound_is_tokenized(live, tiny_target):
    """The bound is on bytes, not characters: 500,000 two-byte characters
    are within it, so the engine tokenizes them, and then refuses them in
    tokens against the model's context (the tiny target reads 2,048)."""
    from specchat import values

    server, recorder = live
    bound = int(values.LIMITS["prompt"].high)
    body = json.dumps({"model": tiny_target.name, "prompt": "é" * (bound // 2),
                       "max_tokens": 2}).encode()
    status, _, text = call(server.port, "POST", "/completions", body)
    assert status == 400, text
    assert re.fullmatch(r"The prompt is [\d,]+ tokens, more than target-llama can read "
                        r"\(2,048\)\. Start a new conversation or shorten the message\.",
                        error(text)["message"]), text


# Each list a request carries, one item or one character past its bound:
# (endpoint, body fields, the parameter named, the message).
_PAST = [
    ("/chat/completions", {"stop": ["x"] * 65}, "stop",
     "too many stop strings: 65; at most 64 in one request"),
    ("/completions", {"stop": ["x"] * 65}, "stop",
     "too many stop strings: 65; at most 64 in one request"),
    ("/chat/completions", {"stop": ["x" * 2048, "y" * 2049]}, "stop",
     "too many characters of stop strings: 4,097; at most 4,096 in one request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 10_001}, "messages",
     "too many messages: 10,001; at most 10,000 in one request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}] * 1_001}]}, "messages[0].content",
     "too many content parts: 1,001; at most 1,000 in one message"),
    ("/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}] * 129},
     "tools", "too many tools: 129; at most 128 in one request"),
    ("/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "description": "x" * 999_939}}]}, "tools",
     "too many bytes of tools: 1,000,001; at most 1,000,000 in one request, as UTF-8 JSON"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
            "name": "f", "arguments": "{}"}} for i in range(129)]}]}, "messages[1].tool_calls",
     "too many tool calls: 129; at most 128 in one message"),
    ("/chat/completions", {"chat_template_kwargs": {f"s{i}": True for i in range(33)}},
     "chat_template_kwargs", "too many template switches: 33; at most 32 in one request"),
    ("/chat/completions", {"chat_template_kwargs": {"a": "x" * 2047, "b": "y" * 2048}},
     "chat_template_kwargs",  # the names count too
     "too many characters of template switches: 4,097; at most 4,096 in one request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}] + [{
        "role": "assistant", "tool_calls": [{"id": f"c{t}-{i}", "type": "function", "function": {
            "name": "f", "arguments": "{}"}} for i in range(128)]} for t in range(79)]},
     "messages[79].tool_calls", "too many tool calls in all: 10,112; at most 10,000 in one "
                                "request"),
]


def test_every_list_a_request_carries_is_bounded(quiet, tiny_target):
    """Stop strings, messages, a message's parts and calls, tools and
    template switches, each bounded in count and in length (``specchat.values``), refused with a 400 naming
    the field before the request is queued. The request of issue 47 (400,000
    stop strings, 79 s of the engine thread) is refused at once."""
    server, recorder, before = quiet
    flood = {"stop": [f"s{i}" for i in range(400_000)]}
    cases = [*_PAST, ("/chat/completions", flood, "stop",
                      "too many stop strings: 400,000; at most 64 in one request")]
    for path, fields, param, message in cases:
        body = json.loads(chat_body(tiny_target.name))
        if path == "/completions":
            del body["messages"]
            body["prompt"] = PROMPT
        started = time.monotonic()
        status, _, text = call(server.port, "POST", path, json.dumps({**body, **fields}).encode())
        assert status == 400, (param, text)
        assert error(text)["param"] == param and error(text)["message"] == message, text
        assert time.monotonic() - started < 5
    assert len(recorder.seen) == before


def test_a_long_model_name_is_not_sent_back(quiet):
    """The one free string the server repeats in an answer is shortened:
    a megabyte of model name is a 404 of a line, not of a megabyte."""
    server, recorder, before = quiet
    body = json.dumps({"model": "m" * 1_000_000, "prompt": PROMPT}).encode()
    status, _, text = call(server.port, "POST", "/completions", body)
    assert status == 404 and len(text) < 400, text[:200]
    assert error(text)["message"].startswith(f"The model '{'m' * 37}...' does not exist here")
    assert len(recorder.seen) == before


def test_lists_at_their_bounds_are_served(api, tiny_target):
    """The same lists at their bounds are answered: the most stop strings
    (as long as they may be together), parts and tools (not offered to the
    model, tool_choice none: the tiny target's template takes none). (As
    many messages as the bound allows render to more tokens than the tiny
    target reads: ``test_server_protocol`` takes them.)"""
    stops = [f"{i:02d}" + "#" * 62 for i in range(64)]
    r = api.chat.completions.create(
        model=tiny_target.name, max_tokens=2, temperature=0, stop=stops, tool_choice="none",
        tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(128)],
        messages=[{"role": "user", "content": [{"type": "text", "text": "h"}] * 1_000}])
    assert r.usage.completion_tokens <= 2 and r.usage.prompt_tokens > 100


def test_a_connection_that_never_finishes_its_headers_is_closed(live, tiny_target):
    """Slowloris: a silent connection, one that drips a header a byte at a
    time, and a kept-alive one that starts a second request and stops, are
    all closed once HEADER_SECONDS have passed without complete headers."""
    from specchat.server.connections import HEADER_SECONDS

    server, _ = live
    port = server.port
    start = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
    silent = socket.create_connection(("127.0.0.1", port))
    dripping = socket.create_connection(("127.0.0.1", port))
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    kept.request("GET", "/v1/models", headers={"Host": f"127.0.0.1:{port}"})
    assert kept.getresponse().read()
    kept.sock.sendall(start)  # a second request on the same connection, never finished
    opened = time.monotonic()
    stop = threading.Event()

    def drip() -> None:
        for byte in (start + b"X-Padding: " + b"a" * 100):
            if stop.is_set():
                return
            try:
                dripping.sendall(bytes([byte]))
            except OSError:
                return  # closed by the server
            time.sleep(0.2)

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        for sock in (silent, dripping, kept.sock):
            sock.settimeout(HEADER_SECONDS + 10)
            try:
                assert sock.recv(1024) == b""  # the server closed it
            except ConnectionResetError:
                pass
        assert HEADER_SECONDS - 0.5 <= time.monotonic() - opened < HEADER_SECONDS + 5
    finally:
        stop.set()
        dripper.join(10)
        silent.close()
        dripping.close()
        kept.close()
    # The server still answers.
    status, _, _ = call(port, "GET", "/models")
    assert status == 200


def test_a_body_that_stops_coming_is_answered_408(tiny_client, tiny_target, monkeypatch):
    """Headers in time, then a body that never finishes: the request ends
    once BODY_SECONDS have passed, with a 408 in OpenAI's shape."""
    from specchat.server import body as request_body
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    monkeypatch.setattr(request_body, "BODY_SECONDS", 0.5)
    client, pair = tiny_client
    server = LocalServer(ApiService(client, Served.of(pair, "plain")), port=0)
    server.start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.settimeout(30)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     '{"model": '.encode())
        started = time.monotonic()
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        text = reply.read().decode()
        sock.close()
        assert 0.4 <= time.monotonic() - started < 10
        assert reply.status == 408
        assert error(text) == {"message": "The request body did not arrive within 0.5 seconds.",
                               "type": "invalid_request_error", "param": None,
                               "code": "request_timeout"}
    finally:
        server.stop()


def test_nesting_is_counted_outside_strings_only():
    """check_nesting against the depth of random JSON whose strings (and
    keys) hold brackets, quotes and backslashes (escaped as json.dumps
    escapes them), and the place it names against the path to the first
    container past the bound."""
    import random

    from specchat import records
    from specchat.server.body import check_nesting
    from specchat.server.errors import ApiError

    rng = random.Random(7)
    nasty = ['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '"]', '\\[', 'é', '\u2028', 'x']

    def build(depth: int) -> tuple[object, int]:
        if depth == 0 or rng.random() < 0.2:
            return "".join(rng.choice(nasty) for _ in range(rng.randint(0, 6))), 0
        children = [build(depth - 1) for _ in range(rng.randint(1, 3))]
        deepest = 1 + max(d for _, d in children)
        if rng.random() < 0.5:
            return [c for c, _ in children], deepest
        return {"".join(rng.choice(nasty) for _ in range(3)) + str(i): c
                for i, (c, _) in enumerate(children)}, deepest

    def first_at(value: object, depth: int, path: list) -> list | None:
        """The steps to the first container (in the text's order) that
        opens level ``depth`` (the whole value's is 1)."""
        if not isinstance(value, list | dict):
            return None
        if depth == 1:
            return path
        for step, child in enumerate(value) if isinstance(value, list) else value.items():
            found = first_at(child, depth - 1, [*path, step])
            if found is not None:
                return found
        return None

    for _ in range(300):
        value, depth = build(rng.randint(1, 12))
        body = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        check_nesting(body, limit=depth)
        if depth:
            with pytest.raises(ApiError, match=f"deeper than {depth - 1} levels") as e:
                check_nesting(body, limit=depth - 1)
            # ... naming where: its first steps (records.deep_path).
            steps = first_at(value, depth, [])
            where = records.field_path(steps[:8]) + ("..." if depth - 1 > 8 else "")
            assert e.value.param == (where or None), (body, steps)
