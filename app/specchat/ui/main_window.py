"""The SpecChat window: a view over an AppSession.

It lays out the widgets and wires them to the session and the conversation
controller. State lives in the session (engine, store, settings) and the
controllers; widgets stay thin and are reached through their public
methods and signals.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QMainWindow, QSplitter, QWidget

from specchat.engine.events import LoadedPair
from specchat.store.settings import AppSettings
from specchat.ui import theme
from specchat.ui.api_activity import ApiActivityLabel
from specchat.ui.banner import Banner
from specchat.ui.chat_model import ChatModel
from specchat.ui.chat_view import ChatView
from specchat.ui.compare import CompareDialog
from specchat.ui.compare_runner import CompareRunner
from specchat.ui.composer import Composer
from specchat.ui.conversation import ConversationController
from specchat.ui.gauges import GaugeStrip
from specchat.ui.head_training import HeadTraining
from specchat.ui.history_banner import HistoryBanner
from specchat.ui.lag_label import LagLabel
from specchat.ui.load_views import LoadBanner, PairStatus, pair_name
from specchat.ui.model_manager import ModelManager
from specchat.ui.options_bar import OptionsBar
from specchat.ui.pair_picker import PairPicker
from specchat.ui.session import AppSession
from specchat.ui.settings import SettingsDialog
from specchat.ui.sidebar import Sidebar
from specchat.ui.widgets import vbox

STATUS_MS = 3000
COPIED_MS = 2500


class MainWindow(QMainWindow):
    def __init__(self, client=None, db_path: str | Path | None = None,
                 initial_pair: tuple[str, str | None] | None = None,
                 session: AppSession | None = None, parent=None):
        """Either a ``session``, or what to make one from (``client``,
        ``db_path``); ``initial_pair`` is selected and loaded at start."""
        super().__init__(parent)
        self.setWindowTitle("SpecChat")
        self.resize(1180, 780)
        self.setMinimumSize(860, 560)
        self.session = session if session is not None else AppSession(client, db_path, self)
        self.chat_model = ChatModel(self)
        self.conversation = ConversationController(self.session, self.chat_model, self)
        self.initial_pair = initial_pair
        self._build()
        # Keys typed into a window just opened go to the message box (the
        # first widget of the tab order is the sidebar's New chat button).
        self.composer.edit.setFocus()
        self._wire()
        self._settings_changed(self.session.settings)
        self.sidebar.set_read_only(self.session.history_problem)
        self.update_state()

    # -- layout ----------------------------------------------------------------
    def _build(self) -> None:
        self.sidebar = Sidebar(self.session.conversations)
        self.picker = PairPicker(self.session.pairs)
        self.options = OptionsBar(self.session)
        self.chat_view = ChatView()
        self.chat_view.setModel(self.chat_model)
        self.chat_view.set_colors(theme.current())
        self.gauges = GaugeStrip()
        self.composer = Composer()
        self.load_banner = LoadBanner(self.session.engine)
        self.error_banner = Banner("ErrorBanner", closable=True)
        self.history_banner = HistoryBanner(self.session)

        center = QWidget()
        banners = vbox(self.load_banner, self.error_banner, self.history_banner,
                       margins=(12, 6, 12, 0))
        vbox(self.picker, self.options, banners, (self.chat_view, 1), self.gauges, self.composer,
             parent=center, margins=0, spacing=0)

        split = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(center)
        split.setStretchFactor(1, 1)
        split.setSizes([230, 950])
        split.setChildrenCollapsible(False)
        self.setCentralWidget(split)

        self.pair_status = PairStatus(self.session.engine)
        self.lag_status = LagLabel(self.session.lag)
        self.statusBar().addPermanentWidget(self.pair_status)
        self.statusBar().addPermanentWidget(self.lag_status)
        self.api_activity = ApiActivityLabel(self.session.api)
        self.statusBar().addPermanentWidget(self.api_activity)

    def _wire(self) -> None:
        c, e, s = self.conversation, self.session.engine, self.session
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(c.stop)
        self.composer.regenerateRequested.connect(self.regenerate)
        self.composer.editRequested.connect(self.edit_last)
        self.composer.unqueueRequested.connect(c.unqueue)
        c.queueChanged.connect(self._queue_changed)
        c.sent.connect(self._sent)
        c.generatingChanged.connect(self.update_state)
        c.conversationOpened.connect(self.update_state)
        c.gaugesChanged.connect(self.gauges.show_values)
        c.errorRaised.connect(self.show_error)
        c.conversationsChanged.connect(self._conversations_changed)
        s.settingsChanged.connect(self._settings_changed)
        s.failed.connect(self.show_error)
        s.noticed.connect(self.show_error)
        s.historyChanged.connect(self._history_changed)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.deleted.connect(self._conversation_deleted)
        self.sidebar.failed.connect(self.show_error)
        self.picker.loadRequested.connect(self.load_pair)
        self.picker.manageRequested.connect(self.open_model_manager)
        e.loadStarted.connect(self._load_started)
        e.loaded.connect(self._loaded)
        e.loadFailed.connect(self._load_failed)
        e.heldChanged.connect(self.update_state)
        self.options.compareRequested.connect(self.open_compare)
        self.options.settingsRequested.connect(self.open_settings)
        self.options.notice.connect(self._status)
        self.options.thinkingChosen.connect(c.set_reasoning_effort)
        c.effortChanged.connect(self.options.show_effort)
        self.chat_view.copied.connect(self._copied)
        self.chat_view.notice.connect(self._status)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._scheme_changed)

    # -- start / close -----------------------------------------------------
    def start(self) -> None:
        """Begin work that needs the running event loop: the lag monitor,
        the picker's lists, the verdict check and the first load."""
        self.chat_view.warm_up()
        self.session.lag.start()
        self.session.pairs.start()
        self.lag_status.start()
        if self.initial_pair is not None:
            target, draft = self.initial_pair
            self.picker.set_pair(target, draft)
            self.load_pair(target, draft)
        if self.session.notice:  # after load_pair, which clears the error line
            self.show_error(self.session.notice)

    def closeEvent(self, event) -> None:  # noqa: N802
        # A reply still finishing must not touch this window any more (the
        # last periodic save of a reply stands); the session finishes the
        # queued writes, this last settings save included.
        self.conversation.blockSignals(True)
        self.conversation.stop()
        self.lag_status.stop()
        self.session.close()
        super().closeEvent(event)

    # -- state -------------------------------------------------------------------
    def update_state(self, *_args) -> None:
        """Enable what can be done now (after any change of reply, load or
        conversation)."""
        c, engine = self.conversation, self.session.engine
        has_turn = any(m.role == "user" for m in self.chat_model.messages)
        self.composer.set_state(c.generating, engine.ready and not c.opening, has_turn,
                                can_queue=engine.loading and not c.busy)
        held = engine.held_by is not None  # Compare is running
        self.picker.set_busy(c.busy or held)
        self.options.set_can_compare(engine.ready and not c.busy and not held)
        self.options.show_pair(engine.pair)
        if not c.busy:
            self._preview_mode()

    def _preview_mode(self) -> None:
        if self.session.engine.pair is not None:
            self.gauges.preview(self.session.next_mode())

    def _settings_changed(self, s: AppSettings) -> None:
        if s.color_tokens != self.chat_view.color_tokens:
            self.chat_view.set_color_tokens(s.color_tokens)
            self.chat_model.refresh_all()
        self._preview_mode()

    def _history_changed(self) -> None:
        """The history opened again (Retry): list it, and write the chat on
        screen if it was said while nothing could be saved."""
        self.sidebar.set_read_only(self.session.history_problem)
        if self.session.saving:
            self.conversation.save_unsaved()
            self.sidebar.relist(self.conversation.conversation_id)

    def _status(self, message: str) -> None:
        self.statusBar().showMessage(message, STATUS_MS)

    def _copied(self, message: str) -> None:
        self.statusBar().showMessage(message, COPIED_MS)

    def show_error(self, message: str) -> None:
        self.error_banner.show_message(message)

    # -- chat actions ------------------------------------------------------------
    def send(self, text: str) -> None:
        self.error_banner.hide()
        self.conversation.send(text)
        self.update_state()

    def _sent(self) -> None:
        self.composer.clear()
        self.chat_view.stick_to_bottom()

    def _queue_changed(self, queued: bool, why: str) -> None:
        """A message waits for the models in the composer (or no longer: why)."""
        self.composer.set_queued(queued)
        if why:
            self.composer.show_note(why)

    def regenerate(self) -> None:
        self.error_banner.hide()
        self.conversation.regenerate()
        self.update_state()

    def edit_last(self) -> None:
        text = self.conversation.take_last_turn()
        if text is not None:
            self.composer.set_text(text)
        self.update_state()

    def open_conversation(self, conversation_id: str | None) -> None:
        self.conversation.open(conversation_id)
        self.sidebar.select(conversation_id)
        self.gauges.clear()
        self.update_state()

    def _conversation_deleted(self, conversation_id: str) -> None:
        self.session.history_index.forget(conversation_id)
        if self.conversation.conversation_id == conversation_id:
            self.open_conversation(None)

    def _conversations_changed(self) -> None:
        self.sidebar.relist(self.conversation.conversation_id)
        self.update_state()

    # -- models --------------------------------------------------------------------
    def load_pair(self, target: str, draft: str | None) -> None:
        self.error_banner.hide()
        self.conversation.load(target, draft)  # or says why not
        self.update_state()

    def _load_started(self, *_args) -> None:
        self.picker.load_started()  # a refusal of the last load is stale now

    def _loaded(self, pair: LoadedPair) -> None:
        engine = self.session.engine
        # "<pair> — SpecChat": Qt appends the display name on Linux unless a
        # title ends with it (macOS shows the title as it is).
        self.setWindowTitle(f"{pair_name(pair)} — SpecChat")
        self.session.update_settings(last_target=engine.target_ref, last_draft=engine.draft_ref)
        self.picker.set_pair(engine.target_ref, engine.draft_ref)
        self.update_state()

    def _load_failed(self, message: str) -> None:
        if self.session.engine.load_cancelled:
            self.statusBar().showMessage("Loading cancelled.", 5000)
            self.picker.set_pair(*self.picker.selection())  # back to the verdict
        else:
            self.picker.show_refusal(message)
            self.show_error(message)
        self.update_state()

    # -- dialogs -------------------------------------------------------------------
    def open_model_manager(self):
        if getattr(self, "head_training", None) is None:
            self.head_training = HeadTraining(self.session)
        old = getattr(self, "model_manager", None)
        if old is not None and (old.isVisible() or self.head_training.running or old.pending):
            old.show()  # one manager while it has work going: its Cancel stays in reach
            old.raise_()
            old.activateWindow()
            return old
        self._forget(old)
        dlg = ModelManager(self.session.engine.client, self, self.head_training)
        dlg.modelsChanged.connect(self.session.pairs.reload_choices)
        engine = self.session.engine  # what can be trained now
        for signal in (engine.loaded, engine.heldChanged, engine.loadStarted, engine.loadFailed):
            signal.connect(dlg.update_training)
        dlg.show()
        self.model_manager = dlg
        return dlg

    def open_compare(self, prompt: str | None = None):
        if prompt is None:
            prompt = self.composer.text().strip() or next(
                (m.text for m in reversed(self.chat_model.messages) if m.role == "user"), "")
        old = getattr(self, "compare_dialog", None)
        if old is not None and not old.isVisible() and old.idle:
            self._forget(old)  # (a closed one still finishing its cancelled run stays)
        dlg = CompareDialog(CompareRunner(self.session, self.conversation), prompt, self)
        dlg.show()
        self.compare_dialog = dlg
        return dlg

    def open_settings(self) -> None:
        dlg = SettingsDialog(self.session.settings, self, self.session)
        if dlg.exec():
            self.session.update_settings(**dlg.edited())
        self._forget(dlg)

    @staticmethod
    def _forget(dlg) -> None:
        """A closed dialog the window opens anew next time: deleted, or it
        would stay the window's child for the whole session, still listening
        to the engine."""
        if dlg is not None:
            dlg.deleteLater()

    def _scheme_changed(self, *_args) -> None:
        app = QApplication.instance()
        colors = theme.apply(app) if app is not None else theme.current()
        self.chat_view.set_colors(colors)
        self.chat_model.refresh_all()
