"""Issue 46: a draft head is a draft like any other for the local API.
With an EAGLE-3 head for the target as the draft (one right part of the
time, tinymodels.build_partial_eagle3; K fixed at 2, so that the blocks
do not depend on the clock), a greedy chat completion asked over HTTP on
127.0.0.1 is exactly plain decoding's reply, the API names the head as its
draft, and the head drafted it, accepted in part."""

from __future__ import annotations

import http.client
import json

from server_support import Serving, post
from specchat import cli
from specchat.library import importing
from tinymodels import build_partial_eagle3

PROMPT = "Hello, world! Hello, world!"  # the tiny target's reply runs past 24 tokens


def _chat(max_tokens: int = 24, model: str = "target-llama") -> bytes:
    return json.dumps({"model": model, "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()


def get_json(served, path: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200
        return json.loads(r.read())
    finally:
        conn.close()


def test_specchat_serve_takes_an_installed_head_as_its_draft(home, tiny_dir, tiny_target,
                                                             capsys):
    """``specchat serve --draft my-head``, the head named as installed."""
    importing.import_path(build_partial_eagle3(tiny_dir / "serve-eagle3", tiny_target),
                          name="my-head")
    assert cli.main(["generate", "--target", str(tiny_target), "--plain", "--prompt", PROMPT,
                     "--max-tokens", "24", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["stats"]["new_tokens"] == 24 and plain["stats"]["drafted"] == 0
    assert cli.main(["generate", "--target", str(tiny_target), "--draft", "my-head", "--k", "2",
                     "--prompt", PROMPT, "--max-tokens", "24"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == plain["text"].strip()
    assert "[hybrid] 24 tokens" in out.err and "(draft head my-head + suffix match" in out.err

    served = Serving(["--target", str(tiny_target), "--draft", "my-head", "--k", "2", "--port",
                      "0"], home)
    try:
        assert served.url.startswith("http://127.0.0.1:")
        models = get_json(served, "/v1/models")
        status, _, body = post(served, "/chat/completions", _chat(model=tiny_target.name))
    finally:
        log = served.stop()
    assert "loading the draft head my-head" in log
    assert "draft head my-head + suffix match" in log  # the banner names the head as a head
    assert [m["id"] for m in models["data"]] == [tiny_target.name]
    assert models["data"][0]["speculative"] == {"mode": "hybrid", "draft": "my-head"}
    assert status == 200, body
    r = json.loads(body)
    assert r["choices"][0]["message"]["content"] == plain["text"]
    assert r["usage"]["completion_tokens"] == 24 and r["choices"][0]["finish_reason"] == "length"
    spec = r["speculative"]
    assert spec["mode"] == "hybrid" and 0 < spec["accepted"] < spec["drafted"]
    assert sum(spec.get("tokens_by_origin", {}).values()) == 24


def test_the_api_drafts_with_a_head_and_replies_as_plain_decoding(tiny_dir, tiny_target):
    """In process, as the app serves its loaded pair: the head's reply and
    plain decoding's over the same HTTP endpoint are the same tokens, and
    the engine's summary the API reports to its owner counts the head's
    drafts under its own name."""
    from specchat.engine import modes
    from specchat.engine.client import EngineClient
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    head = build_partial_eagle3(tiny_dir / "api-eagle3", tiny_target)
    client = EngineClient()
    try:
        pair = client.load(str(tiny_target), str(head)).wait(120)
        assert pair.draft.model_type == "eagle3" and pair.draft.name == "api-eagle3"
        mode = modes.for_pair(True, pair.draft is not None, pair.speculative_ok)
        seen = []  # what the API reports to its owner (the app's status line)
        service = ApiService(client, Served.of(pair, mode.name, 2, str(tiny_target)),
                             on_activity=seen.append)
        server = LocalServer(service, port=0)
        server.start()
        try:
            assert server.url.startswith("http://127.0.0.1:")
            status, _, spec_body = post(server, "/chat/completions", _chat())
            assert status == 200, spec_body
            drafted = [a for a in seen if a.finished][-1].summary
            service.serve(Served.of(pair, modes.PLAIN.name, None, str(tiny_target)))
            status, _, plain_body = post(server, "/chat/completions", _chat())
            assert status == 200, plain_body
            plain = [a for a in seen if a.finished][-1].summary
        finally:
            server.stop()
    finally:
        client.close()
    spec, base = json.loads(spec_body), json.loads(plain_body)
    assert spec["choices"][0]["message"]["content"] == base["choices"][0]["message"]["content"]
    # The same counts (the second read its prompt from the cache the first left).
    cached = base["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert spec["usage"].pop("prompt_tokens_details")["cached_tokens"] < cached
    assert spec["usage"] == base["usage"] and spec["usage"]["completion_tokens"] == 24
    assert base["speculative"]["mode"] == "plain" and base["speculative"]["drafted"] == 0
    assert spec["speculative"]["mode"] == "hybrid"
    assert 0 < spec["speculative"]["accepted"] < spec["speculative"]["drafted"]
    assert Served.of(pair, mode.name).draft == "api-eagle3"  # what /v1/models names
    head = drafted.drafted_by.get("eagle3", {})
    assert 0 < head.get("accepted", 0) < head.get("drafted", 0), drafted.drafted_by
    assert plain.drafted == 0
