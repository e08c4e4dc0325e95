"""Keeps the engine's history index (suffix drafting over the user's earlier
conversations) in step with the store.

When a pair loads, every stored conversation is read on the store's thread
and handed to the engine thread, which renders the changed ones with the
target's chat template and rebuilds the index (reusing the ids saved beside
the store for the rest). Neither step runs on the GUI thread. A deleted
conversation leaves the index at once; replies join it as they end (the
engine does that itself, under the request's ``history_key``).

Keys: ``conv:<id>`` for a conversation, whose id is made with its first
message (store/conversations.py): a chat begun in this session replies
under the key the next sync reads it by, so deleting it, or that sync,
finds it, and its own earlier turns are never mistaken for history.
"""

from __future__ import annotations

import asyncio
import logging

from PySide6.QtCore import QObject, Signal

from specchat.engine.events import Message

log = logging.getLogger("specchat.ui")


def stored_key(conversation_id: str) -> str:
    return f"conv:{conversation_id}"


class HistoryIndex(QObject):
    synced = Signal(str)  # one line for the log and the tooltip: what the index holds

    def __init__(self, session, parent=None):
        super().__init__(parent)
        self.session = session
        self.last: str = ""
        self._task: asyncio.Future | None = None
        # Keys deleted while a sync reads the store, one set per sync under
        # way: that read may still hold them, and handing them to the engine
        # after the deletion's ``forget`` would put them back.
        self._reading: list[set[str]] = []
        session.engine.loaded.connect(lambda _pair: self.sync())

    def folder(self):
        """Beside the history file (None for an in-memory store)."""
        rec = self.session.store.recovery_folder
        return rec.parent / "history-index" if rec is not None else None

    def sync(self) -> asyncio.Future:
        self._task = asyncio.ensure_future(self._sync())
        return self._task

    async def _sync(self) -> None:
        gone: set[str] = set()
        self._reading.append(gone)
        try:
            rows = await self.session.conversations.corpus()
        except Exception as exc:  # noqa: BLE001 - the history is optional for drafting
            log.warning("History index: could not read the conversations (%s).", exc)
            return
        finally:
            self._reading = [s for s in self._reading if s is not gone]  # by identity
        # From here to the engine call nothing awaits, so a later deletion's
        # forget reaches the engine thread after this sync.
        convs = [(stored_key(cid), stamp, tuple(Message(r, c) for r, c in msgs))
                 for cid, stamp, msgs in rows if stored_key(cid) not in gone]
        folder = self.folder()
        engine = self.session.engine
        try:
            report = await engine.client.call(
                lambda eng: eng.sync_history(convs, folder),
                loop=asyncio.get_running_loop()).result()
        except Exception as exc:  # noqa: BLE001
            log.warning("History index: not built (%s).", exc)
            return
        self.last = (f"history index: {report.conversations} conversations, "
                     f"{report.tokens:,} tokens, {report.bytes / 2**20:.1f} MB, "
                     f"{report.seconds:.2f} s ({report.file_note})")
        log.info(self.last)
        self.synced.emit(self.last)

    def forget(self, conversation_id: str) -> None:
        """A deleted conversation leaves the index."""
        key = stored_key(conversation_id)
        for gone in self._reading:
            gone.add(key)
        engine = self.session.engine
        if engine.pair is None:
            return
        engine.client.call(lambda eng: eng.forget_conversation(key))
