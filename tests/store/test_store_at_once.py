"""Processes opening one fresh history at once (issue 47): the app and a
terminal, or two windows, started together on a new home. In 3 of 5 trials
one of them got "table conversations already exists" or "another program
has it locked" at once. Now the second waits for the first's layout and
opens the same history; every process's writes are kept."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

OPEN = r"""
import json, sys, time
from specchat.store import db
start, paths = float(sys.argv[1]), sys.argv[2:]
said = []
for k, path in enumerate(paths):
    while time.time() < start + k * 0.05:  # every process opens file k at the same moment
        time.sleep(0.001)
    try:
        opened = db.open_history(path)
        opened.conn.execute("INSERT INTO settings(key, value) VALUES (?, 'x')", (str(k) + ":" + str(id(said)),))
        opened.conn.close()
        said.append("ok")
    except Exception as exc:
        said.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(said))
"""


def test_processes_opening_one_fresh_history_at_once_all_open_it(tmp_path):
    trials, processes = 16, 3
    paths = [str(tmp_path / f"trial{k}" / "conversations.sqlite3") for k in range(trials)]
    start = time.time() + 1.5  # all started and importing done by then, on a loaded box too
    procs = [subprocess.Popen([sys.executable, "-c", OPEN, str(start), *paths],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * processes, [e for _, e in outs]
    said = [json.loads(out) for out, _ in outs]
    failed = [(k, s[k]) for s in said for k in range(trials) if s[k] != "ok"]
    assert failed == [], failed
    for path in paths:  # one history each, the newest layout, every process's row in it
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT COUNT(*) FROM settings").fetchone()[0] == processes
        assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                } == {"conversations", "messages", "settings"}
        conn.close()


START = r"""
import json, logging, sys, time
from specchat.store.worker import StoreWorker
errors = []
handler = logging.Handler()
handler.emit = lambda record: errors.append(record.getMessage()) if record.levelno >= logging.ERROR else None
logging.getLogger("specchat.store").addHandler(handler)
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
w = StoreWorker(sys.argv[1])
print(json.dumps({"recovered": w.recovered, "errors": errors}))
w.close()
"""


def test_windows_starting_at_once_import_a_recovery_file_once(tmp_path):
    """Conversations kept at quit (store/recovery.py) are imported by the
    next start; three starting at once once each imported the file (the
    later ones writing it over what the first had written since) and then
    said they could not delete it. Now one imports it; the others leave it."""
    from specchat.store import db, recovery
    from specchat.store.conversations import ChatContent, MessageContent

    path = tmp_path / "conversations.sqlite3"
    db.connect(path).close()
    chats = [ChatContent(f"c{i}", f"Kept {i}", [MessageContent("user", f"q{j} " * 100)
                                                for j in range(40)])
             for i in range(150)]  # an import that takes a moment
    kept = recovery.write(recovery.folder_for(path), chats)
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", START, str(path), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, [e for _, e in outs]
    said = [json.loads(out) for out, _ in outs]
    assert sorted(s["recovered"] for s in said) == [0, 0, 150], said
    assert [s["errors"] for s in said] == [[], [], []], said
    assert not kept.exists()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM conversations").fetchone()[0] == 150
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 150 * 40
    conn.close()
