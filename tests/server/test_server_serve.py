"""``specchat serve``: who may connect, the pair it serves, and the command
itself run as a person runs it (a process, stopped with Ctrl+C)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from specchat.server.errors import ServerError
from specchat.server.listener import KEY_VARIABLE, LocalServer, api_key_from, check_bind


def test_loopback_needs_nothing():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        check_bind(host, allow_remote=False, api_key=None)


@pytest.mark.parametrize("allow,key,words", [
    (False, None, "Pass --allow-remote and an API key"),
    (False, "k", "Pass --allow-remote and an API key"),
    (True, None, "without an API key"),
])
def test_another_address_needs_the_flag_and_a_key(allow, key, words):
    with pytest.raises(ServerError) as e:
        check_bind("0.0.0.0", allow_remote=allow, api_key=key)
    assert words in str(e.value) and "\n" not in str(e.value)
    check_bind("0.0.0.0", allow_remote=True, api_key="k")  # both: allowed (not bound here)


def test_the_server_refuses_before_binding(tiny_client):
    """LocalServer checks before it opens a socket: nothing listens."""
    from specchat.server.service import ApiService

    client, _pair = tiny_client
    with pytest.raises(ServerError):
        LocalServer(ApiService(client), host="0.0.0.0", port=0)


def test_a_port_in_use_is_one_line(tiny_client):
    from specchat.server.service import ApiService

    client, _pair = tiny_client
    first = LocalServer(ApiService(client), port=0)
    try:
        with pytest.raises(ServerError) as e:
            LocalServer(ApiService(client), port=first.port)
        assert f"Port {first.port} on 127.0.0.1 is in use" in str(e.value)
    finally:
        first.stop()


def test_the_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.setenv(KEY_VARIABLE, "from-env")
    assert api_key_from(None) == "from-env" and api_key_from("given") == "given"
    monkeypatch.setenv(KEY_VARIABLE, "  ")
    assert api_key_from(None) is None


def test_serve_refuses_a_remote_host_in_one_line(home, capsys):
    """Refused before any model loads (the default pair is never touched)."""
    from specchat import cli

    assert cli.main(["serve", "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("specchat: error: Refusing to listen on 0.0.0.0") and "\n" not in err
    assert cli.main(["serve", "--host", "0.0.0.0", "--allow-remote"]) == 1
    assert "without an API key" in capsys.readouterr().err


def test_serve_defaults_to_the_built_in_pair():
    from specchat import cli
    from specchat.library import bundled

    parse = cli.build_parser().parse_args
    assert cli.serve_pair(parse(["serve"])) == (bundled.DEFAULT_TARGET, bundled.DEFAULT_DRAFT)
    assert cli.serve_pair(parse(["serve", "--lookup"])) == (bundled.DEFAULT_TARGET, None)
    assert cli.serve_pair(parse(["serve", "--target", "t"])) == ("t", None)
    assert cli.serve_pair(parse(["serve", "--target", "t", "--draft", "d"])) == ("t", "d")
    with pytest.raises(SystemExit):
        parse(["serve", "--port", "70000"])


def test_specchat_serve_runs_until_ctrl_c(tiny_target, tiny_draft, tmp_path):
    from openai import OpenAI

    env = {**os.environ, "SPECCHAT_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specchat", "serve", "--target", str(tiny_target),
         "--draft", str(tiny_draft), "--port", "0", "--plain"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"SpecChat API on (http://127\.0\.0\.1:\d+/v1)", line)
            if found:
                url = found.group(1)
                assert "plain decoding" in line and tiny_target.name in line
                break
        assert url, "the server never said where it listens"
        with OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) as api:
            r = api.chat.completions.create(
                model=tiny_target.name, max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": "Hello"}])
        assert r.usage.completion_tokens <= 4
        assert r.model_extra["speculative"]["mode"] == "plain"
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(60) == 0, rest
        assert f"[api] {r.id}:" in rest  # each request is logged as it ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
