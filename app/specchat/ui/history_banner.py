"""The line that says when chats are not being saved, and why.

Three cases, each the session's (ui/session.py): a write is waiting for
another program's lock (it will be retried, nothing to do), the history is
a newer version's file (shown read-only), or it could not be opened at all
(then Retry opens it again). Hidden while everything is saved.
"""

from __future__ import annotations

from specchat.ui.banner import Banner
from specchat.ui.session import AppSession

WAITING = ("Saving is waiting: the history is locked by another program; "
           "will retry until it is free.")
NOT_SAVED = "Chatting works, but nothing is saved until it opens."


class HistoryBanner(Banner):
    def __init__(self, session: AppSession, parent=None):
        super().__init__("HistoryBanner", closable=False, parent=parent)
        self.session = session
        self.button.setText("Retry")
        self.button.setToolTip("Open the conversation history again")
        self.button.clicked.connect(self.retry)
        session.historyChanged.connect(self.follow)
        self.follow()

    def follow(self) -> None:
        s = self.session
        self.button.setEnabled(True)
        if not (s.history_problem or s.saving_waits):
            self.hide()
            return
        retry = bool(s.history_problem) and s.history_retryable  # Retry only where it can help
        self.button.setVisible(retry)
        self.show_message(f"{s.history_problem} {NOT_SAVED}" if retry
                          else s.history_problem or WAITING)

    def retry(self) -> None:
        self.button.setEnabled(False)  # until the attempt ends (historyChanged)
        self.label.setText("Opening the conversation history again…")
        self.session.retry_history()
