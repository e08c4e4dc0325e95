"""Fixtures for the store tests: a conversation store on a fresh SQLite file
(a private SPECCHAT_HOME is tests/conftest.py's ``home``). No Qt and no models: the store is plain
sqlite3 on its own thread."""

from __future__ import annotations

import logging

import pytest
from specchat.store import db
from specchat.store.conversations import ConversationStore


@pytest.fixture
def store_file(tmp_path):
    """The store's SQLite file (for what another program does to it)."""
    return tmp_path / "c.sqlite3"


@pytest.fixture
def store(store_file):
    conn = db.connect(store_file)
    yield ConversationStore(conn)
    conn.close()


@pytest.fixture
def records():
    """What the store logs (the app sends it to stderr and specchat.log)."""
    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    logger = logging.getLogger("specchat.store")
    logger.addHandler(handler)
    yield got
    logger.removeHandler(handler)
