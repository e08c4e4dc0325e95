"""Records the library reads back from disk (issue 29): the model index,
the remembered draft measurements and the records of checked files.

Each may be edited by hand, damaged or written by another version. One bad
record is left out and said in one log line; every other record still
lists; no command ends on a TypeError, a RecursionError or a FIFO that
blocks it forever. The files are real files under a private SPECCHAT_HOME
and ``specchat models list`` and ``rm`` run as the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from libtools import specchat_env
from specchat import records
from specchat.library import bundled, hub_files, importing, index, paths
from specchat.library import recommendations as rec


def _models(*args: str, home: Path, tmp_path: Path, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "specchat", "models", *args],
                          env=specchat_env(tmp_path, home), capture_output=True, text=True,
                          timeout=timeout)


def _index() -> dict:
    return json.loads(paths.index_file().read_text())


def _write_index(data: dict) -> None:
    paths.index_file().write_text(json.dumps(data))


@pytest.fixture
def two_models(lib_home, tiny_target, tiny_draft) -> dict:
    importing.import_path(tiny_target, name="good")
    importing.import_path(tiny_draft, name="edited")
    return _index()


def _warnings(stderr: str) -> list[str]:
    return [line.split("WARNING specchat.library: ", 1)[1] for line in stderr.splitlines()
            if "WARNING specchat.library: " in line]


def test_a_hand_edited_index_entry_is_skipped_and_named_the_rest_list(lib_home, tmp_path,
                                                                      two_models):
    data = two_models
    data["models"]["edited"]["params"] = "lots"
    data["models"]["no-path"] = {**data["models"]["good"], "name": "no-path", "path": ["x"]}
    data["models"]["not-a-record"] = 7
    data["models"]["no-size"] = {**data["models"]["good"], "name": "no-size",
                                 "size_bytes": "12"}
    _write_index(data)
    path = paths.index_file()

    proc = _models("list", "--json", home=lib_home, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [m["name"] for m in json.loads(proc.stdout)] == ["good"]
    assert sorted(_warnings(proc.stderr)) == sorted([
        f"The model index {path}: the entry 'edited' was skipped: params is 'lots' (str), "
        "not int | None. Fix or remove it (`specchat models rm edited`).",
        f"The model index {path}: the entry 'no-path' was skipped: path is a list of 1, "
        "not str. Fix or remove it (`specchat models rm no-path`).",
        f"The model index {path}: the entry 'no-size' was skipped: size_bytes is '12' (str), "
        "not int. Fix or remove it (`specchat models rm no-size`).",
        f"The model index {path}: the entry 'not-a-record' was skipped: it is 7 (int), "
        "not a record of named fields. Fix or remove it (`specchat models rm not-a-record`).",
    ])
    human = _models("list", home=lib_home, tmp_path=tmp_path)
    assert human.returncode == 0 and human.stdout.startswith("NAME") and "good" in human.stdout

    # rm takes a damaged entry off the list and leaves the files where they are.
    edited_path = Path(data["models"]["edited"]["path"])
    gone = _models("rm", "edited", home=lib_home, tmp_path=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.strip() == ("Removed the damaged entry edited from the list; "
                                   "its files, if any, were left where they are.")
    assert "edited" not in _index()["models"] and edited_path.is_dir()
    assert set(_index()["models"]) == {"good", "no-path", "no-size", "not-a-record"}


def test_in_process_the_index_skips_bad_entries_and_logs_each_once(lib_home, two_models,
                                                                   caplog):
    data = two_models
    data["models"]["edited"]["attention"] = None  # older files: defaults to "full"
    data["models"]["edited"]["max_context"] = 1.5
    _write_index(data)
    with caplog.at_level("WARNING", logger="specchat.library"):
        assert [m.name for m in index.list_installed()] == ["good"]
        assert [m.name for m in index.list_installed()] == ["good"]
        assert index.get("edited") is None and index.find_source("x") is None
    said = [r.getMessage() for r in caplog.records if r.name == "specchat.library"]
    assert len(said) == 1 and said[0].endswith(
        "the entry 'edited' was skipped: max_context is 1.5 (float), not int | None. Fix or "
        "remove it (`specchat models rm edited`).")
    # Adding a model keeps the damaged entry on disk, for whoever fixes it.
    index.add(index.get("good"))
    assert _index()["models"]["edited"]["max_context"] == 1.5


@pytest.mark.parametrize("case", ["not-json", "too-deep", "list", "models-list", "fifo",
                                  "too-big", "long-number"])
def test_a_damaged_index_file_is_one_line_never_a_crash_or_a_hang(lib_home, tmp_path, case):
    path = paths.index_file()
    path.parent.mkdir(parents=True)
    if case == "fifo":
        os.mkfifo(path)
    elif case == "too-big":
        with open(path, "wb") as f:
            f.truncate(17 * 2**20)  # the index may have 16 MB
    else:
        path.write_text({"not-json": "{not json", "too-deep": "[" * 100_000,
                         "list": "[1, 2]", "models-list": '{"models": [1, 2]}',
                         "long-number": '{"models": {"x": {"size_bytes": ' + "9" * 5000 + "}}}",
                         }[case])
    start = time.monotonic()
    proc = _models("list", "--json", home=lib_home, tmp_path=tmp_path, timeout=60)
    assert time.monotonic() - start < 30
    out = proc.stderr.strip().splitlines()
    if case in ("list", "models-list"):  # nothing in it is a model: listed as empty, and said
        assert proc.returncode == 0 and json.loads(proc.stdout) == []
        assert _warnings(proc.stderr) == [
            f"The model index {path} holds no models table; it was read as empty."]
        return
    assert proc.returncode == 1 and len(out) == 1, proc.stderr
    why = {"not-json": "it is not valid JSON (Expecting property name enclosed in double "
                       "quotes: line 1 column 2 (char 1))",
           "too-deep": "it is nested too deeply to read",
           "fifo": "it is a FIFO (named pipe), not a regular file",
           "too-big": "it is 17.0 MB, larger than the 16.0 MB such a file can be",
           # Python's words, with its advice to programmers, were passed on.
           "long-number": "it holds a whole number of more than 4,300 digits"}[case]
    assert out[0] == (f"specchat: error: The model index {path} cannot be read: {why}. Move it "
                      "away and re-import or re-download your models; their files are still "
                      "in the same folder.")


# -- remembered measurements and checked files ------------------------------------------


def _result(**changes) -> dict:
    good = rec.make_result("t", "d", "d", rec.machine(), "cpu/float32", drafted=10, accepted=7,
                           judged=9, draft_cost=0.2, verify_slope=0.01, tokens=40,
                           tokens_per_s=12.0, plain_tokens_per_s=8.0, prompts=3)
    return {**good.to_json(), **changes}


def test_a_bad_remembered_measurement_is_skipped_and_the_rest_rank(lib_home, caplog):
    good = _result()
    others = [_result(draft="d2", acceptance="high"), _result(draft="d3", predicted_speedup=[2]),
              _result(draft="d4", best_k=True), "garbage"]
    records.write_json(rec.results_file(), {"version": rec.VERSION, "results": [good, *others]})
    with caplog.at_level("WARNING", logger="specchat.library"):
        kept = rec.remembered("t")
        assert list(kept) == ["d"] and rec.rank(kept.values())[0].summary().startswith("1.50×")
    said = sorted(r.getMessage() for r in caplog.records if r.name == "specchat.library")
    where = rec.results_file()
    assert said == sorted([
        f"{where}: a remembered measurement was skipped: acceptance is 'high' (str), "
        "not float | None.",
        f"{where}: a remembered measurement was skipped: best_k is True (bool), not int | None.",
        f"{where}: a remembered measurement was skipped: it is 'garbage' (str), not a record "
        "of named fields.",
        f"{where}: a remembered measurement was skipped: predicted_speedup is a list of 1, "
        "not float | None.",
    ])


@pytest.mark.parametrize("kind", ["fifo", "deep", "big"])
def test_records_of_checked_files_never_block_or_crash(lib_home, tmp_path, kind):
    """hub-verified.json, the bundled verified.json and recommendations.json
    are caches: a FIFO, a file too deep or too big in their place is read as
    no record (checked again), in a child so that a hang fails the test."""
    files = [hub_files.record_file(), bundled.cache_file(), rec.results_file()]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "deep":
            path.write_text("{\"a\": " * 100_000)
        else:
            with open(path, "wb") as f:
                f.truncate(17 * 2**20)  # records may have 16 MB
    code = ("from pathlib import Path; from specchat import records; from specchat.library import "
            "hub_files, recommendations as rec\n"
            f"print([records.read_record(Path(p)) for p in {[str(p) for p in files]!r}], "
            "hub_files.checked_before(Path('/nonexistent')), rec.remembered('t'))")
    proc = subprocess.run([sys.executable, "-c", code], env=specchat_env(tmp_path, lib_home),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[{},", "{},", "{}]", "False", "{}"]
