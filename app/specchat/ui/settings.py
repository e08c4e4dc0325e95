"""The settings dialog: system prompt, sampling and presets, speculation
auto-off, and the local server (an OpenAI-compatible API on this computer,
docs/api.md) with the web origins allowed to call it.

Every number is a ``ValueEdit`` checked against ``specchat.values``: a value
out of range shows its one line under the form and the dialog cannot be
accepted until it is fixed, so what is saved is what the engine accepts.
The port is a spin box: its whole range (0 to 65535) is valid.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSignalBlocker
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
)

from specchat import values
from specchat.store.settings import PRESETS, AppSettings, preset_of
from specchat.ui.value_edit import ValueEdit
from specchat.ui.widgets import label, vbox

# The number fields, in form order: (AppSettings field, which is also the
# dialog's attribute; its entry in specchat.values; its row's label).
NUMBERS = (("temperature", "temperature", "Temperature"), ("top_p", "top-p", "Top-p"),
           ("top_k", "top-k", "Top-k"), ("max_tokens", "max tokens", "Max new tokens"),
           ("seed", "seed", "Seed"))


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Settings — SpecChat")
        self.setMinimumWidth(460)
        self._base = settings
        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setFixedHeight(90)
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, "Custom"])
        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Preset", self.preset)
        for key, name, text in NUMBERS:  # self.temperature, ..., self.seed
            setattr(self, key, ValueEdit(name, blank="random" if key == "seed" else ""))
            form.addRow(text, getattr(self, key))
        self.numbers = tuple(getattr(self, key) for key, _, _ in NUMBERS)
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
                                      "computer (OpenAI-compatible API)")
        self.local_server.setChecked(settings.local_server)
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")  # shown for 0
        self.port.setValue(settings.server_port)
        self.port.setToolTip("Clients use http://127.0.0.1:<port>/v1; only programs on this "
                             "computer can connect")
        self.cors_origins = QLineEdit(" ".join(settings.server_cors_origins))
        self.cors_origins.setPlaceholderText("none: no web page may call it")
        self.cors_origins.setToolTip(
            "Web pages (origins such as http://localhost:5173) allowed to call the local "
            "server from a browser, separated by spaces. Programs that are not browsers need "
            "none; any other page is refused.")
        form.addRow("Local server", self.local_server)
        form.addRow("Port", self.port)
        form.addRow("Allowed web origins", self.cors_origins)
        self.error = label(name="ErrorBanner", wrap=True)  # the first bad value's one line
        self.error.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        vbox(form, self.error, self.buttons, parent=self)
        self._show(settings)
        self.preset.activated.connect(self._preset_chosen)
        for w in self.numbers:
            w.valueChanged.connect(self._edited)
        self.cors_origins.textChanged.connect(self._edited)
        self._edited()

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
