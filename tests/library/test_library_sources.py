"""The registry of reference kinds (refs.SOURCES, one module each in
library/sources/): what it accepts, in which order, and that a new kind is
one small class and one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from specchat.library import compatibility, importing, paths, refs
from specchat.library.errors import LibraryError
from specchat.library.sources.base import Source


class EnvSource(Source):
    """env:NAME - the MLX folder named by the environment variable NAME."""

    accepted = "env:VARIABLE"

    def claims(self, ref):
        return ref.startswith("env:")

    def resolve(self, ref, progress=None, cancelled=None):
        return Path(os.environ[ref[4:]]).expanduser().resolve()


def test_a_new_source_resolves_and_describes(lib_home, monkeypatch, tiny_qwen_target,
                                             tiny_qwen_draft):
    monkeypatch.setattr(refs, "SOURCES", [EnvSource(), *refs.SOURCES])  # registration
    monkeypatch.setenv("TINY_TARGET", str(tiny_qwen_target))
    monkeypatch.setenv("TINY_DRAFT", str(tiny_qwen_draft))

    assert refs.resolve("env:TINY_TARGET") == tiny_qwen_target.resolve()
    side = compatibility.describe("env:TINY_DRAFT")
    assert side.on_disk and side.path == str(tiny_qwen_draft.resolve())
    assert side.ref == "env:TINY_DRAFT" and side.params
    assert compatibility.check("env:TINY_TARGET", "env:TINY_DRAFT").compatible
    assert refs.accepted().endswith(", a catalog name, or env:VARIABLE")
    with pytest.raises(LibraryError, match="or env:VARIABLE"):
        refs.resolve("no-such-model")


def test_the_accepted_words_name_every_kind():
    assert refs.accepted() == (
        "an installed model name (see `specchat models list`), bundled:NAME, a model "
        "folder, a .gguf file, hf:org/repo[@revision], cluster:NAME, or a catalog name")
    with pytest.raises(LibraryError, match=r"^No model given: pass an installed model name"):
        refs.resolve("  ")
    with pytest.raises(LibraryError, match="No model given"):
        compatibility.describe("")


def test_precedence_folder_then_installed_then_catalog(lib_home, tmp_path, monkeypatch,
                                                      tiny_target, tiny_qwen_draft):
    # An installed model named like a catalog id wins over the catalog.
    importing.import_path(tiny_qwen_draft, name="qwen2.5-0.5b")
    assert refs.resolve("qwen2.5-0.5b") == paths.models_dir() / "qwen2.5-0.5b"
    side = compatibility.describe("qwen2.5-0.5b", allow_work=False)
    assert side.on_disk and side.name == "qwen2.5-0.5b" and side.catalog is None
    # A folder of that name where the user is wins over the installed name.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen2.5-0.5b").symlink_to(tiny_target)
    assert refs.resolve("qwen2.5-0.5b") == tiny_target.resolve()
    # Prefixes are never paths, and a catalog id not installed is judged from the catalog.
    assert type(refs.find("hf:org/repo")).__name__ == "HubSource"
    assert type(refs.find("bundled:x")).__name__ == "BundledSource"
    catalog_only = compatibility.describe("qwen2.5-7b", allow_work=False)
    assert not catalog_only.on_disk and catalog_only.catalog.id == "qwen2.5-7b"


def test_a_file_that_is_not_gguf_is_refused_in_words(lib_home, tiny_target, tmp_path):
    """No source claims a file that is not GGUF (by name or magic bytes), and
    the refusal says what it is; a .gguf not imported yet is judged only once
    it is."""
    config = tiny_target / "config.json"
    for ask in (refs.resolve, lambda ref: compatibility.describe(ref, allow_work=False)):
        with pytest.raises(LibraryError, match=f"^{config} is a file but not a GGUF model; pass "
                                               "an installed"):
            ask(str(config))
    gguf = tmp_path / "later.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(LibraryError, match="^later.gguf has not been imported yet"):
        compatibility.describe(str(gguf), allow_work=False)


def test_pull_goes_through_the_sources_that_can_pull(lib_home, tiny_target):
    imported = importing.import_path(tiny_target, name="local")
    assert refs.pull("local") == imported  # already complete: nothing to fetch
    assert refs.pull(str(tiny_target)) is None  # folders are imported, not pulled
