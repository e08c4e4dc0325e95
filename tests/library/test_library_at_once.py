"""Two processes claiming one model name at once (issue 47): two imports, a
pull beside an import, two trained heads being listed. Each is real
``specchat`` processes (or the library's own call in a real process for the
heads, which the window lists) on one library; lined up behind the index's
lock (tests/atonce.py) so they meet every time, and started plainly at once
a few times more. Whatever the order, every model listed is the one whose
files its folder holds, a typed name is never given to two models, and
nobody is told "Imported" for a model that is not listed."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from atonce import run_at_once
from libtools import FAKE_TOKEN, specchat_env
from tinymodels import build_eagle3


def _models(home: Path) -> dict[str, dict]:
    return json.loads((home / "index.json").read_text())["models"]


def _digest(folder: Path) -> str:
    """The model files of a folder (links followed), as one hash."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        h.update((Path(folder) / name).read_bytes())
    return h.hexdigest()


def _lock(home: Path) -> Path:
    return home / ".index.lock"


def _import(src: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "specchat", "models", "import", str(src), *more]


def _each_listed_holds_its_own_files(home: Path) -> None:
    for name, entry in _models(home).items():
        kind, _, where = entry["source"].partition(":")
        if kind == "import":
            assert _digest(Path(entry["path"])) == _digest(Path(where)), name


@pytest.fixture
def two_sources(tmp_path, tiny_target, tiny_qwen_draft) -> tuple[Path, Path]:
    """Two different models in folders of the same name (``m``)."""
    a, b = tmp_path / "a" / "m", tmp_path / "b" / "m"
    shutil.copytree(tiny_target, a)
    shutil.copytree(tiny_qwen_draft, b)
    return a, b


@pytest.mark.parametrize("lined_up", [True, False, False, False])
def test_two_imports_of_one_typed_name_at_once_list_one_and_refuse_the_other(
        tmp_path, lib_home, two_sources, lined_up):
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([_import(src, "--name", "same", "--json") for src in two_sources], env,
                       _lock(lib_home) if lined_up else None)
    won = [r for r in runs if r.returncode == 0]
    lost = [r for r in runs if r.returncode != 0]
    assert len(won) == 1 and len(lost) == 1, [(r.returncode, r.stderr) for r in runs]
    assert lost[0].returncode == 1
    errors = [line for line in lost[0].stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "A model named 'same' is already installed" in errors[0], errors
    assert "Traceback" not in lost[0].stderr
    winner = Path(won[0].args[5])
    assert json.loads(won[0].stdout)["name"] == "same"
    assert list(_models(lib_home)) == ["same"]
    assert _models(lib_home)["same"]["source"] == f"import:{winner}"
    assert _digest(lib_home / "models" / "same") == _digest(winner)
    assert sorted(p.name for p in (lib_home / "models").iterdir()) == ["same"]
    assert list((lib_home / "tmp").iterdir()) == []


@pytest.mark.parametrize("lined_up", [True, False])
def test_two_imports_of_one_default_name_at_once_get_two_names(tmp_path, lib_home, two_sources,
                                                               lined_up):
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([_import(src, "--json") for src in two_sources], env,
                       _lock(lib_home) if lined_up else None)
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    said = sorted(json.loads(r.stdout)["name"] for r in runs)
    assert said == ["m", "m-2"] == sorted(_models(lib_home))
    _each_listed_holds_its_own_files(lib_home)
    assert sorted(p.name for p in (lib_home / "models").iterdir()) == ["m", "m-2"]


def test_one_folder_imported_twice_at_once_is_one_model(tmp_path, lib_home, two_sources):
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([_import(two_sources[0], "--json")] * 2, env, _lock(lib_home))
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert [json.loads(r.stdout)["name"] for r in runs] == ["m", "m"]
    assert list(_models(lib_home)) == ["m"]
    _each_listed_holds_its_own_files(lib_home)
    assert [p.name for p in (lib_home / "models").iterdir()] == ["m"]
    assert list((lib_home / "tmp").iterdir()) == []


def test_a_pull_beside_an_import_of_the_same_name_lists_both(tmp_path, lib_home, hub,
                                                            tiny_target):
    src = tmp_path / "mine" / "tiny-target"  # the name the pull lists its model under
    shutil.copytree(tiny_target, src)
    env = specchat_env(tmp_path, lib_home, HF_ENDPOINT=hub.url, HF_TOKEN=FAKE_TOKEN)
    pull = [sys.executable, "-m", "specchat", "models", "pull", "hf:test-org/tiny-target",
            "--json"]
    runs = run_at_once([pull, _import(src, "--json")], env, _lock(lib_home))
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    pulled, imported = (json.loads(r.stdout) for r in runs)
    assert {pulled["name"], imported["name"]} == {"tiny-target", "tiny-target-2"}
    models = _models(lib_home)
    assert models[pulled["name"]]["source"] == "hf:test-org/tiny-target"
    assert models[imported["name"]]["source"] == f"import:{src}"
    _each_listed_holds_its_own_files(lib_home)


HEAD = """
import sys
from pathlib import Path
from specchat import startup
startup.prepare()
from specchat.library import trained_heads
print(trained_heads.list_trained(Path(sys.argv[1]), sys.argv[2]).name)
"""


def test_two_trained_heads_listed_at_once_get_two_names(tmp_path, lib_home, tiny_target,
                                                        tiny_qwen_target):
    heads = [build_eagle3(tmp_path / t / "head", target, seed=i)
             for i, (t, target) in enumerate((("one", tiny_target), ("two", tiny_qwen_target)))]
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([[sys.executable, "-c", HEAD, str(h), str(t)]
                        for h, t in zip(heads, (tiny_target, tiny_qwen_target), strict=True)],
                       env, _lock(lib_home))
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert sorted(r.stdout.strip() for r in runs) == ["head", "head-2"]
    models = _models(lib_home)
    assert sorted(models) == ["head", "head-2"]
    assert sorted(m["path"] for m in models.values()) == sorted(str(h) for h in heads)


REMEMBER = """
import sys
from pathlib import Path
from specchat.library import hub_files
for blob in sys.argv[1:]:
    hub_files.remember(Path(blob))
"""


def test_blobs_checked_by_processes_at_once_are_all_remembered(tmp_path, lib_home):
    """The records of checked files are read, changed and written back by
    every pull: four pulls at once keep each other's records."""
    blobs = lib_home / "hub" / "models--o--r" / "blobs"
    blobs.mkdir(parents=True)
    for i in range(100):
        (blobs / f"{i:040x}").write_bytes(b"x%d" % i)
    groups = [sorted(blobs.iterdir())[k::4] for k in range(4)]
    env = specchat_env(tmp_path, lib_home)
    runs = run_at_once([[sys.executable, "-c", REMEMBER, *map(str, g)] for g in groups], env)
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr for r in runs]
    kept = json.loads((lib_home / "hub-verified.json").read_text())
    assert len(kept) == 100
