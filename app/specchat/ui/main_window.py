"""The SpecChat window: assembles the widgets and wires them to the
controllers. Widgets stay thin; state lives in the controllers and stores."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from specchat.engine.events import LoadedPair
from specchat.store.settings import AppSettings
from specchat.store.worker import StoreWorker, report_failure
from specchat.ui import theme
from specchat.ui.chat_model import ChatModel
from specchat.ui.chat_view import ChatView
from specchat.ui.composer import Composer
from specchat.ui.controller import ChatController, EngineController, decode_mode
from specchat.ui.gauges import GaugeStrip
from specchat.ui.lag import LagMonitor
from specchat.ui.pair_picker import PairPicker

SPEC_SHORTCUT = "Ctrl+Shift+S"


class Banner(QFrame):
    """A line across the chat for loading progress or an error."""

    def __init__(self, object_name: str, closable: bool, parent=None):
        super().__init__(parent)
        self.setObjectName(object_name)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bar = QProgressBar()
        self.bar.setFixedWidth(180)
        self.bar.setTextVisible(False)
        self.bar.hide()
        self.button = QToolButton()
        self.button.setText("Dismiss" if closable else "Cancel")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.button)
        if closable:
            self.button.clicked.connect(self.hide)
        self.hide()

    def show_message(self, text: str, fraction: float | None = None, progress: bool = False):
        self.label.setText(text)
        self.bar.setVisible(progress)
        if progress:
            if fraction is None:
                self.bar.setRange(0, 0)
            else:
                self.bar.setRange(0, 1000)
                self.bar.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.show()


class MainWindow(QMainWindow):
    def __init__(self, client=None, db_path: str | Path | None = None,
                 initial_pair: tuple[str, str | None] | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("SpecChat")
        self.resize(1180, 780)
        self.setMinimumSize(860, 560)
        self.db = StoreWorker(db_path)
        self.conversations = self.db.conversations
        self.settings: AppSettings = self.db.settings.blocking.load()  # start-up
        self.lag = LagMonitor()
        self.engine = EngineController(client, self)
        self.chat_model = ChatModel(self)
        self.controller = ChatController(self.engine, self.conversations, self.chat_model,
                                         lambda: self.settings, self.lag, self)
        self.initial_pair = initial_pair
        self._build()
        self._wire()
        self._apply_settings_to_widgets()
        self._update_state()

    # -- layout ----------------------------------------------------------------
    def _build(self) -> None:
        from specchat.ui.sidebar import Sidebar

        self.sidebar = Sidebar(self.conversations)
        self.picker = PairPicker()
        self.chat_view = ChatView()
        self.chat_view.setModel(self.chat_model)
        self.chat_view.delegate.set_colors(theme.current())
        self.gauges = GaugeStrip()
        self.composer = Composer()
        self.load_banner = Banner("Banner", closable=False)
        self.error_banner = Banner("ErrorBanner", closable=True)

        # Options: the speculative switch, K, colouring, compare, settings.
        self.spec_action = QAction("Speculative decoding", self)
        self.spec_action.setCheckable(True)
        self.spec_action.setShortcut(QKeySequence(SPEC_SHORTCUT))
        self.spec_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.addAction(self.spec_action)
        self.spec_box = QCheckBox("Speculative decoding")
        self.spec_box.setToolTip(f"Draft tokens and verify them in one pass ({SPEC_SHORTCUT}). "
                                 "Takes effect on the next reply.")
        self.k_box = QComboBox()
        self.k_box.addItem("K auto", None)
        for k in range(1, 9):
            self.k_box.addItem(f"K = {k}", k)
        self.k_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.k_box.setToolTip("Draft length: adaptive, or a fixed number of tokens per step")
        self.color_box = QCheckBox("Colour tokens")
        self.color_box.setToolTip("Tint the text that came from accepted draft tokens")
        self.spec_reason = QLabel()
        self.spec_reason.setObjectName("ErrorBanner")
        self.spec_reason.setWordWrap(True)
        self.spec_reason.hide()
        self.compare_button = QPushButton("Compare…")
        self.compare_button.setToolTip("Run one prompt plain and speculative, side by side")
        self.settings_button = QPushButton("Settings…")
        options = QFrame()
        options.setObjectName("PairBar")
        ol = QHBoxLayout(options)
        ol.setContentsMargins(12, 4, 12, 4)
        ol.addWidget(self.spec_box)
        ol.addWidget(self.k_box)
        ol.addWidget(self.color_box)
        ol.addWidget(self.spec_reason, 1)
        ol.addStretch(1)
        ol.addWidget(self.compare_button)
        ol.addWidget(self.settings_button)

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.picker)
        cl.addWidget(options)
        banners = QVBoxLayout()
        banners.setContentsMargins(12, 6, 12, 0)
        banners.addWidget(self.load_banner)
        banners.addWidget(self.error_banner)
        cl.addLayout(banners)
        cl.addWidget(self.chat_view, 1)
        cl.addWidget(self.gauges)
        cl.addWidget(self.composer)

        split = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(center)
        split.setStretchFactor(1, 1)
        split.setSizes([230, 950])
        split.setChildrenCollapsible(False)
        self.setCentralWidget(split)

        self.pair_status = QLabel("No model loaded")
        self.lag_status = QLabel("")
        self.statusBar().addPermanentWidget(self.pair_status)
        self.statusBar().addPermanentWidget(self.lag_status)
        self._lag_timer = QTimer(self, interval=1000)
        self._lag_timer.timeout.connect(self._show_lag)

    def _wire(self) -> None:
        c, e = self.controller, self.engine
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(c.stop)
        self.composer.regenerateRequested.connect(self.regenerate)
        self.composer.editRequested.connect(self.edit_last)
        c.generatingChanged.connect(lambda _on: self._update_state())
        c.gaugesChanged.connect(self.gauges.show_values)
        c.errorRaised.connect(self.show_error)
        c.conversationsChanged.connect(self._conversations_changed)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.deleted.connect(self._conversation_deleted)
        self.sidebar.failed.connect(self.show_error)
        c.conversationOpened.connect(lambda _id: self._update_state())
        self.picker.loadRequested.connect(self.load_pair)
        self.picker.manageRequested.connect(self.open_model_manager)
        e.loadStarted.connect(self._load_started)
        e.loadProgress.connect(self._load_progress)
        e.loaded.connect(self._loaded)
        e.loadFailed.connect(self._load_failed)
        self.load_banner.button.clicked.connect(e.cancel_load)
        self.spec_action.triggered.connect(self._spec_shortcut)
        self.spec_box.toggled.connect(self.set_speculative)
        self.k_box.currentIndexChanged.connect(self._k_changed)
        self.color_box.toggled.connect(self.set_color_tokens)
        self.compare_button.clicked.connect(lambda: self.open_compare())
        self.settings_button.clicked.connect(self.open_settings)
        self.chat_view.copied.connect(lambda msg: self.statusBar().showMessage(msg, 2500))
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.connect(self._scheme_changed)

    def _apply_settings_to_widgets(self) -> None:
        s = self.settings
        for w, v in ((self.spec_box, s.speculative), (self.color_box, s.color_tokens)):
            w.blockSignals(True)
            w.setChecked(v)
            w.blockSignals(False)
        self.k_box.blockSignals(True)
        self.k_box.setCurrentIndex(max(0, self.k_box.findData(s.k)))
        self.k_box.blockSignals(False)
        self.chat_view.delegate.set_color_tokens(s.color_tokens)

    # -- start / close -----------------------------------------------------
    def start(self) -> None:
        """Begin work that needs the running event loop: the lag monitor,
        the verdict check and the first load."""
        self.chat_view.delegate.warm_up()
        self.lag.start()
        self._lag_timer.start()
        if self.initial_pair is not None:
            target, draft = self.initial_pair
            self.picker.set_pair(target, draft)
            self.load_pair(target, draft)
        if self.db.notice:  # after load_pair, which clears the error line
            self.show_error(self.db.notice)

    def closeEvent(self, event) -> None:  # noqa: N802
        # A reply or load still finishing must not touch this window or its
        # database any more (the last periodic save of a reply stands).
        self.controller.blockSignals(True)
        self.engine.blockSignals(True)
        self.controller.stop()
        self.lag.stop()
        self._lag_timer.stop()
        self.save_settings()
        self.engine.close()
        self.db.close()  # after the queued writes, this last settings save included
        super().closeEvent(event)

    def save_settings(self) -> None:
        report_failure(self.db.settings.save(self.settings), self.show_error,
                       "save the settings")

    def update_settings(self, **changes) -> None:
        self.settings = replace(self.settings, **changes)
        self.save_settings()

    # -- state -------------------------------------------------------------------
    def _update_state(self) -> None:
        busy = self.controller.busy
        has_turn = any(m.role == "user" for m in self.chat_model.messages)
        self.composer.set_state(self.controller.generating,
                                self.engine.ready and not self.controller.opening, has_turn)
        self.picker.load_button.setEnabled(not busy and (
            self.picker.verdict is None or self.picker.verdict.compatible is not False))
        self.compare_button.setEnabled(self.engine.ready and not busy)
        pair = self.engine.pair
        can_spec = pair is not None and pair.speculative_ok
        self.spec_box.setEnabled(pair is None or can_spec)
        self.spec_action.setEnabled(pair is None or can_spec)
        self.k_box.setEnabled(pair is None or can_spec)
        if pair is not None and not pair.speculative_ok:
            self.spec_reason.setText("Speculative decoding is off for this pair: "
                                     + (pair.reason or "the pair cannot speculate."))
            self.spec_reason.show()
        else:
            self.spec_reason.hide()
        if not busy:
            self._preview_mode()

    def _preview_mode(self) -> None:
        """Before a reply, the gauges say how the next one will be decoded."""
        if self.engine.pair is not None and not self.gauges.values.steps:
            mode = decode_mode(self.settings, self.engine.pair)
            self.gauges.mode.value.setText(mode)

    def _show_lag(self) -> None:
        self.lag_status.setText(self.lag.stats(last_s=5).line())

    # -- chat actions ------------------------------------------------------------
    def send(self, text: str) -> None:
        self.error_banner.hide()
        if self.controller.send(text):
            self.composer.clear()
            self.chat_view.stick_to_bottom()
        self._update_state()

    def regenerate(self) -> None:
        self.error_banner.hide()
        self.controller.regenerate()
        self._update_state()

    def edit_last(self) -> None:
        text = self.controller.take_last_turn()
        if text is not None:
            self.composer.set_text(text)
        self._update_state()

    def show_error(self, message: str) -> None:
        self.error_banner.show_message(message)

    def open_conversation(self, conversation_id: int | None) -> None:
        self.controller.open(conversation_id)
        self.sidebar.select(conversation_id)
        self.gauges.show_values(self.gauges.values.__class__())
        self._update_state()

    def _conversation_deleted(self, conversation_id: int) -> None:
        if self.controller.conversation_id == conversation_id:
            self.open_conversation(None)

    def _conversations_changed(self) -> None:
        self.sidebar.current_id = self.controller.conversation_id
        self.sidebar.refresh()
        self._update_state()

    # -- speculative options -----------------------------------------------------
    def _spec_shortcut(self) -> None:
        if self.spec_box.isEnabled():
            self.spec_box.setChecked(not self.spec_box.isChecked())

    def set_speculative(self, on: bool) -> None:
        self.update_settings(speculative=on)
        self.statusBar().showMessage(
            f"Speculative decoding {'on' if on else 'off'}: applies to the next reply", 3000)
        self._preview_mode()

    def _k_changed(self, _i: int) -> None:
        self.update_settings(k=self.k_box.currentData())

    def set_color_tokens(self, on: bool) -> None:
        self.update_settings(color_tokens=on)
        self.chat_view.delegate.set_color_tokens(on)
        self.chat_model.refresh_all()

    # -- models --------------------------------------------------------------------
    def load_pair(self, target: str, draft: str | None) -> None:
        if self.controller.busy:
            self.show_error("Wait for the reply to finish (or stop it) before loading models.")
            return
        self.error_banner.hide()
        self.engine.load(target, draft)
        self._update_state()

    def _load_started(self, target: str, draft) -> None:
        what = target + (f" + {draft}" if draft else " (prompt lookup)")
        self.load_banner.show_message(f"Loading {what}…", None, progress=True)
        self.pair_status.setText("Loading…")

    def _load_progress(self, stage: str, message: str, fraction) -> None:
        self.load_banner.show_message(f"{stage}: {message}", fraction, progress=True)

    def _loaded(self, pair: LoadedPair) -> None:
        self.load_banner.hide()
        draft = pair.draft.name if pair.draft else "prompt lookup"
        self.setWindowTitle(f"SpecChat — {pair.target.name} + {draft}")
        c = pair.compute
        self.pair_status.setText(f"{pair.target.name} + {draft}  ·  {c.device} · {c.dtype} · "
                                 f"{c.blas}")
        self.update_settings(last_target=self.engine.target_ref,
                             last_draft=self.engine.draft_ref)
        self.picker.set_pair(self.engine.target_ref, self.engine.draft_ref)
        self._update_state()

    def _load_failed(self, message: str) -> None:
        self.load_banner.hide()
        if self.engine.load_cancelled:
            self.statusBar().showMessage("Loading cancelled.", 5000)
            self.picker.set_pair(*self.picker.selection())  # back to the verdict
        else:
            self.picker.show_refusal(message)
            self.show_error(message)
        self.pair_status.setText("No model loaded" if self.engine.pair is None else
                                 self.pair_status.text())
        self._update_state()

    def open_model_manager(self):
        from specchat.ui.model_manager import ModelManager

        dlg = ModelManager(self.engine.client, self)
        dlg.modelsChanged.connect(lambda: self.picker.reload_choices())
        dlg.show()
        self.model_manager = dlg
        return dlg

    # -- dialogs -------------------------------------------------------------------
    def open_compare(self, prompt: str | None = None):
        from specchat.ui.compare import CompareDialog

        if prompt is None:
            prompt = self.composer.edit.toPlainText().strip() or next(
                (m.text for m in reversed(self.chat_model.messages) if m.role == "user"), "")
        dlg = CompareDialog(self.controller, prompt, self)
        dlg.show()
        self.compare_dialog = dlg
        return dlg

    def open_settings(self) -> None:
        from specchat.ui.settings import SettingsDialog

        dlg = SettingsDialog(self.settings, self)
        if dlg.exec():
            self.settings = dlg.values()
            self.save_settings()
            self._preview_mode()

    def _scheme_changed(self, *_args) -> None:
        app = QApplication.instance()
        colors = theme.apply(app) if app is not None else theme.current()
        self.chat_view.delegate.set_colors(colors)
        self.chat_model.refresh_all()
