"""What happens when a link in a model's reply is clicked.

A reply is untrusted text: a model (or a prompt it was shown) can write
``[docs](file:///home/me/.ssh/id_rsa)``, ``javascript:``, ``smb://`` or a
custom scheme that some other program registered. Only http and https links
with a host go to the browser; anything else is not opened, and the view
shows the one line ``open_link`` returns instead. The chat and Compare both
call ``follow``, so they cannot disagree; it also serves the Copy link over
each code block.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication

from specchat.ui.markdown import COPY_SCHEME

OPENABLE = ("http", "https")
CODE_COPIED = "Code copied to the clipboard"


def openable(href: str) -> bool:
    url = QUrl(href, QUrl.ParsingMode.StrictMode)
    return url.isValid() and url.scheme().lower() in OPENABLE and bool(url.host())


def open_link(href: str) -> str:
    """Open ``href`` in the browser if it is an http(s) link; the status
    line to show either way."""
    if openable(href):
        QDesktopServices.openUrl(QUrl(href, QUrl.ParsingMode.StrictMode))
        return f"Opened {_shown(href)} in the browser"
    return f"Link not opened: only http and https links open from a reply ({_shown(href)})"


def follow(href: str, code_blocks: Sequence[str]) -> str:
    """A click on ``href`` in a rendered reply whose code blocks are
    ``code_blocks``: a Copy link copies its block, any other link goes to
    ``open_link``. The status line to show; "" for a Copy link to no block."""
    if href.startswith(COPY_SCHEME):
        n = href[len(COPY_SCHEME):]
        if not (n.isdigit() and int(n) < len(code_blocks)):
            return ""
        QGuiApplication.clipboard().setText(code_blocks[int(n)])
        return CODE_COPIED
    return open_link(href)


def _shown(href: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in href)
    return text if len(text) <= 80 else text[:77] + "..."
