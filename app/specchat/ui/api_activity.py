"""The status bar's API line: what the local server is doing ("API:
generating for <model> · 42 tokens", "API: idle"), hidden while it is off.
API requests never appear in the chat; this line is where they show."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from specchat.ui.local_api import LocalApi


class ApiActivityLabel(QLabel):
    def __init__(self, api: LocalApi, parent=None):
        super().__init__("", parent)
        self.setObjectName("ApiActivity")
        self._api = api
        api.activityChanged.connect(self._show)
        self._show(api.text)

    def _show(self, text: str) -> None:
        self.setText(text)
        self.setToolTip(f"Local OpenAI-compatible server on {self._api.url}" if text else "")
        self.setVisible(bool(text))
