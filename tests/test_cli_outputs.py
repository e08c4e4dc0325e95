"""Nothing the user owns is overwritten (issue 47): every command that takes
a place to write (``heads train --out``, ``bench --json``, ``cluster create
NAME``, ``models import --name``) writes only into a folder it makes, an
empty one, or what it wrote there itself; anything else (an installed model
or draft, a downloaded head, a model folder of the person's, a link to one,
a file, a named pipe, the system's /proc) is refused in words before a byte
is written, and stays as it was. Real ``specchat`` processes on real files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "app" / "specchat" / "engine"  # text to learn from


def specchat(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECCHAT_HOME": str(home), "LC_ALL": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "specchat", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)


def state(path: Path) -> object:
    """What is at ``path``, links not followed: a file's bytes (hashed), a
    folder's entries each so, a link's target, a pipe as a pipe."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return {p.name: state(p) for p in sorted(path.iterdir())}
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return "fifo" if path.is_fifo() else "other" if path.exists() else None


@pytest.fixture
def owned(lib_home, tmp_path, tiny_target, tiny_draft, hub_heads) -> dict[str, Path]:
    """Things of the person's, by what they are: models in the library and
    outside it, a downloaded head, a link, a file, a named pipe, /proc."""
    from specchat.library import importing, refs

    mine = tmp_path / "mine"
    mine.mkdir()
    model = shutil.copytree(tiny_draft, mine / "my-model")
    (mine / "model-link").symlink_to(model)
    (mine / "notes.txt").write_text("keep me\n")
    os.mkfifo(mine / "pipe")
    installed = Path(importing.import_path(tiny_target, name="t").path)
    draft = Path(importing.import_path(tiny_draft, name="d").path)
    head = Path(refs.pull("hf:test-org/tiny-eagle3").path)
    return {"installed model": installed, "installed draft": draft, "downloaded head": head,
            "model folder": model, "link to a model": mine / "model-link",
            "file": mine / "notes.txt", "named pipe": mine / "pipe",
            "system folder": Path("/proc/self/specchat-out")}


def _refused_each(home: Path, owned: dict[str, Path], what: str, argv) -> None:
    """``argv(path)`` for each owned thing, in parallel: exit 1, one line
    saying ``what`` will not be written there, and the thing as it was."""
    before = {name: state(path) for name, path in owned.items()}
    index = (home / "index.json").read_text()
    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(owned, pool.map(lambda p: specchat(home, *argv(p)), owned.values()),
                        strict=True))
    for name, proc in runs.items():
        lines = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 1, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and len(lines) == 1, (name, proc.stderr)
        assert f"Will not write {what} at " in lines[0] and "nothing was written" in lines[0], (
            name, lines)
        assert state(owned[name]) == before[name], name
    assert (home / "index.json").read_text() == index  # no entry rewritten


def test_heads_train_writes_into_nothing_the_user_owns(lib_home, owned, tiny_target):
    """Issue 47: ``--out $SPECCHAT_HOME/models/t`` turned the model t into a
    head (its index entry rewritten), and any other folder, link or file
    given was trained into with exit 0, or failed on an internal error."""
    _refused_each(lib_home, owned, "the head", lambda out: (
        "heads", "train", "--target", str(tiny_target), "--out", str(out), "--texts", str(ENGINE),
        "--no-history", "--minutes", "0.2", "--steps", "1", "--draft-vocab", "64",
        "--held-out", "1"))


def test_bench_writes_its_report_over_nothing_the_user_owns(lib_home, owned, tiny_target,
                                                              tiny_draft, tmp_path):
    """``bench --json`` replaced any file (a named pipe hung it), after the
    whole bench had run; now refused before anything loads."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "kind": "code", "messages": [
        {"role": "user", "content": "hi"}]}) + "\n")
    owned = {**owned, "the prompts themselves": prompts}
    _refused_each(lib_home, owned, "the report", lambda out: (
        "bench", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompts",
        str(prompts), "--max-tokens", "4", "--modes", "plain", "--json", str(out)))


def test_a_report_the_bench_wrote_is_the_one_file_it_writes_over(tmp_path):
    from specchat import outputs
    from specchat.tools.bench_output import REPORT_KEYS, is_report

    report = tmp_path / "report.json"
    report.write_text(json.dumps(dict.fromkeys(REPORT_KEYS, {})))
    assert outputs.file(report, "the report", is_report) == report
    outputs.write_json(report, {"machine": 1, "models": 2, "settings": 3, "modes": 4},
                       "the report", is_report)
    assert json.loads(report.read_text())["modes"] == 4
    other = tmp_path / "other.json"
    other.write_text('{"machine": 1}')
    with pytest.raises(outputs.Refused, match="a file of that name is already there"):
        outputs.write_json(other, {}, "the report", is_report)
    assert other.read_text() == '{"machine": 1}'


def test_cluster_create_writes_into_no_folder_of_the_user_s(lib_home, owned, tiny_target):
    """A cluster's folder is ``clusters/NAME``; one of that name that is not
    a cluster (a link to a model folder: create used to delete the links in
    it and write its own) is refused, and a cluster is defined again in
    place."""
    clusters = lib_home / "clusters"
    clusters.mkdir()
    (clusters / "linked").symlink_to(owned["model folder"])
    (clusters / "folder").mkdir()
    (clusters / "folder" / "notes.txt").write_text("mine\n")
    places = {"link to a model": clusters / "linked", "a folder of the person's":
              clusters / "folder"}
    model = state(owned["model folder"])
    _refused_each(lib_home, places, "the cluster", lambda place: (
        "cluster", "create", place.name, "--hosts", "127.0.0.1,127.0.0.1", "--model",
        str(tiny_target)))
    assert state(owned["model folder"]) == model  # what the link points at, too
    for _ in range(2):  # a cluster of its own is written again
        proc = specchat(lib_home, "cluster", "create", "lab", "--hosts", "127.0.0.1,127.0.0.1",
                        "--model", str(tiny_target))
        assert proc.returncode == 0, proc.stderr


def test_an_import_replaces_no_folder_in_the_library(lib_home, tiny_draft):
    """A folder in ``<home>/models`` that the index does not list (here a
    head being trained, whose listing comes when it finishes) was deleted
    by an import of the same name. Asked for by name, it is refused; by
    default the import takes the next free name."""
    training = lib_home / "models" / "my-draft"
    training.mkdir(parents=True)
    (training / "specchat-training.json").write_text("{}")
    (training / "model.safetensors").write_bytes(b"weights")
    before = state(training)
    proc = specchat(lib_home, "models", "import", str(tiny_draft), "--name", "my-draft")
    assert proc.returncode == 1 and "is already there and is not a listed model" in proc.stderr
    assert state(training) == before
    source = lib_home.parent / "my-draft"
    shutil.copytree(tiny_draft, source)
    proc = specchat(lib_home, "models", "import", str(source), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "my-draft-2" and state(training) == before


def test_no_command_writes_into_spec_chat_s_own_folder_but_where_it_keeps_such_things(
        lib_home, tiny_target, tiny_draft, tmp_path):
    """A head trained into ``<home>/hub`` (not there yet) was taken as the
    Hub cache's folder, and ``models rm`` of the head then removed every
    download; one trained through a link into ``<home>/models/t/sub`` went
    with the model t; ``bench --json <home>/recommendations.json`` put a
    report where the measurements are kept. Every output path a command
    takes is refused anywhere in the home but where that command keeps such
    things (a head directly in ``models``), before anything is made."""
    from specchat.library import importing

    installed = Path(importing.import_path(tiny_target, name="t").path)
    (tmp_path / "to-t").symlink_to(installed)
    (lib_home / "clusters").mkdir()
    heads = {"the Hub cache, not made yet": lib_home / "hub",
             "a folder in a cluster's place": lib_home / "clusters" / "x",
             "a work folder": lib_home / "tmp" / "mine",
             "in a model's folder, through a link": tmp_path / "to-t" / "sub",
             "the home itself": lib_home}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "kind": "code", "messages": [
        {"role": "user", "content": "hi"}]}) + "\n")
    reports = {"the measurements' file": lib_home / "recommendations.json",
               "the history, not made yet": lib_home / "conversations.sqlite3"}
    before = state(lib_home)
    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(heads, pool.map(lambda out: specchat(
            lib_home, "heads", "train", "--target", "t", "--out", str(out), "--texts",
            str(ENGINE), "--no-history", "--minutes", "0.2", "--steps", "1", "--draft-vocab",
            "64", "--held-out", "1"), heads.values()), strict=True))
        runs.update(zip(reports, pool.map(lambda out: specchat(
            lib_home, "bench", "--target", "t", "--draft", str(tiny_draft), "--prompts",
            str(prompts), "--max-tokens", "2", "--modes", "plain", "--json", str(out)),
            reports.values()), strict=True))
    for name, proc in runs.items():
        assert proc.returncode == 1, (name, proc.stderr)
        assert "Traceback" not in proc.stderr, (name, proc.stderr)
        assert f"is in SpecChat's own folder {lib_home}" in proc.stderr, (name, proc.stderr)
        assert "nothing was written" in proc.stderr, (name, proc.stderr)
    assert state(lib_home) == before
    # Where a head is kept, a new folder is taken (the window's default, too).
    proc = specchat(lib_home, "heads", "train", "--target", "t", "--out",
                    str(lib_home / "models" / "t-head"), "--texts", str(ENGINE), "--no-history",
                    "--minutes", "0.2", "--steps", "1", "--draft-vocab", "64", "--held-out", "1")
    assert proc.returncode == 0, proc.stderr


def test_another_name_for_the_home_is_the_home(lib_home, tiny_target, tmp_path):
    """The home by another path (here a bind mount of it; on macOS the same
    path in other letter case, which its file system takes as the same
    folder) was not the home to a comparison of paths: a head went into
    its Hub cache's place. The folders are compared as themselves."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root")
    lib_home.mkdir()
    alias = tmp_path / "alias"
    alias.mkdir()
    done = subprocess.run(["mount", "--bind", str(lib_home), str(alias)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        proc = specchat(lib_home, "heads", "train", "--target", str(tiny_target), "--out",
                        str(alias / "hub"), "--texts", str(ENGINE), "--no-history",
                        "--minutes", "0.2", "--steps", "1", "--draft-vocab", "64",
                        "--held-out", "1")
        assert proc.returncode == 1, proc.stderr
        assert f"it is in SpecChat's own folder {lib_home}" in proc.stderr, proc.stderr
        assert not (lib_home / "hub").exists()
    finally:
        subprocess.run(["umount", "-l", str(alias)], capture_output=True)
