"""Fixtures for the engine tests: an Engine with the tiny pair loaded, fresh
for each test (``tiny_engine``: its caches and drafter state are the test's
own) or shared by a module's tests (``engine``: loading once per module
keeps those modules fast). The tiny models themselves are built once per
session in tests/conftest.py."""

from __future__ import annotations

import pytest
from specchat.engine import attention
from specchat.engine.session import Engine
from tinymodels import build_arch


@pytest.fixture
def tiny_engine(tiny_target, tiny_draft) -> Engine:
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    return engine


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft) -> Engine:
    e = Engine()
    e.load(tiny_target, tiny_draft)
    return e


@pytest.fixture(scope="session")
def arch_models(tiny_dir, tiny_tokenizer):
    """``get(arch)``: a tiny target of one of tinymodels.ARCHS (a cache kind
    mlx-lm makes: recurrent state, sliding windows) and its draft, the same
    architecture with noise (blocks are accepted and rejected), built once."""
    built: dict = {}

    def get(arch: str):
        if arch not in built:
            target = build_arch(tiny_dir / f"arch-{arch}", tiny_tokenizer, arch)
            draft = build_arch(tiny_dir / f"arch-{arch}-draft", tiny_tokenizer, arch, seed=6,
                               noise_from=target, noise=0.05)
            built[arch] = (target, draft)
        return built[arch]

    return get


@pytest.fixture
def block_rows(monkeypatch) -> list[int]:
    """The rows of each call of the CPU's block attention
    (attention.block_attention) from here on, in order (a test clears it
    after loading, whose warm-up runs some): which forwards take the block
    path, for tests of attention.py and of what it patches."""
    seen: list[int] = []
    real = attention.block_attention

    def spy(q, *args, **kwargs):
        seen.append(q.shape[2])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(attention, "block_attention", spy)
    return seen
