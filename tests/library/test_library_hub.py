"""Pulling models from a Hub look-alike through the real huggingface_hub
client: progress, resume, cancellation, refusals, offline mode, updates."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import pytest
from clustertools import Trap
from libtools import FAKE_TOKEN
from specchat.library import hub as lib_hub
from specchat.library import index, paths, refs
from specchat.library.errors import LibraryError

REPO = "test-org/tiny-target"
REF = f"hf:{REPO}"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_full_pull_reports_progress_up_to_the_total(hub, tiny_target):
    events = []
    model = lib_hub.pull(REF, progress=events.append)

    sized = [e for e in events if e.total_bytes]
    assert sized, "no progress with a known total"
    total = sized[0].total_bytes
    done = [e.done_bytes for e in sized]
    assert done == sorted(done), "bytes done must never go backwards"
    assert done[-1] == total
    assert len({d for d in done if 0 < d < total}) >= 5, "progress inside the big file"
    assert all(e.total_bytes == total for e in sized)
    assert any(e.rate_bps > 0 for e in sized)
    assert any(e.file == "model.safetensors" for e in sized)

    # Listed, complete, identical to the source, and only the files mlx-lm needs.
    assert [m.name for m in index.list_installed()] == [model.name]
    assert model.source == REF and model.kind == "hub" and len(model.revision) == 40
    folder = paths.hub_cache() / "models--test-org--tiny-target" / "snapshots" / model.revision
    assert str(folder) == model.path
    names = sorted(p.name for p in folder.iterdir())
    assert "README.md" not in names and ".gitattributes" not in names
    assert "model.safetensors" in names and "config.json" in names
    assert _sha(folder / "model.safetensors") == _sha(tiny_target / "model.safetensors")
    assert model.size_bytes == total
    assert model.params and model.model_type == "llama" and model.quantization == "float32"
    assert model.tokenizer_fingerprint and model.attention == "full"

    # The token went to the Hub, never to the CDN, and is written nowhere.
    cdn = [r for r in hub.requests if r.path.startswith("/cdn/")]
    assert cdn and all("authorization" not in r.headers for r in cdn)
    assert any(r.headers.get("authorization") == f"Bearer {FAKE_TOKEN}" for r in hub.requests)
    for f in paths.home().rglob("*"):
        if f.is_file() and f.stat().st_size < 5_000_000:
            assert FAKE_TOKEN.encode() not in f.read_bytes(), f

    # A second pull asks the Hub once and downloads nothing.
    before = hub.downloads("model.safetensors"), hub.downloads("config.json")
    again = lib_hub.pull(REF)
    assert again.revision == model.revision
    assert (hub.downloads("model.safetensors"), hub.downloads("config.json")) == before


def test_dropped_connection_is_resumed_with_a_range_request(hub, tiny_target, monkeypatch):
    import huggingface_hub.file_download as fd

    monkeypatch.setattr(fd.time, "sleep", lambda _s: None)  # huggingface_hub waits 1 s
    hub.drop_after("model.safetensors", 100_000)
    events = []
    model = lib_hub.pull(REF, progress=events.append)

    ranges = [r.headers.get("range") for r in hub.requests if r.path.startswith("/cdn/")]
    resumed = [int(r[6:-1]) for r in ranges if r and r.startswith("bytes=") and r.endswith("-")]
    # Resumed from the last whole chunk written before the drop, not from zero.
    assert resumed and 0 < resumed[0] <= 100_000
    got = paths.hub_cache() / "models--test-org--tiny-target" / "snapshots" / model.revision
    assert _sha(got / "model.safetensors") == _sha(tiny_target / "model.safetensors")
    done = [e.done_bytes for e in events if e.total_bytes]
    assert done == sorted(done) and done[-1] == events[-1].total_bytes


def test_pull_cut_off_midway_lists_nothing_and_the_retry_keeps_finished_files(
        hub, tiny_target, monkeypatch):
    import huggingface_hub.file_download as fd

    monkeypatch.setattr(fd.time, "sleep", lambda _s: None)
    # 100 kB, then the server hangs up on every retry without sending more.
    hub.drop_after("model.safetensors", 100_000)
    hub.drop_after("model.safetensors", 0, times=10)
    with pytest.raises(LibraryError, match="Finished files are kept"):
        lib_hub.pull(REF)
    assert index.list_installed() == []
    assert lib_hub.installed(REF) is None
    with pytest.raises(LibraryError):
        refs.resolve("tiny-target")  # not an installed name either
    small = {n: hub.downloads(n) for n in ("config.json", "tokenizer.json",
                                           "tokenizer_config.json")}
    assert all(v == 1 for v in small.values()), small
    weights_before = hub.downloads("model.safetensors")

    hub._drops.clear()
    events = []
    model = lib_hub.pull(REF, progress=events.append)
    assert {n: hub.downloads(n) for n in small} == small, "finished files were fetched again"
    assert hub.downloads("model.safetensors") == weights_before + 1
    first = next(e for e in events if e.total_bytes)
    assert first.done_bytes > 0, "finished files count as done from the start"
    assert [m.name for m in index.list_installed()] == [model.name]
    folder = paths.hub_cache() / "models--test-org--tiny-target" / "snapshots" / model.revision
    assert _sha(folder / "model.safetensors") == _sha(tiny_target / "model.safetensors")


def test_cancel_midway_then_resume(hub):
    cancel = threading.Event()

    def progress(p):
        if p.file == "model.safetensors" and p.done_bytes > 120_000:
            cancel.set()

    with pytest.raises(lib_hub.DownloadCancelled, match="cancelled"):
        lib_hub.pull(REF, progress=progress, cancelled=cancel)
    assert index.list_installed() == []
    blobs = paths.hub_cache() / "models--test-org--tiny-target" / "blobs"
    assert not [b for b in blobs.iterdir() if "incomplete" in b.name]
    config_gets = hub.downloads("config.json")

    model = lib_hub.pull(REF)
    assert hub.downloads("config.json") == config_gets
    assert index.get(model.name) is not None


def test_missing_repo_has_a_clear_message(hub):
    with pytest.raises(LibraryError, match="was not found on the Hugging Face Hub"):
        lib_hub.pull("hf:test-org/no-such-model")
    with pytest.raises(LibraryError, match="does not exist"):
        lib_hub.pull(f"{REF}@v9")
    assert index.list_installed() == []


def test_repo_without_safetensors_is_refused_before_downloading(hub):
    with pytest.raises(LibraryError, match="pickled"):
        lib_hub.pull("hf:test-org/pickled")
    assert hub.downloads("pytorch_model.bin") == 0
    assert hub.downloads("config.json") == 0
    assert index.list_installed() == []


def test_offline_mode_uses_the_cache_and_says_so(hub, monkeypatch):
    model = lib_hub.pull(REF)
    n_requests = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    assert refs.resolve(REF) == paths.hub_cache() / "models--test-org--tiny-target" \
        / "snapshots" / model.revision
    messages = []
    assert lib_hub.pull(REF, progress=lambda p: messages.append(p.message)).name == model.name
    assert any("Offline mode" in m for m in messages)
    with pytest.raises(LibraryError, match="Offline mode.*has not been downloaded"):
        refs.resolve("hf:test-org/tiny-draft")
    assert len(hub.requests) == n_requests, "offline mode must not touch the network"


def test_unreachable_hub_falls_back_to_the_cached_copy(hub, monkeypatch):
    model = lib_hub.pull(REF)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    messages = []
    again = lib_hub.pull(REF, progress=lambda p: messages.append(p.message))
    assert again.path == model.path
    assert any("Could not reach the Hub" in m for m in messages)
    with pytest.raises(LibraryError, match="Could not reach the Hugging Face Hub"):
        lib_hub.pull("hf:test-org/tiny-draft")


def test_update_downloads_only_changed_files_and_prunes_the_old_commit(hub, tiny_target):
    import json

    first = lib_hub.pull(REF)
    config = json.loads((tiny_target / "config.json").read_text())
    config["comment"] = "updated upstream"
    hub.update_file(REPO, "config.json", json.dumps(config).encode())
    weights = hub.downloads("model.safetensors")

    second = lib_hub.pull(REF)
    assert second.revision != first.revision and second.name == first.name
    assert hub.downloads("model.safetensors") == weights, "unchanged weights re-downloaded"
    snapshots = paths.hub_cache() / "models--test-org--tiny-target" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == [second.revision]
    assert [m.revision for m in index.list_installed()] == [second.revision]


def test_pinned_revision_resolves_without_asking_the_hub(hub):
    model = lib_hub.pull(REF)
    n = len(hub.requests)
    pinned = f"{REF}@{model.revision}"
    assert refs.resolve(pinned) == refs.resolve(REF)
    assert len(hub.requests) == n


def test_hf_ref_pulls_with_progress_through_refs(hub):
    seen = []
    path = refs.resolve("hf:test-org/tiny-draft", progress=lambda m, f: seen.append((m, f)))
    assert (path / "config.json").exists()
    fractions = [f for _m, f in seen if f is not None]
    assert fractions and fractions[-1] == 1.0
    assert any("MB/s" in m or "KB" in m or "of" in m for m, _f in seen)


def test_a_hub_repo_holding_a_hostfile_brings_only_the_model(hub, tiny_target):
    """A pull fetches the JSON files a model needs by name, so the repo's
    hostfile.json (or any other JSON of its author's) never lands, and
    loading the download dials nobody."""
    from specchat.engine.distributed import hostfile
    from specchat.engine.session import Engine

    with Trap() as trap:  # where the hostfile's rank 1 listens
        spec = hostfile.plan("evil", tiny_target, ["127.0.0.1", "127.0.0.1"], trap.port - 3)
        hub.add_repo("someone/model", tiny_target, files={
            "hostfile.json": json.dumps(spec.to_json()).encode(), "notes.json": b"{}"})
        folder = refs.resolve("hf:someone/model")
        assert folder.parent.name == "snapshots"
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            p.name for p in tiny_target.iterdir())
        assert hub.downloads("hostfile.json") == hub.downloads("notes.json") == 0
        Engine().load(folder)
        time.sleep(0.5)
        assert trap.calls == []
