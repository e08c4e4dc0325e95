"""``specchat models ...`` through the real command in a subprocess: JSON
shapes, exit codes, one-line errors, and that nothing is written outside
SPECCHAT_HOME (HOME and the XDG folders point at empty temporary folders)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from libtools import FAKE_TOKEN, edited_copy, tree_files

LIST_KEYS = {"name", "source", "revision", "path", "size_bytes", "params", "quantization",
             "tokenizer_fingerprint", "model_type"}


@pytest.fixture
def run(tmp_path, lib_home):
    """Run ``specchat ARGS`` with a private HOME/XDG and the test's library."""
    fake_home = tmp_path / "fake-home"
    dirs = {"HOME": fake_home, "XDG_CACHE_HOME": fake_home / ".cache",
            "XDG_DATA_HOME": fake_home / ".local" / "share",
            "XDG_CONFIG_HOME": fake_home / ".config", "XDG_STATE_HOME": fake_home / ".state",
            "TMPDIR": tmp_path / "tmp"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE", "XDG_", "SPECCHAT_"))}
    env.update({k: str(v) for k, v in dirs.items()})
    env["SPECCHAT_HOME"] = str(lib_home)

    def specchat(*args, extra_env: dict | None = None, check: bool = True):
        proc = subprocess.run([sys.executable, "-m", "specchat", "models", *args],
                              env={**env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
        return proc

    specchat.fake_home = fake_home
    specchat.dirs = dirs
    return specchat


def test_list_json_and_where_on_an_empty_library(run, lib_home):
    assert json.loads(run("list", "--json").stdout) == []
    assert "No models installed yet" in run("list").stdout
    where = json.loads(run("where", "--json").stdout)
    assert where["home"] == str(lib_home)
    assert set(where) >= {"home", "hub_cache", "models", "index", "disk_usage_bytes"}
    assert where["hub_cache"].startswith(str(lib_home))


def test_pull_list_check_rm_write_nothing_outside_the_library(run, hub, lib_home,
                                                              tiny_target, tiny_qwen_draft):
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": FAKE_TOKEN}
    pulled = json.loads(run("pull", "hf:test-org/tiny-target", "--json", extra_env=env).stdout)
    assert pulled["source"] == "hf:test-org/tiny-target"
    imported = json.loads(run("import", str(tiny_qwen_draft), "--name", "qdraft",
                              "--json").stdout)
    assert imported["name"] == "qdraft"

    listed = json.loads(run("list", "--json").stdout)
    assert [m["name"] for m in listed] == sorted([pulled["name"], "qdraft"])
    for m in listed:
        assert LIST_KEYS <= set(m), set(m) ^ LIST_KEYS
        assert isinstance(m["size_bytes"], int) and m["size_bytes"] > 0
        assert isinstance(m["params"], int) and m["params"] > 0
    human = run("list").stdout
    assert pulled["name"] in human and "hf:test-org/tiny-target" in human

    removed = json.loads(run("rm", "qdraft", "--json").stdout)
    assert removed["removed"] == "qdraft" and removed["freed_bytes"] > 0
    assert [m["name"] for m in json.loads(run("list", "--json").stdout)] == [pulled["name"]]

    leaked = [p for d in run.dirs.values() for p in tree_files(d)]
    assert leaked == [], f"written outside SPECCHAT_HOME: {leaked}"
    for f in tree_files(lib_home):
        if f.is_file() and f.suffix in (".json", ".lock", ""):
            assert FAKE_TOKEN not in f.read_text(errors="replace"), f


def test_check_json_shape_and_exit_codes(run, tmp_path, tiny_qwen_target, tiny_qwen_draft,
                                         mismatched_draft, tiny_target):
    ok = run("check", str(tiny_qwen_target), str(tiny_qwen_draft), "--json")
    data = json.loads(ok.stdout)
    assert set(data) >= {"compatible", "reasons", "target", "draft", "memory"}
    assert data["compatible"] is True and all(isinstance(r, str) for r in data["reasons"])
    assert data["memory"]["total"] > 0 and "fits" in data["memory"]
    assert data["target"]["path"] == str(tiny_qwen_target)

    bad = run("check", str(tiny_target), str(mismatched_draft), "--json", check=False)
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["compatible"] is False
    assert any("vocabulary size differs" in r for r in data["reasons"])

    swa = edited_copy(tiny_qwen_target, tmp_path / "swa", config={
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8})
    human = run("check", str(swa), str(tiny_qwen_draft))  # a sliding window speculates too
    assert human.returncode == 0 and "NOT compatible" not in human.stdout

    tight = run("check", str(tiny_qwen_target), str(tiny_qwen_draft), "--json",
                extra_env={"SPECCHAT_MEMORY_AVAILABLE": "1MB"})
    mem = json.loads(tight.stdout)["memory"]
    assert mem["fits"] is False and mem["available"] == 1_000_000
    assert "0.0 GB available" in mem["summary"]


def test_errors_are_one_line_with_a_nonzero_exit(run, hub):
    proc = run("rm", "nothing-here", check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specchat: error: No installed model")

    proc = run("pull", "hf:test-org/no-such-model", extra_env={"HF_ENDPOINT": hub.url},
               check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "was not found on the Hugging Face Hub" in last and "Traceback" not in proc.stderr

    proc = run("check", "no-such-model", "qwen2.5-0.5b", check=False)
    assert proc.returncode != 0 and "Unknown model 'no-such-model'" in proc.stderr


def test_list_does_not_import_mlx_or_transformers(lib_home):
    code = ("import sys; from specchat.cli import main; main(['models', 'list', '--json']); "
            "bad = [m for m in ('mlx', 'mlx.core', 'mlx_lm', 'transformers', 'huggingface_hub')"
            " if m in sys.modules]; print('IMPORTED', bad, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "SPECCHAT_HOME": str(lib_home)}, timeout=60)
    assert "IMPORTED []" in proc.stderr, proc.stderr


def test_catalog_and_suggest(run):
    pairs = json.loads(run("catalog", "--json").stdout)
    assert any(p["id"] == "qwen2.5-7b+qwen2.5-0.5b" for p in pairs)
    assert all(p["memory"]["total"] > 0 and p["why"] for p in pairs)
    sugg = json.loads(run("suggest", "qwen3-8b", "--json").stdout)
    assert sugg[0]["ref"] == "qwen3-0.6b" and sugg[0]["recommended"] is True


def test_catalog_prints_own_heads_eagle3_heads_and_assistants(run):
    """An own MTP head has no second model: the text says so, the JSON draft
    is null, and the download is the target's alone."""
    text = run("catalog", extra_env={"SPECCHAT_DTYPE": "q4"}).stdout
    lines = text.splitlines()
    own = lines.index("qwen3.6-27b+mtp  [55.6 GB to download; needs about 17.7 GB in q4]")
    assert lines[own + 1] == "  Qwen3.6 27B (bf16) + its own MTP head"
    assert lines[own + 2].startswith("  The target drafts with its own multi-token-prediction")
    head = lines.index("qwen3-4b+qwen3-4b-eagle3  [2.7 GB to download; needs about 3.4 GB in q4]")
    assert lines[head + 1] == "  Qwen3 4B (4-bit) + Qwen3 4B EAGLE-3 head (AngelSlim, bf16)"
    assert "  Gemma 4 31B (bf16) + Gemma 4 31B assistant drafter (bf16)" in lines
    pairs = {p["id"]: p for p in json.loads(run("catalog", "--json").stdout)}
    own_json = pairs["qwen3.6-27b+mtp"]
    assert (own_json["kind"], own_json["draft"]) == ("mtp", None)
    assert own_json["target"]["installed"] is False and own_json["target"]["mtp"] is True
    assert own_json["download_bytes"] == own_json["target"]["download_bytes"] == 55_560_000_000
    eagle = pairs["qwen3-4b+qwen3-4b-eagle3"]
    assert (eagle["kind"], eagle["draft"]["for"], eagle["draft"]["installed"]) == (
        "eagle3", "qwen3-4b", False)


def test_check_refuses_the_target_as_its_own_draft_and_bad_arguments(run, tiny_target):
    """The draft-is-the-target words are the engine's (engine.compat), so
    ``generate`` and ``check`` say the same; an empty model or a bad
    context is a usage error (exit 2, one line naming what is allowed)."""
    from specchat.engine.compat import SAME_MODEL

    same = run("check", str(tiny_target), f"{tiny_target}/", "--json", check=False)
    assert same.returncode == 1
    assert SAME_MODEL in json.loads(same.stdout)["reasons"]
    for args, words in (([str(tiny_target), ""], "argument draft: No model given: pass"),
                        (["", str(tiny_target)], "argument target: No model given: pass"),
                        ([str(tiny_target), str(tiny_target), "--context", "-1"],
                         "argument --context: context must be a whole number from 16 to"),
                        ([str(tiny_target), str(tiny_target), "--context", "lots"],
                         "context must be a whole number")):
        proc = run("check", *args, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
