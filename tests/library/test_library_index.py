"""Imports, the index, removal, references and the catalog."""

from __future__ import annotations

import json

import pytest
from libtools import tree_files
from specchat.library import bundled, catalog, importing, index, paths, refs
from specchat.library import hub as lib_hub
from specchat.library.errors import LibraryError


def test_import_folder_lists_it_with_its_facts(lib_home, tiny_target):
    model = importing.import_path(tiny_target, name="my-llama")
    assert model.name == "my-llama" and model.kind == "import"
    assert model.source == f"import:{tiny_target.resolve()}"
    assert (paths.models_dir() / "my-llama" / "model.safetensors").exists()
    assert model.params and model.vocab_size == 400 and model.model_type == "llama"
    assert index.get("MY-LLAMA") == model
    # Importing the same folder again reuses it; nothing left in staging.
    assert importing.import_path(tiny_target).name == "my-llama"
    assert list(paths.tmp_dir().iterdir()) == []
    data = json.loads(paths.index_file().read_text())
    assert list(data["models"]) == ["my-llama"]
    assert not [p for p in paths.home().iterdir() if p.name.startswith(".index-")]


def test_import_refuses_what_the_engine_cannot_load(lib_home, tmp_path, tiny_target):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(LibraryError, match="pickled"):
        importing.import_path(pickled)
    with pytest.raises(LibraryError, match="neither an MLX model folder nor a GGUF"):
        importing.import_path(tiny_target / "config.json")
    with pytest.raises(LibraryError, match="no such file"):
        importing.import_path(tmp_path / "nothing-here")
    assert index.list_installed() == []
    assert tree_files(paths.models_dir()) == []


def test_import_cancelled_leaves_nothing(lib_home, tiny_target, monkeypatch):
    import os
    import threading

    monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError("no links")))
    monkeypatch.setattr(importing, "COPY_CHUNK", 4096)
    cancel = threading.Event()

    def progress(_msg, frac):
        if frac and frac > 0.3:
            cancel.set()

    with pytest.raises(importing.ImportCancelled):
        importing.import_path(tiny_target, progress=progress, cancelled=cancel)
    assert index.list_installed() == []
    assert tree_files(paths.tmp_dir()) == [] and tree_files(paths.models_dir()) == []


def test_remove_hub_and_imported_models(hub, tiny_draft):
    pulled = lib_hub.pull("hf:test-org/tiny-target")
    imported = importing.import_path(tiny_draft, name="draft-copy")
    usage = paths.disk_usage()
    assert usage >= pulled.size_bytes + imported.size_bytes

    gone = index.remove(pulled.name)
    assert gone.name == pulled.name
    assert [m.name for m in index.list_installed()] == ["draft-copy"]
    assert not (paths.hub_cache() / "models--test-org--tiny-target").exists()
    after = paths.disk_usage()
    assert after <= usage - pulled.size_bytes

    index.remove("draft-copy")
    assert index.list_installed() == []
    assert not (paths.models_dir() / "draft-copy").exists()
    assert tiny_draft.exists() and (tiny_draft / "model.safetensors").exists()
    assert paths.disk_usage() < after
    with pytest.raises(LibraryError, match="No installed model named 'draft-copy'"):
        index.remove("draft-copy")


def test_resolve_references(hub, tiny_target):
    imported = importing.import_path(tiny_target, name="local-llama")
    assert refs.resolve("local-llama") == paths.models_dir() / "local-llama"
    assert refs.resolve(str(tiny_target)) == tiny_target.resolve()
    pulled = lib_hub.pull("hf:test-org/tiny-draft")
    assert refs.resolve(pulled.name) == refs.resolve("hf:test-org/tiny-draft")
    assert imported.name in str(refs.resolve(imported.name))

    with pytest.raises(LibraryError) as err:
        refs.resolve("no-such-model")
    msg = str(err.value)
    assert "bundled:NAME" in msg and "hf:org/repo" in msg and "local-llama" in msg
    with pytest.raises(LibraryError, match="write hf:someone/thing"):
        refs.resolve("someone/thing")
    with pytest.raises(LibraryError, match="not found"):
        refs.resolve("/nowhere/model.gguf")
    with pytest.raises(LibraryError, match="not a Hub reference"):
        refs.resolve("hf:not a repo")


def test_catalog_pairs_are_sound():
    cat = catalog.load_catalog()
    assert len(cat.pairs) >= 8
    ids = {m.id for m in cat.models}
    assert {"qwen2.5-7b", "qwen2.5-0.5b", "llama3.1-8b", "llama3.2-1b", "smollm2-135m",
            "qwen3-0.6b", "qwen2.5-coder-1.5b"} <= ids
    for p in cat.pairs:
        if p.kind == "mtp":  # the target's own head: its original checkpoint, not MLX's
            assert p.draft is None and p.target.mtp, p.id
            assert not p.target.ref.startswith("hf:mlx-community/"), p.id
            assert "own multi-token-prediction head" in p.why, p.id
        else:
            assert p.target.tokenizer.id == p.draft.tokenizer.id, p.id
            assert p.draft.params * 2 < p.target.params, p.id
            assert "fewer parameters" in p.why, p.id
        if p.kind == "model":
            assert p.target.ref.startswith(("hf:mlx-community/", "bundled:")), p.id
            assert "tokenizer" in p.why
        mem = p.memory(dtype="q4")
        assert mem.total > p.target.params * 0.5
        assert p.to_json()["memory"]["total"] == p.memory().total
    bundled = [p for p in cat.pairs if p.bundled]
    assert [p.id for p in bundled] == ["qwen2.5-coder-1.5b+qwen2.5-coder-0.5b"]
    assert bundled[0].download_bytes == 0
    assert cat.model("hf:mlx-community/Qwen2.5-7B-Instruct-4bit").id == "qwen2.5-7b"
    assert cat.model("mlx-community/qwen2.5-7b-instruct-4bit").id == "qwen2.5-7b"


def test_hub_model_is_named_after_the_catalog(hub, monkeypatch):
    """A repo the catalog knows gets the catalog's short name."""
    real = catalog.load_catalog()
    fake = catalog.Catalog(models=[*real.models, catalog.CatalogModel(
        id="tiny-llama", name="Tiny", ref="hf:test-org/tiny-target",
        tokenizer=real.models[0].tokenizer, params=1000, quantization=None, download_bytes=1,
        num_layers=2, num_kv_heads=2, head_dim=16, max_context=2048)], pairs=real.pairs)
    monkeypatch.setattr(lib_hub, "load_catalog", lambda folder=None: fake)  # what hub names by
    assert lib_hub.pull("hf:test-org/tiny-target").name == "tiny-llama"
    assert refs.resolve("tiny-llama").name == index.get("tiny-llama").revision


def test_gguf_import_goes_through_gguf_import_and_is_reused(lib_home, tmp_path, monkeypatch,
                                                           tiny_target):
    import shutil

    calls = []

    def import_gguf(gguf_path, dest, progress, cancelled, **_where):
        calls.append(gguf_path)
        progress("converting", 0.5)
        shutil.copytree(tiny_target, dest)
        return dest

    # Stand-ins for the conversion (tests/library/test_gguf_import.py runs it),
    # to test how the import calls it.
    monkeypatch.setattr(importing, "import_gguf", import_gguf)
    monkeypatch.setattr(importing, "gguf_summary", lambda path: {"name": "Tiny GGUF"})
    gguf = tmp_path / "blob-without-extension"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    model = importing.import_path(gguf)
    assert model.kind == "gguf" and model.name == "Tiny-GGUF"
    assert model.source == f"gguf:{gguf.resolve()}"
    assert refs.resolve(str(gguf)) == paths.models_dir() / "Tiny-GGUF"
    assert len(calls) == 1, "a GGUF file is converted once"
    assert list(paths.tmp_dir().iterdir()) == []


def test_bundled_pull_lists_the_bundled_model(lib_home, monkeypatch, tiny_draft):
    seen = []

    def ensure(name, progress, cancelled):
        progress(f"preparing {name}", 1.0)
        return tiny_draft

    monkeypatch.setattr(bundled, "ensure", ensure)  # the conversion: tests/library/test_bundled.py
    model = refs.pull("bundled:qwen2.5-coder-0.5b", progress=seen.append)
    assert model.kind == "bundled" and model.source == "bundled:qwen2.5-coder-0.5b"
    assert seen and seen[-1].fraction == 1.0
    assert refs.pull("qwen2.5-coder-0.5b").name == model.name  # by catalog id
    assert [m.name for m in index.list_installed()] == [model.name]


def test_index_entries_keep_their_json_order(lib_home, tiny_target):
    """``models list --json`` prints entries in this key order (an index
    entry is a ModelFacts plus where it came from; the order must not follow
    the class layout)."""
    from specchat.library.facts import read_folder

    model = importing.import_path(tiny_target, name="ordered")
    assert list(model.to_json()) == [
        "name", "source", "kind", "path", "revision", "size_bytes", "params", "quantization",
        "tokenizer_fingerprint", "model_type", "vocab_size", "attention",
        "num_layers", "num_kv_heads", "head_dim", "max_context", "mtp", "hidden_size", "head",
        "installed_at"]
    assert index.InstalledModel.from_json(model.to_json()) == model
    assert model.facts == read_folder(model.path)
