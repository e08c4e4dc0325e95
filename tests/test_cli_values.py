"""The specchat command refuses bad values as usage errors: exit 2 and one
line naming the range (the same line the engine and the settings give),
including text whose bytes are not UTF-8, passed through a real argv."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from specchat.engine.compat import SAME_MODEL

ENV = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


def specchat(*args: str | bytes) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "specchat", *args]
    return subprocess.run(argv, env=ENV, capture_output=True, timeout=120)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    text = proc.stderr.decode("utf-8")  # every message prints as UTF-8
    assert "Traceback" not in text and "Internal error" not in text, text
    return [line for line in text.splitlines() if "error" in line]


@pytest.mark.parametrize("args,words", [
    (["--temperature", "nan"], "argument --temperature: temperature must be a number from 0 to 5"),
    (["--temperature", "inf"], "temperature must be a number from 0 to 5"),
    (["--temperature=-1"], "temperature must be a number from 0 to 5"),
    (["--top-p", "0"], "argument --top-p: top-p must be a number above 0 and at most 1"),
    (["--top-k", "-3"], "argument --top-k: top-k must be a whole number from 0 to 1000000"),
    (["--max-tokens", "0"], "max tokens must be a whole number from 1 to 1048576"),
    (["--seed", "1.5"], "argument --seed: seed must be a whole number"),
    (["--k", "0"], "argument --k: K must be a whole number from 1 to 32"),
    ([b"--prompt", b"ab\xffc"],
     "argument --prompt: the prompt is not valid UTF-8 text: byte 0xFF at character 3"),
    ([b"--system", b"\xc3("], "argument --system: the system prompt is not valid UTF-8 text"),
    ([b"--stop", b"\xff"], "argument --stop: a stop string is not valid UTF-8 text"),
    (["--draft", ""], "argument --draft: No model given: pass"),
])
def test_generate_refuses_a_bad_value_as_a_usage_error(tiny_target, args, words):
    base = ["generate", "--target", str(tiny_target), "--max-tokens", "3"]
    if b"--prompt" not in args:
        base += ["--prompt", "hi"]
    proc = specchat(*base, *args)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and words in lines[0], lines


def test_generate_accepts_any_integer_as_a_seed(tiny_target):
    for seed in ("-1", str(-10 ** 30), str(10 ** 30)):
        proc = specchat("generate", "--target", str(tiny_target), "--prompt", "hi",
                        "--max-tokens", "3", "--temperature", "1", "--seed", seed, "--json")
        assert proc.returncode == 0, proc.stderr.decode()


def test_bench_refuses_bad_values(tiny_target, tiny_draft, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "kind": "chat", "messages": []}\n')
    for args, words in ((["--temperature", "nan"], "temperature must"),
                        (["--seed", "x"], "seed must"),
                        (["--max-tokens", "-4"], "max tokens must"),
                        (["--background-load", "-1"], "background load must"),
                        (["--background-load", "100000"], "background load must"),
                        (["--draft", " "], "No model given"),
                        (["--prompts", str(tmp_path / "none.jsonl")], "no such file: ")):
        base = ["bench", "--target", str(tiny_target), "--draft", str(tiny_draft),
                "--prompts", str(prompts)]
        proc = specchat(*base, *args)
        assert proc.returncode == 2
        lines = error_lines(proc)
        assert len(lines) == 1 and words in lines[0], lines


def test_a_draft_that_is_the_target_is_refused_in_the_check_s_words(tiny_target):
    proc = specchat("generate", "--target", str(tiny_target), "--draft", f"{tiny_target}/",
                    "--prompt", "hi", "--max-tokens", "3")
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and SAME_MODEL in lines[0], lines


def test_a_model_in_an_unknown_user_s_home_is_not_found(tmp_path):
    """``~nobody-here/model``: expanding it is a RuntimeError in pathlib, which
    used to reach the user as "RuntimeError: Could not determine home directory"."""
    proc = specchat("generate", "--target", "~specchat-no-such-user/model", "--prompt", "hi")
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and "Model file or folder not found: ~specchat-no-such-user" in lines[0]
    assert "RuntimeError" not in lines[0]


# -- Ctrl-C during a reply ---------------------------------------------------------------

def _generating(*args: str) -> subprocess.Popen:
    """``specchat generate`` as a terminal's foreground job: SIGINT reaches
    it with Python's default handler even if this test runs where SIGINT is
    ignored (a shell's background job)."""
    return subprocess.Popen([sys.executable, "-m", "specchat", "generate", *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# The tiny target reads 2048 positions: a reply of every token the context
# has room for runs for many seconds on this machine.
LONG = ["--prompt", "hi", "--max-tokens", "1048576"]


def _interrupted(proc: subprocess.Popen, ready) -> tuple[bytes, bytes]:
    """Wait for ``ready(proc)`` (it returns what it read of stdout), send
    SIGINT, and return all of stdout and stderr; a process that does not
    end is killed."""
    try:
        before = ready(proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return before + out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _streaming(proc: subprocess.Popen) -> bytes:
    streamed = b""
    while len(streamed) < 40:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, proc.stderr.read().decode()
        streamed += chunk
    return streamed


def test_ctrl_c_in_text_mode_cancels_the_reply_and_says_so(tiny_target):
    proc = _generating("--target", str(tiny_target), *LONG)
    out, err = _interrupted(proc, _streaming)
    assert proc.returncode == 130
    assert out.decode("utf-8").endswith("\n")  # the partial reply, then the next line starts clean
    lines = err.decode("utf-8").splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert lines[-1] == "specchat: reply cancelled (Ctrl-C): the text above is incomplete"
    stats = re.fullmatch(r"\[plain\] (\d+) tokens, .*", lines[-2])
    assert stats and 0 < int(stats.group(1)) < 2000, lines[-2]


def test_ctrl_c_in_json_mode_reports_a_cancelled_reply(tiny_target):
    """--json prints nothing until the end, so the interrupt is sent after a
    wait; one that lands while the model is still loading is an interrupted
    command (exit 130, no JSON: the load is cancelled and waited for, where
    exiting with the engine thread inside MLX aborted the process), and the
    next attempt waits longer."""
    for wait in (4, 8, 16, 32):
        proc = _generating("--target", str(tiny_target), *LONG, "--json")
        out, err = _interrupted(proc, lambda _proc, wait=wait: time.sleep(wait) or b"")
        assert proc.returncode == 130, err.decode()
        if not out:
            assert err.decode().splitlines()[-1] == "specchat: interrupted"
            continue
        reply = json.loads(out)
        assert reply["finish_reason"] == "cancelled"
        assert 0 < reply["stats"]["new_tokens"] == len(reply["token_ids"]) < 2000
        assert "Traceback" not in err.decode()
        return
    pytest.fail("every interrupt came before the reply started")


# -- environment variables --------------------------------------------------------------

@pytest.mark.parametrize("variable,typed,allowed", [
    ("SPECCHAT_DTYPE", "float8", "SPECCHAT_DTYPE must be float32, float16, bfloat16 or q4"),
    ("SPECCHAT_BLAS", "blsi", "SPECCHAT_BLAS must be blis, openblas, bundled or the path of "
                              "a CBLAS library"),
])
def test_a_bad_environment_value_is_one_line_naming_the_variable(tiny_target, tmp_path,
                                                                  variable, typed, allowed):
    env = {**ENV, variable: typed, "SPECCHAT_HOME": str(tmp_path)}
    for args in (["generate", "--target", str(tiny_target), "--prompt", "hi"],
                 ["models", "list"]):
        proc = subprocess.run([sys.executable, "-m", "specchat", *args], env=env,
                              capture_output=True, timeout=120)
        assert proc.returncode == 1
        assert proc.stdout == b""
        lines = error_lines(proc)
        assert lines == [f"specchat: error: {allowed}; got {typed}"], lines
        assert "bug" not in proc.stderr.decode()


def test_the_app_with_a_bad_environment_value_says_so_instead_of_opening(tiny_target, tmp_path):
    """The GUI path (no subcommand) goes through the same check: the one
    line and exit 1, not a window running on a BLAS nobody chose."""
    env = {**ENV, "SPECCHAT_BLAS": "blsi", "SPECCHAT_HOME": str(tmp_path),
           "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run([sys.executable, "-m", "specchat", "--target", str(tiny_target)],
                          env=env, capture_output=True, timeout=60)
    assert proc.returncode == 1
    assert error_lines(proc) == ["specchat: error: SPECCHAT_BLAS must be blis, openblas, "
                                 "bundled or the path of a CBLAS library; got blsi"]


# -- options that contradict each other -------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["generate", "--plain", "--lookup"], "argument --lookup: not allowed with argument --plain"),
    (["generate", "--lookup", "--plain"], "argument --plain: not allowed with argument --lookup"),
    (["generate", "--plain", "--draft", "d"],
     "argument --draft: not allowed with argument --plain"),
    (["generate", "--lookup", "--no-lookup"], "argument --no-lookup: only with --draft"),
    (["generate", "--plain", "--no-lookup"], "argument --no-lookup: only with --draft"),
    # --host 0.0.0.0 without --allow-remote: a server that got past the
    # options would stop there, before loading anything.
    (["serve", "--plain", "--lookup", "--host", "0.0.0.0"],
     "argument --lookup: not allowed with argument --plain"),
])
def test_contradictory_modes_are_refused(tiny_target, args, words):
    command, *rest = args
    base = [command, "--target", str(tiny_target)]
    if command == "generate":
        base += ["--prompt", "hi", "--max-tokens", "3"]
    proc = specchat(*base, *rest)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert lines == [f"specchat {command}: error: {words} (see specchat {command} --help)"], lines


# -- the CLI and the API take the same values -------------------------------------------

# Every value both ``specchat generate`` and the API take: its entry in
# specchat.values, the CLI's option and the API's parameter. The prompt is
# the completion prompt's: a chat message is named by its place in the list.
SHARED = {
    "temperature": ("--temperature", "temperature"),
    "top-p": ("--top-p", "top_p"),
    "top-k": ("--top-k", "top_k"),
    "seed": ("--seed", "seed"),
    "max tokens": ("--max-tokens", "max_tokens"),
    "a stop string": ("--stop", "stop"),
    "the prompt": ("--prompt", "prompt"),
}
# Values of the table that a request to the API does not carry: the draft
# length is the server's (``specchat serve --k``), the context is ``models
# check``'s, the hub timeout an environment variable's; the API's system
# prompt is a message like any other; the cluster port is cluster create's, the
# port the Local server setting's (store/settings.py); the rest are other
# commands' (test_every_number_a_subcommand_takes_is_checked_by_the_table).
CLI_ONLY = {"K", "context", "hub timeout", "the system prompt", "cluster port", "port",
            # models recommend's, bench's, and heads train's (the window's Train row too)
            "prompts", "background load", "minutes", "updates", "checkpoint seconds",
            "held-out pieces", "draft vocabulary", "text characters", "replies", "reply tokens",
            # serve's and the Local server setting's memory for conversations put aside
            "prompt cache"}
# Bounds on what one request carries (``values.size``, ``prompt_size``),
# not values typed: the prompt's size and the stop strings and messages,
# checked by the engine for every caller alike (request_check.py), as are
# tools, their calls and the template's switches (chat_rules.py; the CLI's
# --tools file by the same rules); the content parts the API alone reads
# (protocol.py), and the Responses API's input items (responses.py). The
# CLI's --stop is held to the stop strings' bounds below.
SIZES = {"prompt", "stop strings", "characters of stop strings", "messages", "content parts",
         "tools", "bytes of tools", "tool calls", "tool calls in all", "template switches",
         "characters of template switches", "input items"}
NOWHERE = "/nonexistent/specchat-model"  # accepted options then fail to load, exit 1


def _generate_types() -> dict[str, str]:
    """The table entry each option of ``specchat generate`` is checked
    against, read from the real parser: {entry: option}."""
    import argparse

    from specchat import cli

    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return {a.type.value: a.option_strings[0] for a in sub.choices["generate"]._actions
            if hasattr(a.type, "value")}


def test_every_value_of_the_table_is_either_shared_or_the_cli_s_own():
    from specchat import values

    typed = _generate_types()
    assert {name: typed[name] for name in SHARED} == {n: o for n, (o, _) in SHARED.items()}
    assert set(typed) | set(values.LIMITS) == set(SHARED) | CLI_ONLY | SIZES


def _bad(name: str) -> list:
    """Values the table refuses for ``name``: past each end of its range
    (its open end itself), not a number / not whole; for text, empty and not UTF-8."""
    from specchat import values

    limit = values.LIMITS.get(name)
    if limit is None:
        return ["", "a\udcffb"]
    step = 1 if limit.kind is int else 0.5
    out = []
    if limit.low is not None:
        out.append(limit.kind(limit.low if limit.low_open else limit.low - step))
    if limit.high is not None:
        out.append(limit.kind(limit.high + step))
    out.append(1.5 if limit.kind is int else float("nan"))
    return out


def _good(name: str) -> list:
    """Values the table takes for ``name``: each closed end of its range,
    a whole number written with a decimal point (what JSON may carry)."""
    from specchat import values

    limit = values.LIMITS.get(name)
    if limit is None:
        return ["é 🙂", " "] if name == "a stop string" else ["é 🙂"]
    if limit.low is None:
        return [-1, 10 ** 30, 2.0]
    ends = [limit.kind(v) for v in (None if limit.low_open else limit.low, limit.high)
            if v is not None]
    return ends + ([float(ends[-1])] if limit.kind is int else [])


def _typed(value) -> bytes:
    """How a value is typed on the command line (argv bytes)."""
    return os.fsencode(value if isinstance(value, str) else repr(value))


def _api(body: dict):
    """The API's parse of a completion request sent as JSON (the server
    parses exactly what ``json.loads`` makes of the body)."""
    from specchat.server import protocol

    wire = json.dumps({"model": "m", "prompt": "hi", **body}).encode()
    return protocol.parse("completion", json.loads(wire))


def _cli(pairs: list[tuple[str, object]]) -> subprocess.CompletedProcess:
    args = [b"generate", b"--target", NOWHERE.encode()]
    if "--prompt" not in [flag for flag, _ in pairs]:
        args += [b"--prompt", b"hi"]
    args += [flag.encode() + b"=" + _typed(value) for flag, value in pairs]
    return specchat(*args)


def test_the_cli_and_the_api_refuse_the_same_values_in_the_same_words():
    from concurrent.futures import ThreadPoolExecutor

    from specchat.server.errors import ApiError

    cases = [(name, value) for name in SHARED for value in _bad(name)]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda c: _cli([(SHARED[c[0]][0], c[1])]), cases))
    for (name, value), proc in zip(cases, runs, strict=True):
        flag, param = SHARED[name]
        with pytest.raises(ApiError) as refused:
            _api({param: value})
        assert refused.value.param == param and refused.value.status == 400
        assert proc.returncode == 2, (name, value, proc.stderr)
        assert error_lines(proc) == [f"specchat generate: error: argument {flag}: "
                                     f"{refused.value.message} (see specchat generate --help)"]


def test_the_cli_and_the_api_take_the_same_values():
    goods = {name: _good(name) for name in SHARED}
    rounds = max(len(v) for v in goods.values())
    for i in range(rounds):
        pick = {name: v[min(i, len(v) - 1)] for name, v in goods.items()}
        _api({SHARED[name][1]: value for name, value in pick.items()})
        proc = _cli([(SHARED[name][0], value) for name, value in pick.items()])
        assert proc.returncode == 1, (pick, proc.stderr)  # past the options, to the model
        lines = error_lines(proc)
        assert len(lines) == 1 and "Model file or folder not found" in lines[0], (pick, lines)


@pytest.mark.parametrize("stops,words", [
    (["x"] * 65, "too many stop strings: 65; at most 64 in one request"),
    (["x" * 4000, "y" * 97], "too many characters of stop strings: 4,097; at most 4,096 in "
                             "one request"),
])
def test_the_cli_and_the_api_bound_stop_strings_in_the_same_words(stops, words):
    """Their count and total length, as a usage error before any model
    loads, in the API's words; at the bounds they pass."""
    from specchat.server.errors import ApiError

    with pytest.raises(ApiError) as refused:
        _api({"stop": stops})
    assert refused.value.param == "stop" and refused.value.message == words
    proc = _cli([("--stop", s) for s in stops])
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc) == [f"specchat generate: error: argument --stop: {words} "
                                 "(see specchat generate --help)"]
    proc = _cli([("--stop", "x" * 64)] * 64)
    assert proc.returncode == 1 and "Model file or folder not found" in error_lines(proc)[0]


# -- names a user gives -------------------------------------------------------------------
# Each is what someone could type (or a script could pass) for a name that
# becomes a folder of the home: control characters, separators, a leading
# dot or dash, spaces, nothing, too long. Once `--name $'a\nb'` was listed as
# "a-b" with exit 0: a typed name is taken exactly or refused in words.
BAD_NAMES = ["a\nb", "a\n", "a\tb", "a\x1bb", "a/b", "../up", "a\\b", " a", "a b", ".hidden",
             "-flag", "", "x" * 130]
# Through the real command: one of each kind (the argparse type is the rule's one check).
TYPED = ["a\nb", "a\n", "a/b", "-flag", ""]


def _names_refused(command: list[str], what: str, flag: str, home) -> None:
    """``command`` with each of TYPED in place of NAME: exit 2, one line."""
    from concurrent.futures import ThreadPoolExecutor

    env = {**ENV, "SPECCHAT_HOME": str(home)}

    def run(name: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "specchat", *(a.replace("NAME", name) for a in command)]
        return subprocess.run(argv, env=env, capture_output=True, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(run, TYPED))
    for name, proc in zip(TYPED, runs, strict=True):
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        lines = error_lines(proc)
        assert len(lines) == 1 and f"{flag}: {what} must be letters, digits" in lines[0], lines
        assert ("got nothing" if not name else f"got '{name}'".replace("\n", "\\n")) in lines[0]


@pytest.mark.parametrize("what", ["a model name", "a cluster name"])
def test_a_name_is_refused_unless_taken_exactly_as_typed(what):
    from specchat import values

    for name in BAD_NAMES:
        with pytest.raises(values.BadValue, match=f"^{what} must be letters, digits"):
            values.name(what, name)
    assert values.name(what, "Qwen2.5-tiny_draft.v1") == "Qwen2.5-tiny_draft.v1"


def test_a_model_name_is_taken_as_typed_or_refused_in_words(tiny_qwen_draft, tmp_path,
                                                            monkeypatch):
    home = tmp_path / "home"
    _names_refused(["models", "import", str(tiny_qwen_draft), "--name=NAME"],
                   "a model name", "argument --name", home)
    assert not (home / "models").exists() and not (home / "index.json").exists()
    # The window's import takes a name too: the same rule, in the same words.
    from specchat.library import importing
    from specchat.library.errors import LibraryError

    monkeypatch.setenv("SPECCHAT_HOME", str(home))
    for name in BAD_NAMES:
        with pytest.raises(LibraryError, match="a model name must be letters"):
            importing.import_path(tiny_qwen_draft, name=name)
    assert not (home / "models").exists() and not (home / "index.json").exists()
    ok = subprocess.run([sys.executable, "-m", "specchat", "models", "import",
                         str(tiny_qwen_draft), "--name", "Qwen2.5-tiny_draft+v1.0", "--json"],
                        env={**ENV, "SPECCHAT_HOME": str(home)}, capture_output=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["name"] == "Qwen2.5-tiny_draft+v1.0"


def test_a_cluster_name_is_taken_as_typed_or_refused_in_words(tiny_target, tmp_path):
    home = tmp_path / "home"
    _names_refused(["cluster", "create", "--hosts", "127.0.0.1,127.0.0.1", "--model",
                    str(tiny_target), "--", "NAME"], "a cluster name", "argument name", home)
    assert not (home / "clusters").exists() or list((home / "clusters").iterdir()) == []


# -- every number a subcommand takes --------------------------------------------------

# Options that take any whole number (argparse's ``int`` is their whole check),
# or whose range the command checks itself, in words: the rank of ``cluster
# rank`` (1 to the most ranks, rank 0 being the app's; distributed/rank.py).
ANY_NUMBER = {("cluster rank", "--rank")}


def _subcommands(parser, prefix: str = ""):
    """(name, parser) of every subcommand, nested ones included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                yield full, sub
                yield from _subcommands(sub, full)


def test_every_number_a_subcommand_takes_is_checked_by_the_table():
    """Issue 47: ``heads train --minutes -1``, ``bench --background-load``,
    ``cluster create --port`` took any number argparse's int or float
    parses (nan, -0, a million processes); each is now an entry of
    specchat.values, refused in its words."""
    from specchat import cli

    plain = {(name, (action.option_strings or [action.dest])[0])
             for name, sub in _subcommands(cli.build_parser()) for action in sub._actions
             if action.type in (int, float)}
    assert plain == ANY_NUMBER


def _heads_types() -> dict[str, str]:
    """{table entry: option} of ``specchat heads train``, from the real parser."""
    from specchat import cli

    sub = dict(_subcommands(cli.build_parser()))["heads train"]
    return {a.type.value: a.option_strings[0] for a in sub._actions if hasattr(a.type, "value")}


def test_heads_train_refuses_what_the_window_refuses_in_the_same_words(tiny_target):
    """Every number of ``heads train`` past its range is a usage error whose
    line is the one TrainPlan (the window's training, any caller's) gives;
    a --texts path that is not there, or empty, is refused too."""
    from concurrent.futures import ThreadPoolExecutor

    from specchat import values
    from specchat.engine.events import TRAIN_VALUES, TrainPlan

    typed = _heads_types()
    assert set(TRAIN_VALUES.values()) <= set(typed)
    fields = {entry: name for name, entry in TRAIN_VALUES.items()}
    cases = [(entry, value) for entry in typed for value in _bad(entry)]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda c: specchat(
            "heads", "train", "--target", str(tiny_target),
            typed[c[0]].encode() + b"=" + _typed(c[1])), cases))
    for (entry, value), proc in zip(cases, runs, strict=True):
        try:
            values.check(entry, value) if entry not in fields else TrainPlan(
                samples=(), out="head", **{fields[entry]: value})
        except values.BadValue as exc:
            said = str(exc)
        else:
            pytest.fail(f"{entry} took {value!r}")
        assert proc.returncode == 2, (entry, value, proc.stderr)
        assert error_lines(proc) == [f"specchat heads train: error: argument {typed[entry]}: "
                                     f"{said} (see specchat heads train --help)"], (entry, value)
    for path, words in (("/nonexistent/texts", "no such file or folder: /nonexistent/texts"),
                        ("", "no path given")):
        proc = specchat("heads", "train", "--target", str(tiny_target), "--texts", path)
        assert proc.returncode == 2
        assert error_lines(proc) == [f"specchat heads train: error: argument --texts: {words} "
                                     "(see specchat heads train --help)"]


def test_cluster_create_refuses_a_remote_command_ssh_cannot_run(tiny_target, tmp_path):
    """``--remote-command ""`` was written into the hostfile (ssh would run
    the rank's own arguments as the command), and one with a line break
    in it (ssh would run the second line as another command); each is
    refused in words, and nothing is written."""
    home = tmp_path / "home"
    for command, got in (("", "nothing"), ("  ", "nothing"),
                         ("specchat\nrm -rf ~", "a line break or a control character in it")):
        proc = subprocess.run([sys.executable, "-m", "specchat", "cluster", "create", "lab",
                               "--hosts", "127.0.0.1,127.0.0.1", "--model", str(tiny_target),
                               "--remote-command", command],
                              env={**ENV, "SPECCHAT_HOME": str(home)}, capture_output=True,
                              timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert error_lines(proc) == ["specchat: error: --remote-command must say how ssh runs "
                                     f"SpecChat on the other hosts, on one line; got {got}."]
        assert not (home / "clusters" / "lab").exists()
