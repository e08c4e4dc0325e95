"""Fixtures for the engine tests: an Engine with the tiny pair loaded, fresh
for each test (its caches and drafter state are the test's own). The tiny
models themselves are built once per session in tests/conftest.py."""

from __future__ import annotations

import pytest
from specchat.engine.session import Engine


@pytest.fixture
def tiny_engine(tiny_target, tiny_draft) -> Engine:
    engine = Engine()
    engine.load(tiny_target, tiny_draft)
    return engine
