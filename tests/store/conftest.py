"""Fixtures for the store tests: a conversation store on a fresh SQLite file
(a private SPECCHAT_HOME is tests/conftest.py's ``home``). No Qt and no models: the store is plain
sqlite3 on its own thread."""

from __future__ import annotations

import pytest
from specchat.store import db
from specchat.store.conversations import ConversationStore


@pytest.fixture
def store(tmp_path):
    conn = db.connect(tmp_path / "c.sqlite3")
    yield ConversationStore(conn)
    conn.close()
