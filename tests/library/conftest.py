"""Fixtures for the model-library tests: a private SPECCHAT_HOME and a local
Hub look-alike (tests/library/hubserver.py) serving the tiny models.

Why in-process with HF_ENDPOINT: SpecChat's hub module reads HF_ENDPOINT at
call time and passes ``endpoint=`` and ``cache_dir=`` explicitly to every
huggingface_hub call, so the client's import-time constants never matter and
``monkeypatch.setenv`` is enough. The CLI tests run the real ``specchat``
command in a subprocess with the same variables.

Every test in this folder gets these fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hubserver import HubServer
from libtools import FAKE_TOKEN, pickled_repo_files


@pytest.fixture
def lib_home(tmp_path, monkeypatch) -> Path:
    """An empty library folder, fine-grained progress, no stray settings."""
    home = tmp_path / "specchat-home"
    monkeypatch.setenv("SPECCHAT_HOME", str(home))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SPECCHAT_MEMORY_AVAILABLE",
                "SPECCHAT_DTYPE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    from specchat.library import hub

    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    return home


@pytest.fixture
def hub(lib_home, monkeypatch, tiny_target, tiny_draft, mismatched_draft):
    """The local Hub with test-org/tiny-target, tiny-draft, other-vocab and
    pickled; HF_ENDPOINT points at it and a fake token is set (to check it
    never reaches the CDN or our files)."""
    with HubServer() as server:
        server.add_repo("test-org/tiny-target", tiny_target)
        server.add_repo("test-org/tiny-draft", tiny_draft)
        server.add_repo("test-org/other-vocab", mismatched_draft)
        server.add_repo("test-org/pickled", files=pickled_repo_files(tiny_target))
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
        yield server
