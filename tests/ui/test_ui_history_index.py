"""The window keeps the engine's history index (suffix drafting over earlier
conversations) in step with the store: built off the GUI thread when a pair
loads, saved beside the history file, joined by each reply as it ends, and
left by a conversation the user deletes."""

from __future__ import annotations

from ui_support import load, send_and_wait, wait_until


def engine_docs(window) -> set[str]:
    return window.session.engine.client.call(lambda eng: set(eng.history.docs)).wait(timeout=30)


def test_the_history_index_follows_the_store(qtbot, window, tiny_target, tiny_draft):
    convs = window.session.conversations.blocking
    old = convs.create("Adding numbers")
    convs.add_message(old.id, "user", "Write a function that adds two numbers.")
    convs.add_message(old.id, "assistant", "def add(a, b):\n    return a + b\n")
    window.sidebar.refresh()
    load(qtbot, window, tiny_target, tiny_draft)
    index = window.session.history_index
    wait_until(lambda: index.last, timeout=30_000)
    assert "1 conversations" in index.last
    assert engine_docs(window) == {f"conv:{old.id}"}
    saved = list(index.folder().glob("history-*.npz"))
    assert len(saved) == 1 and saved[0].stat().st_size > 0

    # A reply joins the index when it ends, under its chat's key; the next
    # turn of the same chat uses the same key (it is not its own history).
    # Once the store gives it an id, the chat is known to the index by it.
    send_and_wait(qtbot, window, "Now write one that multiplies them.")
    wait_until(lambda: window.conversation.conversation_id is not None)
    new = f"conv:{window.conversation.conversation_id}"
    wait_until(lambda: engine_docs(window) == {f"conv:{old.id}", new}, timeout=30_000)
    send_and_wait(qtbot, window, "And one that divides them.")
    assert engine_docs(window) == {f"conv:{old.id}", new}
    # Deleting a chat begun in this session takes it out too.
    window.sidebar.select(window.conversation.conversation_id)
    window.sidebar.delete_current(confirm=False)
    wait_until(lambda: new not in engine_docs(window), timeout=30_000)

    # Deleting the stored conversation takes it out of the index.
    window.open_conversation(old.id)
    wait_until(lambda: window.sidebar.current_id == old.id and not window.conversation.busy)
    window.sidebar.delete_current(confirm=False)
    wait_until(lambda: f"conv:{old.id}" not in engine_docs(window), timeout=30_000)

    # A conversation deleted while a sync is reading the store stays out:
    # the read still holds it, and the deletion's forget reaches the engine
    # before the sync does.
    late = convs.create("Subtracting")
    convs.add_message(late.id, "user", "Write a function that subtracts two numbers.")
    convs.add_message(late.id, "assistant", "def sub(a, b):\n    return a - b\n")
    store = window.session.conversations
    real_corpus = store.corpus

    read: list[int] = []

    async def read_then_delete():
        rows = await real_corpus()
        read.extend(cid for cid, _stamp, _msgs in rows)
        convs.delete(late.id)
        index.forget(late.id)
        return rows

    store.corpus = read_then_delete
    try:
        task = index.sync()
        wait_until(task.done, timeout=30_000)
    finally:
        del store.corpus
    task.result()
    assert read == [late.id]  # the read held it
    assert f"conv:{late.id}" not in engine_docs(window)
    assert "0 conversations" in index.last


def test_a_new_chat_has_its_id_before_its_first_save_and_the_index_keys_it_by_it(
        qtbot, aloop, home, tiny_target, tiny_draft, monkeypatch):
    """A chat's id is made with its first message, not by SQLite: it is
    known while another program holds the history's lock (nothing written
    yet), the first reply joins the history index under it, the rows land
    under it once the lock goes, and the next sync reads the chat back under
    the same key. Before, a new chat had no id until its row was written;
    it replied under a session key that was renamed once the store answered."""
    import sqlite3

    from lockholder import hold_lock
    from specchat.store import db
    from ui_support import make_window

    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.2)  # 5 s in the app
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    index = w.session.history_index
    wait_until(lambda: index.last, timeout=30_000)  # the load's sync has read the store
    path = home / "conversations.sqlite3"
    with hold_lock(path) as holder:
        w.composer.edit.setPlainText("Who names this chat?")
        w.composer.send_button.click()
        cid = w.conversation.conversation_id
        assert cid is not None
        wait_until(lambda: not w.conversation.busy, timeout=60_000)
        assert engine_docs(w) == {f"conv:{cid}"}  # from its first reply
        with sqlite3.connect(path) as other:
            assert other.execute("SELECT COUNT(*) FROM conversations").fetchone()[0] == 0
        holder.release()
    w.session.store.submit(lambda: None).result()  # the queued writes have run
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT id FROM conversations").fetchall() == [(cid,)]
        assert other.execute("SELECT DISTINCT conversation_id FROM messages").fetchall() == [
            (cid,)]
    task = index.sync()
    wait_until(task.done, timeout=30_000)
    assert "1 conversations" in index.last and engine_docs(w) == {f"conv:{cid}"}
    w.close()
