"""``specchat serve``: who may connect, the pair it serves, and the command
itself run as a person runs it (a process, stopped with Ctrl+C)."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest
from server_support import Serving
from specchat.server.errors import ServerError
from specchat.server.listener import KEY_VARIABLE, LocalServer, api_key_from, check_bind


def test_loopback_needs_nothing():
    """Loopback as the system's resolver reads it, however it is written
    (values.address): inet_aton's short, octal and hex forms, and IPv4
    inside IPv6; any other address needs the flag and a key."""
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "127.1", "0x7f.0.0.1",
                 "0177.0.0.1", "2130706433", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]"):
        check_bind(host, allow_remote=False, api_key=None)
    for host in ("0", "0x0", "::ffff:0.0.0.0", "0x0a.1", "10.1", "example.com"):
        with pytest.raises(ServerError, match="Pass --allow-remote and an API key"):
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


def test_the_key_comes_from_a_file_or_the_environment(monkeypatch, tmp_path):
    """Never from the command line, where ``ps`` shows it to every user."""
    monkeypatch.setenv(KEY_VARIABLE, "from-env")
    given = tmp_path / "key"
    given.write_text("from-file\n")
    assert api_key_from(None) == "from-env" and api_key_from(given) == "from-file"
    monkeypatch.setenv(KEY_VARIABLE, "  ")
    assert api_key_from(None) is None
    for bad, words in ((tmp_path / "missing", "Cannot read the API key file"),
                       (tmp_path, "Cannot read the API key file")):
        with pytest.raises(ServerError) as e:
            api_key_from(bad)
        assert str(e.value).startswith(words) and "\n" not in str(e.value)
    given.write_text(" \n")
    with pytest.raises(ServerError) as e:
        api_key_from(given)
    assert str(e.value) == f"The API key file {given} is empty."


def test_a_key_no_client_can_send_is_refused_before_the_server_starts(monkeypatch, tmp_path):
    """A key with an accented letter (or a second line) started a server
    that said "API key required" and that no client could ever use: the
    openai client cannot encode it in a header, and a raw one arrives
    read as Latin-1. Refused in one line that never shows the key."""
    given = tmp_path / "key"
    for key, where, what in (("clé-secret", f"The API key file {given}", "its character 3 is "
                                                                          "not ASCII"),
                             ("line1\nline2", f"The API key file {given}", "its character 6 is a "
                                                                          "line break")):
        given.write_text(key + "\n")
        with pytest.raises(ServerError) as e:
            api_key_from(given)
        assert str(e.value).startswith(f"{where} holds a key an HTTP header cannot carry: {what}")
        assert "secret" not in str(e.value) and "line2" not in str(e.value)
    monkeypatch.setenv(KEY_VARIABLE, "tab\there")
    with pytest.raises(ServerError, match=f"^{KEY_VARIABLE} holds a key an HTTP header cannot "):
        api_key_from(None)
    monkeypatch.delenv(KEY_VARIABLE)
    given.write_text("clé-secret\n")
    proc = subprocess.run([sys.executable, "-m", "specchat", "serve", "--api-key-file",
                           str(given), "--target", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "holds a key an HTTP header cannot carry" in proc.stderr


def test_serve_takes_no_key_on_the_command_line(capsys, tmp_path):
    from specchat import cli

    with pytest.raises(SystemExit) as e:  # refused before anything would load
        cli.main(["serve", "--api-key", "s3cret", "--target", str(tmp_path / "none")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("specchat serve: error: argument --api-key: a key on the command line shows "
                   f"in ps: set {KEY_VARIABLE} or pass --api-key-file FILE (see specchat serve "
                   "--help)")


def test_a_key_file_that_is_no_regular_file_is_named_for_what_it_is(tmp_path):
    """A FIFO given as --api-key-file was "no such file" (and read, one
    would hang the start for good): the command says what is there, and
    ``api_key_from``, which reads the file, never waits on one. The same
    argument type takes bench's --prompts."""
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    for args, path, what in ((["serve", "--api-key-file"], fifo, "a FIFO (named pipe)"),
                             (["serve", "--api-key-file"], tmp_path, "a folder"),
                             (["bench", "--target", "t", "--prompts"], fifo, "a FIFO (named pipe)")):
        proc = subprocess.run([sys.executable, "-m", "specchat", *args, str(path)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert (f" error: argument {args[-1]}: {path} is {what}, not a regular file (see "
                in proc.stderr.splitlines()[-1]), proc.stderr
    gone = tmp_path / "gone"  # a link to nothing was "no such file"
    gone.symlink_to(tmp_path / "nowhere")
    for args in (["serve", "--api-key-file"], ["bench", "--target", "t", "--prompts"],
                 ["generate", "--target", "t", "--prompt", "hi", "--tools"]):
        proc = subprocess.run([sys.executable, "-m", "specchat", *args, str(gone)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert (f" error: argument {args[-1]}: {gone} is a link to {tmp_path / 'nowhere'}, which "
                "is not there (see " in proc.stderr.splitlines()[-1]), proc.stderr
    got: list[BaseException] = []

    def read() -> None:
        try:
            api_key_from(fifo)
        except ServerError as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "api_key_from waited on a FIFO"
    assert [str(e) for e in got] == [f"Cannot read the API key file {fifo}: it is a FIFO "
                                     "(named pipe), not a regular file."]


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
    assert cli.serve_pair(parse(["serve", "--plain"])) == (bundled.DEFAULT_TARGET, None)
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


def test_serve_reads_its_key_from_a_file_and_lists_cors_origins(tiny_target, tmp_path):
    """The key is in a file (not in ``ps``): requests without it get 401;
    a listed origin gets CORS answers."""
    import http.client

    import openai
    from openai import OpenAI

    keyfile = tmp_path / "key"
    keyfile.write_text("s3cret-key\n")
    served = Serving(["--target", str(tiny_target), "--port", "0", "--plain",
                      "--api-key-file", str(keyfile), "--cors-origin", "http://app.example:5173",
                      "--cors-origin", "vscode-webview://abc"], tmp_path)
    try:
        with open(f"/proc/{served.proc.pid}/cmdline", "rb") as f:
            assert b"s3cret-key" not in f.read()
        with OpenAI(base_url=served.url, api_key="wrong", max_retries=0, timeout=60) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with OpenAI(base_url=served.url, api_key="s3cret-key", max_retries=0, timeout=60) as good:
            assert good.models.list().data[0].id == tiny_target.name
        for origin in ("http://app.example:5173", "vscode-webview://abc"):
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
            conn.request("OPTIONS", "/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            r = conn.getresponse()
            assert r.status == 200 and r.getheader("access-control-allow-origin") == origin
            conn.close()
        assert "API key required" in "".join(served.lines)
        served.stop()
    finally:
        served.kill()


def test_a_client_gone_mid_body_leaves_no_traceback(tiny_target, tmp_path):
    """A client that closes (or resets) its connection halfway through its
    body: at most one quiet line each in the server's log, no traceback,
    and the server goes on answering."""
    import socket

    from openai import OpenAI

    served = Serving(["--target", str(tiny_target), "--port", "0", "--plain"], tmp_path)
    try:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                '{"model": "x", "messages": [').encode()
        for reset in (False, True):
            sock = socket.create_connection(("127.0.0.1", served.port))
            sock.sendall(head)
            time.sleep(0.5)  # the server is reading the body by now
            if reset:  # an RST rather than a FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        time.sleep(0.5)
        with OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60) as api:
            r = api.chat.completions.create(model=tiny_target.name, max_tokens=2,
                                            messages=[{"role": "user", "content": "Hello"}])
        assert r.usage.completion_tokens <= 2
        log = served.stop()
    finally:
        served.kill()
    assert "Traceback" not in log and "Exception" not in log, log
    gone = [line for line in log.splitlines() if "disconnected" in line]
    assert len(gone) <= 2, log
    assert all(line.endswith("a client disconnected before sending its whole request")
               for line in gone), log


@pytest.mark.parametrize("host, shown", [("[::1]", "[::1]"), ("::1", "[::1]"),
                                         ("127.1", "127.1")])
def test_serve_listens_on_loopback_however_written(tiny_target, tmp_path, host, shown):
    """IPv6 loopback, and ``--host 127.1``, which is 127.0.0.1 to a socket:
    served as loopback (no --allow-remote, the Host check on), not refused
    as another machine."""
    from openai import OpenAI

    served = Serving(["--target", str(tiny_target), "--port", "0", "--plain", "--host", host],
                     tmp_path)
    try:
        assert served.url == f"http://{shown}:{served.port}/v1"
        with OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60) as api:
            r = api.chat.completions.create(model=tiny_target.name, max_tokens=2,
                                            messages=[{"role": "user", "content": "Hello"}])
        assert r.usage.completion_tokens <= 2
        served.stop()
    finally:
        served.kill()
