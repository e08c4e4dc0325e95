"""`specchat bench` runs every mode on the same weights and reports them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from specchat.engine.errors import EngineError
from specchat.tools.prompts import load_prompts
from specchat.tools.variants import VARIANTS
from tinymodels import build_eagle3

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"tokens_per_s", "acceptance_rate", "tokens_per_step", "speedup_vs_plain",
          "identical_to_plain"}
# The bench logs a line as it loads and after every run. Its longest silence
# is the load plus one short warm-up run per mode, seconds with the tiny
# models: a bench silent this long is stuck, not slow. There is no limit on
# the whole run, which grows with the modes and the machine.
STALL_S = 600


def _bench(*args: str) -> subprocess.CompletedProcess:
    """``specchat bench ARGS`` to its end, however long that takes, as long
    as it keeps saying something; killed (and the test failed, with what it
    said) only once it has been silent for STALL_S."""
    with _log("stdout") as out, _log("stderr") as err:
        proc = subprocess.Popen([sys.executable, "-m", "specchat", "bench", *args],
                                stdout=out, stderr=err, text=True)
        said, heard = 0, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.5)
            size = Path(err.name).stat().st_size + Path(out.name).stat().st_size
            if size != said:
                said, heard = size, time.monotonic()
            elif time.monotonic() - heard > STALL_S:
                proc.kill()
                proc.wait()
                pytest.fail(f"the bench said nothing for {STALL_S} s:\n"
                            + Path(err.name).read_text()[-3000:])
        return subprocess.CompletedProcess(proc.args, proc.returncode,
                                           Path(out.name).read_text(), Path(err.name).read_text())


def _log(kind: str):
    return tempfile.NamedTemporaryFile("w+", prefix=f"bench-{kind}-", suffix=".log")


def test_shipped_prompts_cover_the_kinds():
    prompts = load_prompts(ROOT / "benchmarks" / "prompts.jsonl")
    assert len(prompts) >= 12
    kinds = {p.kind for p in prompts}
    assert kinds == {"code", "explain", "grounded", "multiturn"}
    assert len({p.id for p in prompts}) == len(prompts)
    multi = [p for p in prompts if p.kind == "multiturn"]
    assert len(multi) >= 8
    for p in multi:  # earlier turns, then the follow-up
        assert [m.role for m in p.messages] == ["user", "assistant", "user"], p.id
        assert len(p.messages[1].content) > 300, p.id


def test_shipped_repetitive_prompts():
    prompts = load_prompts(ROOT / "benchmarks" / "prompts-repetitive.jsonl")
    assert len(prompts) >= 3 and {p.kind for p in prompts} == {"repetitive"}


def test_shipped_history_prompts():
    """The asks that come back follow, in file order, every first ask, and
    some repeat one word for word: the session history can only help them."""
    prompts = load_prompts(ROOT / "benchmarks" / "prompts-history.jsonl")
    kinds = [p.kind for p in prompts]
    assert set(kinds) == {"first", "again"} and kinds.count("again") >= 5
    assert kinds.index("again") > max(i for i, k in enumerate(kinds) if k == "first")
    first = {p.messages[0].content for p in prompts if p.kind == "first"}
    again = [p.messages[0].content for p in prompts if p.kind == "again"]
    assert sum(text in first for text in again) >= 2  # asked word for word again
    assert all(len(p.messages) == 1 for p in prompts)  # each in a new chat


def test_shipped_agent_prompts_are_read_as_the_api_reads_them():
    """benchmarks/prompts-agent.jsonl: the requests a real agent (the
    OpenAI Agents SDK, benchmarks/record_agent.py) sent `specchat serve`,
    read by the API's own parser: tools, calls and tool results kept."""
    import json as _json

    from specchat.server import protocol

    path = ROOT / "benchmarks" / "prompts-agent.jsonl"
    prompts = load_prompts(path)
    lines = [_json.loads(line) for line in path.read_text().splitlines()]
    assert len(prompts) >= 15 and {p.kind for p in prompts} == {"agent"}
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.tools for p in prompts)
    assert sum(any(m.role == "tool" for m in p.messages) for p in prompts) >= 8
    assert any(m.tool_calls for p in prompts for m in p.messages)
    for p, line in zip(prompts, lines, strict=True):
        sent = protocol.parse("chat", {"model": "m", "messages": line["messages"],
                                       "tools": line["tools"]})
        assert (p.messages, p.tools) == (sent.messages, sent.tools)
        assert p.request().tools == sent.tools


def test_bad_prompt_file(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "x", "kind": "poetry", "messages": []}\n')
    with pytest.raises(EngineError, match="p.jsonl:1"):
        load_prompts(bad)


def test_bench_json_report(tmp_path, tiny_target, tiny_draft):
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "c1", "kind": "code", "messages": [{"role": "user", "content": "Write a stack."}]},
        {"id": "g1", "kind": "grounded", "messages": [
            {"role": "user", "content": "Rewrite: def f(x): return x + x + x + x"}]},
    ]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "report.json"
    p = _bench("--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts", str(prompts),
               "--max-tokens", "12", "--json", str(out))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert set(rep) >= {"machine", "models", "modes", "by_kind"}
    # Every mode the pair can run (the head modes need a head: --head).
    assert set(rep["modes"]) == {n for n in VARIANTS if not n.startswith("head")}
    for mode, stats in rep["modes"].items():
        assert FIELDS <= set(stats), mode
        assert stats["tokens_per_s"] > 0
        if mode != "plain":
            # Greedy: every mode, ours and mlx-lm's, reproduces plain decoding.
            assert stats["identical_to_plain"] is True, (mode, stats["divergences"])
    assert rep["modes"]["plain"]["speedup_vs_plain"] == pytest.approx(1.0)
    assert set(rep["by_kind"]) == {"code", "grounded"}
    assert rep["machine"]["device"] == "cpu" and rep["machine"]["blas"] == "blis"
    assert rep["memory"]["peak_bytes"] > 0
    assert 0 <= rep["modes"]["spec"]["overhead_fraction"] < 1
    assert rep["modes"]["spec-k2"]["theoretical_speedup"] > 0
    # The human table prints the same modes.
    for mode in rep["modes"]:
        assert mode in p.stdout
    # Each run's progress line says what break-even auto-off did where it
    # applied (on, K adaptive), and nothing where it did not.
    lines = {tuple(line.split()[:2]): line for line in p.stderr.splitlines()
             if line.startswith("  c1 ")}
    assert re.search(r"auto-off: paused \d+ steps \(\d+ pauses, \d+ probes\)$",
                     lines["c1", "spec"])
    assert "paused" not in lines["c1", "plain"] and "paused" not in lines["c1", "spec-k2"]


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_bench_under_a_background_load(tmp_path, tiny_target, tiny_draft):
    """--background-load N runs the bench beside N spinning processes and says
    so in the report, with the BLAS thread counts each mode's steps ran at."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "c1", "kind": "code",
                                   "messages": [{"role": "user", "content": "Write a stack."}]}) + "\n")
    out = tmp_path / "report.json"
    p = _bench("--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts", str(prompts),
               "--max-tokens", "24", "--modes", "plain", "spec", "mlx-lm-spec-k2",
               "--background-load", "2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["settings"]["background_load"] == 2
    assert len(rep["machine"]["load_average"]) == 2
    for mode in ("plain", "spec", "mlx-lm-spec-k2"):
        assert sum(rep["modes"][mode]["blas_threads"].values()) > 0, mode
    assert "background load: 2 spinning processes" in p.stdout
    bad = _bench("--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts",
                 str(prompts), "--background-load", "-1")
    assert bad.returncode == 2 and "background load must be a whole number from 0 to 256" in bad.stderr


def test_bench_with_a_session_history(tmp_path, tiny_target, tiny_draft):
    """--history session: each prompt's conversation joins the history for
    the next ones, every suffix-drafting mode also runs cold, and the report
    says where the tokens came from. The second prompt asks the first one's
    question again, so only the warm runs draft from the history."""
    ask = {"role": "user", "content": "Write a stack class with push and pop."}
    lines = [
        {"id": "m1", "kind": "multiturn", "messages": [ask]},
        {"id": "m2", "kind": "multiturn", "messages": [
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}, ask]},
    ]
    other = {"id": "c1", "kind": "code", "messages": [ask]}  # left out by --kinds
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in [other, *lines]))
    out = tmp_path / "report.json"
    p = _bench("--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts", str(prompts),
               "--kinds", "multiturn",
               "--max-tokens", "24", "--modes", "plain", "spec", "suffix",
               "--history", "session", "--json", str(out))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["settings"]["history"] == "session" and rep["settings"]["prompts"] == 2
    assert set(rep["modes"]) == {"plain", "spec", "suffix", "spec-cold", "suffix-cold"}
    for mode, stats in rep["modes"].items():
        if mode != "plain":
            assert stats["identical_to_plain"] is True, (mode, stats["divergences"])
    for warm in ("spec", "suffix"):
        assert rep["modes"][warm]["tokens_by_origin"].get("history", 0) > 0, warm
        assert "history" not in rep["modes"][f"{warm}-cold"]["tokens_by_origin"]
        assert any(k.startswith("history") for k in rep["modes"][warm]["suffix_by_match"])
    assert "where the tokens came from" in p.stdout
    spec = rep["modes"]["spec"]
    assert spec["drafted_by"]["suffix"]["by_key"] and spec["drafted_by"]["draft"]["drafted"] > 0
    choices = spec["hybrid_choices"]  # steps with a suffix match: whom the hybrid asked
    assert set(choices) == {"suffix", "model", "chained"} and choices["suffix"] > 0
    bad = _bench("--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts",
                 str(prompts), "--ids", "m1", "nope")
    assert bad.returncode == 1 and "has no prompt nope" in bad.stderr
    assert "suffix drafts: accepted/drafted by source and match length" in p.stdout


@pytest.mark.slow  # a long run: CI's slow step keeps the default run under 15 minutes
def test_bench_with_a_draft_head(tmp_path, tiny_dir, tiny_target, tiny_draft):
    """An EAGLE-3 head beside the draft model (--head): the head modes, the
    draft model's and mlx-lm's run in one process and all reproduce plain
    decoding. A head as the draft: the draft modes run on it, its cost is
    one head forward (a fraction of the target's), and modes only a draft
    model can run are refused in words."""
    head = build_eagle3(tiny_dir / "eagle3-bench", tiny_target, layout="eagle3")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "c1", "kind": "code", "messages": [
        {"role": "user", "content": "Write a stack."}]}) + "\n")
    out = tmp_path / "report.json"
    base = ["--target", str(tiny_target), "--prompts", str(prompts), "--max-tokens", "12"]
    both = ["plain", "spec", "head", "head+suffix", "mlx-lm-spec-k2"]
    p = _bench(*base, "--draft", str(tiny_draft), "--head", str(head), "--modes", *both,
               "--json", str(out))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["models"]["head"]["model_type"] == "eagle3"
    assert rep["models"]["draft"]["model_type"] != "eagle3"
    assert list(rep["modes"]) == both
    for mode in both[1:]:
        assert rep["modes"][mode]["identical_to_plain"] is True, mode
        assert rep["modes"][mode]["acceptance_rate"] is not None, mode

    p = _bench(*base, "--draft", str(head), "--json", str(out))  # the head as the draft
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["models"]["draft"]["model_type"] == "eagle3"
    assert not any(m.startswith("mlx-lm-spec") or m == "ssd" for m in rep["modes"])
    assert {"spec", "spec-k2", "head", "head+suffix"} <= set(rep["modes"])
    assert 0 < rep["costs"]["draft_over_target"] < 1
    p = _bench(*base, "--draft", str(head), "--modes", "plain", "mlx-lm-spec-k2", "ssd")
    assert p.returncode != 0
    assert "mlx-lm-spec-k2 needs a draft model, and the draft is a head" in p.stderr
    assert "ssd needs a draft model" in p.stderr


def test_the_report_names_every_origin_a_mode_drew_tokens_from():
    """A head's tokens are shown as the head's, between the suffix drafts'
    and the target's own, beside the origins every report shows."""
    from specchat.tools.bench_report import sources

    mode = {"tokens_by_origin": {"target": 6, "head": 3, "conversation": 1}}
    lines = sources({"modes": {"head+suffix": mode}, "by_kind": {}})
    assert lines[1] == "where the tokens came from (share of all tokens)"
    assert lines[2].split(None, 2)[2] == ("draft 0% conversation 10% history 0% head 30% "
                                          "target 60%")


def test_a_prompts_file_is_read_as_every_file_is(tmp_path):
    """A line nested 100,000 levels deep ended ``specchat bench`` on
    "RecursionError: maximum recursion depth exceeded", and the file was
    read whole whatever its size; each is said in words now, naming the
    file (and the line)."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "a", "kind": "code", "messages": [{"role": "user", "content": "hi"}]}'
                    "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(EngineError) as e:
        load_prompts(deep)
    assert str(e.value) == (f"{deep}:2: not a prompt line (it nests arrays and objects deeper "
                            "than 64 levels)")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)
    with pytest.raises(EngineError) as e:
        load_prompts(big)
    assert str(e.value) == (f"{big} cannot be read: it is 65.0 MB, larger than the 64.0 MB such "
                            "a file can be")
