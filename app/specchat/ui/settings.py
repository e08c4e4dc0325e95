"""The settings dialog: system prompt, sampling and presets."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)

from specchat.store.settings import PRESETS, AppSettings, apply_preset, preset_of


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent=None):
        super().__init__(parent)
        self.setWindowTitle("SpecChat settings")
        self.setMinimumWidth(460)
        self._base = settings
        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setFixedHeight(90)
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, "Custom"])
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setToolTip("0 = greedy: the reply is exactly what the target alone "
                                    "would write, with or without speculation")
        self.top_p = QDoubleSpinBox(minimum=0.05, maximum=1.0, singleStep=0.05, decimals=2)
        self.top_k = QSpinBox(minimum=0, maximum=1000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, singleStep=64)
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1)
        self.seed.setSpecialValueText("random")
        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Preset", self.preset)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_tokens)
        form.addRow("Seed", self.seed)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(buttons)
        self._show(settings)
        self.preset.activated.connect(self._preset_chosen)
        for w in (self.temperature, self.top_p):
            w.valueChanged.connect(self._sync_preset)
        self.top_k.valueChanged.connect(self._sync_preset)

    def _show(self, s: AppSettings) -> None:
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.max_tokens.setValue(s.max_tokens)
        self.seed.setValue(-1 if s.seed is None else s.seed)
        self._sync_preset()

    def _preset_chosen(self, i: int) -> None:
        name = self.preset.itemText(i)
        if name in PRESETS:
            self._show(apply_preset(self.values(), name))

    def _sync_preset(self, *_args) -> None:
        name = preset_of(self.values()) or "Custom"
        self.preset.blockSignals(True)
        self.preset.setCurrentText(name)
        self.preset.blockSignals(False)

    def edited(self) -> dict:
        """What this dialog edits, as AppSettings fields: the window hands
        them to ``AppSession.update_settings``, so settings changed elsewhere
        meanwhile (the last pair) stay as they are."""
        return dict(system_prompt=self.system.toPlainText(),
                    temperature=round(self.temperature.value(), 3),
                    top_p=round(self.top_p.value(), 3), top_k=self.top_k.value(),
                    max_tokens=self.max_tokens.value(),
                    seed=None if self.seed.value() < 0 else self.seed.value())

    def values(self) -> AppSettings:
        return replace(self._base, **self.edited())
