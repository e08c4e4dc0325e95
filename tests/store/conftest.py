"""Fixtures for the store tests: a private SPECCHAT_HOME and a conversation
store on a fresh SQLite file. No Qt and no models: the store is plain
sqlite3 on its own thread."""

from __future__ import annotations

import pytest
from specchat.store import db
from specchat.store.conversations import ConversationStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECCHAT_HOME", str(home))
    return home


@pytest.fixture
def store(tmp_path):
    conn = db.connect(tmp_path / "c.sqlite3")
    yield ConversationStore(conn)
    conn.close()
