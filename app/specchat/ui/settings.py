"""The settings dialog: system prompt, sampling and presets, speculation
auto-off, and the local server (an OpenAI-compatible API on this computer,
docs/api.md) with the web origins allowed to call it, the endpoints it
serves and the engine's prompt cache (its budget, and what it holds:
ui/server_pane.py).

Every number is a ``ValueEdit`` checked against ``specchat.values``: a value
out of range shows its one line under the form and the dialog cannot be
accepted until it is fixed, so what is saved is what the engine accepts.
The port is a spin box: its whole range (0 to 65535) is valid.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSignalBlocker
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
)

from specchat import values
from specchat.server import DEFAULT_HOST
from specchat.server.endpoints import base_url
from specchat.store.settings import PRESETS, AppSettings, preset_of
from specchat.ui.server_pane import CacheUseLabel, EndpointTable
from specchat.ui.value_edit import ValueEdit
from specchat.ui.widgets import button, hbox, label, vbox

# The number fields: (AppSettings field, which is also the dialog's
# attribute; its entry in specchat.values; its row's label). The sampling
# ones in the form's order, then the local server's.
SAMPLING = (("temperature", "temperature", "Temperature"), ("top_p", "top-p", "Top-p"),
            ("top_k", "top-k", "Top-k"), ("max_tokens", "max tokens", "Max new tokens"),
            ("seed", "seed", "Seed"))
NUMBERS = (*SAMPLING, ("prompt_cache_gb", "prompt cache", "Prompt cache"))


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent=None, session=None):
        """``session``: the AppSession whose local server and engine the
        Local server section shows (the URL it runs on, the cache's use);
        without one, only the settings."""
        super().__init__(parent)
        self.setWindowTitle("Settings — SpecChat")
        self.setMinimumWidth(600)
        self._base = settings
        self.session = session
        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setFixedHeight(90)
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, "Custom"])
        for key, name, _ in NUMBERS:  # self.temperature, ..., self.prompt_cache_gb
            setattr(self, key, ValueEdit(name, blank="random" if key == "seed" else ""))
        self.numbers = tuple(getattr(self, key) for key, _, _ in NUMBERS)
        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Preset", self.preset)
        for key, _, text in SAMPLING:
            form.addRow(text, getattr(self, key))
        self.temperature.setToolTip(
            self.temperature.toolTip() + ". 0 = greedy: the reply is exactly what the target "
            "alone would write, with or without speculation")
        self.auto_off = QCheckBox("Decode plainly while speculating is slower than plain here")
        self.auto_off.setChecked(settings.auto_off)
        self.auto_off.setToolTip(
            "Speculation auto-off: when drafting is measured to slow a reply down on this "
            "machine (a busy CPU, a poor draft), decode plainly and try speculation again now "
            "and then. Only the speed changes. Seeded sampling and a fixed K never pause, "
            "so those replies stay reproducible.")
        form.addRow("Auto-off", self.auto_off)
        self.local_server = QCheckBox("Serve the loaded models to other programs on this "
                                      "computer")
        self.local_server.setToolTip(f"OpenAI's APIs and Anthropic's Messages API on "
                                     f"{DEFAULT_HOST}, while a pair is loaded (docs/api.md)")
        self.local_server.setChecked(settings.local_server)
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")  # shown for 0
        self.port.setValue(settings.server_port)
        self.port.setToolTip("Where clients connect (the base URL below); only programs on "
                             "this computer can")
        self.cors_origins = QLineEdit(" ".join(settings.server_cors_origins))
        self.cors_origins.setPlaceholderText("none: no web page may call it")
        self.cors_origins.setToolTip(
            "Web pages (origins such as http://localhost:5173) allowed to call the local "
            "server from a browser, separated by spaces. Programs that are not browsers need "
            "none; any other page is refused.")
        self.error = label(name="ErrorBanner", wrap=True)  # the first bad value's one line
        self.error.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        vbox(form, self._server_section(), self.error, self.buttons, parent=self)
        self._show(settings)
        self.preset.activated.connect(self._preset_chosen)
        for w in self.numbers:
            w.valueChanged.connect(self._edited)
        self.cors_origins.textChanged.connect(self._edited)
        self.port.valueChanged.connect(self._show_base_url)
        self._edited()
        self._show_base_url()
        if self.cache_use is not None:
            self.cache_use.refresh()

    def _server_section(self) -> QGroupBox:
        """Local server: the switch, its port and allowed origins, where it
        is reached (the base URL and each endpoint, copyable), and the
        engine's prompt cache (its budget; what it holds, with a session)."""
        box = QGroupBox("Local server")
        form = QFormLayout(box)
        form.addRow(self.local_server)
        form.addRow("Port", self.port)
        form.addRow("Allowed web origins", self.cors_origins)
        self.base_url = QLineEdit()
        self.base_url.setReadOnly(True)
        self.copy_base = button("Copy", "Copy the base URL (OpenAI's base_url)",
                                clicked=self._copy_base_url)
        form.addRow("Base URL", hbox(self.base_url, self.copy_base))
        self.endpoints = EndpointTable()
        form.addRow("Endpoints", self.endpoints)
        self.prompt_cache_gb.setToolTip(
            self.prompt_cache_gb.toolTip() + ". Clients that alternate conversations (an "
            "agent and its sub-agent, two editors) each find theirs here instead of having "
            "their prompt read again; the chat's conversations too")
        form.addRow("Prompt cache", hbox(self.prompt_cache_gb, label("GB")))
        self.cache_use = CacheUseLabel(self.session) if self.session is not None else None
        if self.cache_use is not None:
            form.addRow("", self.cache_use)
        return box

    def _show_base_url(self, *_args) -> None:
        """The running server's address; else the one the port would give."""
        session = self.session
        if (session is not None and session.api.running
                and self.port.value() == session.settings.server_port):
            url, tip = session.api.url, "The server runs here now."
        else:
            url = base_url(DEFAULT_HOST, self.port.value() or "<any free port>")
            tip = "Where the server listens once it is on and a pair is loaded."
        self.base_url.setText(url)
        self.base_url.setToolTip(tip)
        self.endpoints.set_base(url)

    def _copy_base_url(self) -> None:
        QGuiApplication.clipboard().setText(self.base_url.text())

    def _show(self, s: AppSettings) -> None:
        for key, _, _ in NUMBERS:
            getattr(self, key).setValue(getattr(s, key))
        self._sync_preset()

    def problem(self) -> str:
        """The first bad value's message, or "" when every value is good."""
        found = next((p for p in (w.problem() for w in self.numbers) if p), "")
        if found:
            return found
        try:
            self.origins()
        except values.BadValue as exc:
            return str(exc)
        return ""

    def origins(self) -> tuple[str, ...]:
        """The allowed web origins typed (spaces or commas between them), as
        ``values.origin`` keeps them; ``values.BadValue`` for the first bad one."""
        typed = self.cors_origins.text().replace(",", " ").split()
        return tuple(dict.fromkeys(values.origin(t) for t in typed))

    def _edited(self) -> None:
        problem = self.problem()
        self.error.setText(problem)
        self.error.setVisible(bool(problem))
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(not problem)
        self._sync_preset()

    def accept(self) -> None:
        if not self.problem():  # Enter in a field must not save a bad value either
            super().accept()

    def _preset_chosen(self, i: int) -> None:
        # A preset sets sampling only; the other fields stay as typed.
        for key, value in PRESETS.get(self.preset.itemText(i), {}).items():
            getattr(self, key).setValue(value)

    def _sync_preset(self, *_args) -> None:
        try:
            name = preset_of(self.values()) or "Custom"
        except values.BadValue:
            name = "Custom"
        with QSignalBlocker(self.preset):
            self.preset.setCurrentText(name)

    def edited(self) -> dict:
        """What this dialog edits, as AppSettings fields: the window hands
        them to ``AppSession.update_settings``, so settings changed elsewhere
        meanwhile (the last pair) stay as they are. ``values.BadValue`` while
        a value is out of range (the dialog cannot be accepted then)."""
        return dict(system_prompt=self.system.toPlainText(),
                    **{key: getattr(self, key).value() for key, _, _ in NUMBERS},
                    auto_off=self.auto_off.isChecked(), local_server=self.local_server.isChecked(),
                    server_port=self.port.value(), server_cors_origins=self.origins())

    def values(self) -> AppSettings:
        return replace(self._base, **self.edited())
