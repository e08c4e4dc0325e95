"""The app session: the services one window works with, and its settings.

The window, its controllers and its dialogs are views over a session: they
read the settings from it, change them through ``update_settings`` (which
saves), and follow ``settingsChanged`` instead of being handed values. The
session owns the engine (EngineController and its client thread), the store
(its thread and the conversation and settings stores), the lag monitor,
the per-pair plain speeds, the pair picker's controller (``pairs``,
ui/pair_controller.py) and the local API server that Settings turns on
(``api``, ui/local_api.py); closing it finishes the queued writes, and keeps
what could still not be written (the chats on screen) in a recovery file
the next start adds to the history (store/recovery.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from specchat.engine import modes
from specchat.store import recovery
from specchat.store.conversations import ConversationStore
from specchat.store.settings import AppSettings, checked_changes
from specchat.store.worker import READ_ONLY, UNAVAILABLE, Remote, StoreWorker, report_failure
from specchat.ui.engine_controller import EngineController
from specchat.ui.history_index import HistoryIndex
from specchat.ui.lag import LagMonitor
from specchat.ui.local_api import LocalApi
from specchat.ui.pair_controller import PairController
from specchat.ui.requests import reply_mode
from specchat.ui.stats import PlainSpeeds

log = logging.getLogger("specchat.ui")


class AppSession(QObject):
    settingsChanged = Signal(object)  # AppSettings, after a change
    failed = Signal(str)  # a settings change refused, or one that did not reach the disk
    noticed = Signal(str)  # like ``notice``, but after start (a Retry recovered chats)
    historyChanged = Signal()  # saving, waiting for a lock, read-only or unavailable
    _storeWaiting = Signal(bool)  # from the store's thread; delivered on the GUI thread

    def __init__(self, client=None, db_path: str | Path | None = None, parent=None):
        """``client``: an EngineClient (the library's by default);
        ``db_path``: the history file (the library home's by default)."""
        super().__init__(parent)
        # A method of this object: Qt queues it to the GUI thread.
        self._storeWaiting.connect(self._waiting_changed)
        self.store = StoreWorker(db_path, on_waiting=self._storeWaiting.emit)
        self.conversations: Remote[ConversationStore] = self.store.conversations
        self._changed: set[str] = set()  # fields set in this session (kept over a retry)
        self._settings, bad = self.store.settings.blocking.read()  # start-up
        self._bad_settings = bad
        self._unsaved: list[Callable[[], recovery.UnsavedConversation | None]] = []
        self.engine = EngineController(client, self)
        # Settings' prompt cache reaches the engine when a pair loads and
        # whenever it changes (nothing is cached before a pair loads).
        self._cache_gb: float | None = None  # the budget the engine was given
        self.engine.loaded.connect(self._apply_prompt_cache)
        self.settingsChanged.connect(self._prompt_cache_changed)
        self.lag = LagMonitor()
        self.plain_speeds = PlainSpeeds()
        # Settings' "Local server": the OpenAI-compatible API on this engine.
        self.api = LocalApi(self, self)
        self.api.failed.connect(self.failed)
        # The engine's index of earlier conversations, for suffix drafting.
        self.history_index = HistoryIndex(self, self)
        # What the pair picker shows: choices, verdicts, clusters, measured drafts.
        self.pairs = PairController(self.engine, self.conversations, self)

    @property
    def settings(self) -> AppSettings:
        return self._settings

    @property
    def notice(self) -> str | None:
        """What happened at start that the user should read: an unreadable
        history moved aside, stored settings that were not valid."""
        parts = [self.store.notice] if self.store.notice else []
        if self._bad_settings:
            parts.append("Some saved settings were not valid and are back to their defaults: "
                         f"{', '.join(self._bad_settings)}.")
        return " ".join(parts) or None

    # -- the history's state ---------------------------------------------------
    @property
    def saving(self) -> bool:
        """Chats and settings reach the history file."""
        return self.store.saving

    @property
    def history_problem(self) -> str | None:
        """Why nothing is saved (read-only or unavailable), in words."""
        return self.store.problem

    @property
    def history_retryable(self) -> bool:
        """The history could not be opened: trying again may work."""
        return self.store.state == UNAVAILABLE

    @property
    def saving_waits(self) -> bool:
        """A write waits for another program's lock and will be retried."""
        return self.store.waiting

    def retry_history(self) -> asyncio.Future:
        """Open the history file again; the future gives whether it is now
        saving. Once it is, the stored settings apply, except the fields
        changed in this session, which win and are saved."""
        return asyncio.ensure_future(self._retry())

    async def _retry(self) -> bool:
        saving = await asyncio.wrap_future(self.store.reopen())
        if saving:
            stored, self._bad_settings = await self.store.settings.read()
            self._settings = replace(stored, **{k: getattr(self._settings, k)
                                                for k in self._changed})
            if self._changed:
                self._save()
            self.settingsChanged.emit(self._settings)
            if self.store.recovered:
                self.noticed.emit(self.store.notice)
        self.historyChanged.emit()
        return saving

    @Slot(bool)
    def _waiting_changed(self, _waiting: bool) -> None:
        self.historyChanged.emit()

    def update_settings(self, **changes) -> None:
        """Change some settings, save them (on the store's thread) and tell
        every view. Values are checked here, once, for every caller: one out
        of its range is not applied, and ``failed`` says why in one line."""
        changes, refused = checked_changes(changes)
        for line in refused:
            self.failed.emit(f"{line}; not changed.")
        new = replace(self._settings, **changes)
        if new == self._settings:
            return
        self._settings = new
        self._changed.update(changes)
        self._save()
        self.settingsChanged.emit(new)

    def _prompt_cache_changed(self, settings: AppSettings) -> None:
        if settings.prompt_cache_gb != self._cache_gb and self.engine.pair is not None:
            self._apply_prompt_cache()

    def _apply_prompt_cache(self, *_args) -> None:
        """Give the engine the budget of the prompt cache setting: a job
        queued behind whatever the engine runs, so the window never waits."""
        self._cache_gb = self._settings.prompt_cache_gb
        asyncio.ensure_future(self.engine.prompt_cache(self._cache_gb)).add_done_callback(_logged)

    def next_mode(self, speculative: bool | None = None) -> modes.Mode:
        """How the next reply on the loaded pair will be decoded."""
        return reply_mode(self._settings, self.engine.pair, speculative)

    def _save(self) -> None:
        if not self.saving:
            return  # the window already says that nothing is saved
        report_failure(self.store.settings.save(self._settings), self.failed.emit,
                       "save the settings")

    def keep_at_quit(self, unsaved: Callable[[], recovery.UnsavedConversation | None]) -> None:
        """``unsaved()`` is asked at quit, once the queued writes are done,
        for the chat on screen if some of it may not be in the history."""
        self._unsaved.append(unsaved)

    def close(self) -> None:
        """Stop the engine's work and finish the queued writes, this last
        settings save included; keep what could not be written. A reply or
        load still finishing must not reach the views any more."""
        self.engine.blockSignals(True)
        self.lag.stop()
        self.pairs.close()
        self.api.stop()  # its requests' engine jobs are cancelled with it
        self._save()
        self.engine.close()
        self.store.close()
        self._keep_unsaved()
        self.blockSignals(True)

    def _keep_unsaved(self) -> None:
        """No lost turns: what the history did not take (its lock still held
        at quit, a full disk, a history that never opened) goes to a
        recovery file. Not for a newer version's read-only history: there
        nothing is saved by design, and the window said so."""
        if self.store.state == READ_ONLY or self.store.recovery_folder is None:
            return
        kept = [c for c in (unsaved() for unsaved in self._unsaved) if c is not None]
        if not kept:
            return
        try:
            path = recovery.write(self.store.recovery_folder, kept)
        except OSError as exc:
            log.error("%d conversation(s) could not be saved, nor kept in %s (%s).",
                      len(kept), self.store.recovery_folder, exc)
            return
        log.warning("%d conversation(s) could not be saved to the history; kept in %s, to be "
                    "added to it at the next start.", len(kept), path)


def _logged(task: asyncio.Future) -> None:
    """A background engine job's failure, in the log (it has no view to tell)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("The prompt cache's budget did not reach the engine: %s", task.exception())
