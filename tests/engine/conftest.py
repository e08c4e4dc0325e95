"""Fixtures for the engine tests: an Engine with the tiny pair loaded, fresh
for each test (``tiny_engine``: its caches and drafter state are the test's
own) or shared by a module's tests (``engine``: loading once per module
keeps those modules fast). The tiny models themselves are built once per
session in tests/conftest.py."""

from __future__ import annotations

import pytest
from specchat.engine.session import Engine


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
