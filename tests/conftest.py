"""Shared fixtures: tiny real models built once per test session, a
private library folder, and a local Hub look-alike serving them.

Nothing here downloads anything: the tokenizer is trained in-process and the
models are random mlx-lm models saved as ordinary MLX model folders. The
Hub (tests/hubserver.py) runs in-process on 127.0.0.1, with HF_ENDPOINT
pointing at it: SpecChat's hub module reads HF_ENDPOINT at call time and
passes ``endpoint=`` and ``cache_dir=`` explicitly to every huggingface_hub
call, so the client's import-time constants never matter and
``monkeypatch.setenv`` is enough. The CLI tests run the real ``specchat``
command in a subprocess with the same variables.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from specchat import startup  # noqa: E402

startup.prepare()  # the system BLAS before anything imports MLX
from hubserver import HubServer  # noqa: E402
from libtools import FAKE_TOKEN, pickled_repo_files  # noqa: E402
from tinymodels import (  # noqa: E402
    build_agent_model,
    build_agent_tokenizer,
    build_eagle3,
    build_model,
    build_tokenizer,
)


def pytest_addoption(parser):
    parser.addoption("--bundle", action="store_true",
                     help="run the packaging check (tests marked bundle: build the Linux "
                          "package with Briefcase, install it and run it); ./dev bundle does")


def pytest_collection_modifyitems(config, items):
    """The packaging check takes minutes and installs a system package: only
    with --bundle (its own CI step), never in a plain run."""
    if config.getoption("--bundle"):
        return
    skip = pytest.mark.skip(reason="the packaging check runs with --bundle (./dev bundle)")
    for item in items:
        if item.get_closest_marker("bundle") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _closed_widgets_deleted():
    """pytest-qt closes a test's widgets and asks Qt to delete them later,
    but "later" means the event loop, which tests never enter: every window
    of the run stayed alive, and each new window and style change walked
    them all (a window's setup grew from 0.1 s to 5 s over the UI tests).
    Runs after pytest-qt's teardown, and only once Qt is loaded."""
    yield
    qt = sys.modules.get("PySide6.QtCore")
    if qt is not None and qt.QCoreApplication.instance() is not None:
        qt.QCoreApplication.sendPostedEvents(None, qt.QEvent.Type.DeferredDelete)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private, empty SPECCHAT_HOME: history, settings and models of this
    test only."""
    home = tmp_path / "home"
    monkeypatch.setenv("SPECCHAT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir) -> Path:
    return build_tokenizer(tiny_dir / "tokenizer")


@pytest.fixture(scope="session")
def tiny_base(tiny_dir, tiny_tokenizer) -> Path:
    """A 2-layer llama-shaped model the target and draft are derived from."""
    return build_model(tiny_dir / "base-llama", tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def tiny_target(tiny_dir, tiny_tokenizer, tiny_base) -> Path:
    """llama-shaped target, 6 layers: the base plus 4 nearly transparent ones,
    so it is 2.5x the draft's size and mostly agrees with it."""
    return build_model(tiny_dir / "target-llama", tiny_tokenizer, layers=6, seed=11,
                       grow_from=tiny_base)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir, tiny_tokenizer, tiny_base) -> Path:
    """The base plus noise: agrees with the target often, not always."""
    return build_model(tiny_dir / "draft-noisy", tiny_tokenizer, noise_from=tiny_base,
                       noise=0.05, seed=2)


@pytest.fixture(scope="session")
def tiny_qwen_target(tiny_dir, tiny_tokenizer) -> Path:
    """qwen2-shaped target whose embedding is wider than the tokenizer (as
    real models pad their vocabulary)."""
    return build_model(tiny_dir / "target-qwen2", tiny_tokenizer, model_type="qwen2", seed=3,
                       vocab=416)


@pytest.fixture(scope="session")
def tiny_qwen_draft(tiny_dir, tiny_tokenizer) -> Path:
    """A qwen2 draft with its own random weights and an unpadded vocabulary."""
    return build_model(tiny_dir / "draft-qwen2", tiny_tokenizer, model_type="qwen2", seed=4,
                       layers=1)


@pytest.fixture(scope="session")
def agent_tokenizer(tiny_dir) -> Path:
    """Qwen3's template and <think>/<tool_call> markers (tinymodels.build_agent_tokenizer)."""
    return build_agent_tokenizer(tiny_dir / "tokenizer-agent")


@pytest.fixture(scope="session")
def agent_target(tiny_dir, agent_tokenizer) -> Path:
    """A target whose greedy replies are known (tinymodels.AGENT_CHAINS):
    reasoning then two tool calls, or with thinking off an answer."""
    return build_agent_model(tiny_dir / "target-agent", agent_tokenizer)


@pytest.fixture(scope="session")
def agent_draft(tiny_dir, agent_tokenizer) -> Path:
    """The agent target's script but for the tokens after </think> and the
    first call: a draft that is right often, not always."""
    return build_agent_model(tiny_dir / "draft-agent", agent_tokenizer,
                             forget=("</think>", "call1"), seed=22)


@pytest.fixture(scope="session")
def other_tokenizer(tiny_dir) -> Path:
    """A different vocabulary (trained with extra text and a larger size)."""
    return build_tokenizer(tiny_dir / "tokenizer-other", vocab_size=460,
                           corpus_extra="zebra quokka axolotl " * 20)


@pytest.fixture(scope="session")
def mismatched_draft(tiny_dir, other_tokenizer) -> Path:
    return build_model(tiny_dir / "draft-other-vocab", other_tokenizer, seed=5)


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


@pytest.fixture
def hub_heads(hub, tiny_dir, tiny_target):
    """The local Hub also serving random EAGLE-3 heads for the tiny target
    in both published layouts (test-org/tiny-eagle3: vLLM's speculators;
    test-org/tiny-eagle3-midlayer: EAGLE-3's own), and test-org/other-eagle3,
    a head that reads hidden states of width 32 (the tiny target's are 64)."""
    for layout, repo in (("speculators", "test-org/tiny-eagle3"),
                         ("eagle3", "test-org/tiny-eagle3-midlayer")):
        hub.add_repo(repo, build_eagle3(tiny_dir / f"hub-eagle3-{layout}", tiny_target,
                                        layout=layout))
    hub.add_repo("test-org/other-eagle3",
                 build_eagle3(tiny_dir / "hub-eagle3-narrow", tiny_target, hidden=32))
    return hub


@pytest.fixture
def aloop(qapp):
    """A qasync loop marked as running, so tasks advance whenever Qt
    processes events (qtbot.waitUntil, qtbot.wait)."""
    import asyncio

    import qasync
    from specchat.ui import theme

    theme.apply(qapp)
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    for task in asyncio.all_tasks(loop):
        task.cancel()
    for _ in range(5):
        qapp.processEvents()
    asyncio.events._set_running_loop(None)
    loop.stop()
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size) -> folder``: a real small tmpfs (tests/smalldisk.py)."""
    from smalldisk import mounter

    yield from mounter(tmp_path)


@pytest.fixture(scope="module")
def real_home():
    """SPECCHAT_HOME for the slow tests' real models: a cache kept between
    test runs (SPECCHAT_TEST_CACHE, default <repo>/.venv/specchat-test-home),
    so only the first run pays for importing the bundled GGUFs."""
    repo = Path(__file__).resolve().parents[1]
    cache = Path(os.environ.get("SPECCHAT_TEST_CACHE") or repo / ".venv" / "specchat-test-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECCHAT_HOME", str(cache))
        yield cache
