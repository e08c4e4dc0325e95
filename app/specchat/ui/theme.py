"""Light and dark colours, following the system.

Qt 6.5+ reports the system scheme through ``QStyleHints.colorScheme()`` and
signals changes; the widgets take the application palette, and the chat
delegate and the stylesheet (resources/styles/app.qss, with ``@name``
placeholders) take the colours below.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette


@dataclass(frozen=True)
class Colors:
    dark: bool
    window: QColor
    surface: QColor
    text: QColor
    muted: QColor
    accent: QColor
    user_bubble: QColor
    user_text: QColor
    assistant_bubble: QColor
    code_bg: QColor
    code_header: QColor
    link: QColor
    draft_token: QColor
    error: QColor
    warning_bg: QColor
    border: QColor


def _c(hex_: str) -> QColor:
    return QColor(hex_)


LIGHT = Colors(
    dark=False, window=_c("#f6f7f9"), surface=_c("#ffffff"), text=_c("#1d2126"),
    muted=_c("#6b7280"), accent=_c("#2f6fde"), user_bubble=_c("#dbe8ff"),
    user_text=_c("#10213f"), assistant_bubble=_c("#ffffff"), code_bg=_c("#f1f3f6"),
    code_header=_c("#6b7280"), link=_c("#2f6fde"), draft_token=_c("#c8f0cf"),
    error=_c("#b3261e"), warning_bg=_c("#fff4d6"), border=_c("#dfe3e8"),
)

DARK = Colors(
    dark=True, window=_c("#1b1d21"), surface=_c("#24272c"), text=_c("#e6e8eb"),
    muted=_c("#9aa1ab"), accent=_c("#6ea0ff"), user_bubble=_c("#2c3f63"),
    user_text=_c("#e9f0ff"), assistant_bubble=_c("#2a2d33"), code_bg=_c("#1e2024"),
    code_header=_c("#9aa1ab"), link=_c("#8db4ff"), draft_token=_c("#245c33"),
    error=_c("#ff8a80"), warning_bg=_c("#4a3b12"), border=_c("#3a3e45"),
)


def system_is_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def current() -> Colors:
    return DARK if system_is_dark() else LIGHT


def palette_for(colors: Colors) -> QPalette:
    pal = QPalette()
    roles = QPalette.ColorRole
    pal.setColor(roles.Window, colors.window)
    pal.setColor(roles.Base, colors.surface)
    pal.setColor(roles.AlternateBase, colors.window)
    pal.setColor(roles.Button, colors.surface)
    pal.setColor(roles.Text, colors.text)
    pal.setColor(roles.WindowText, colors.text)
    pal.setColor(roles.ButtonText, colors.text)
    pal.setColor(roles.PlaceholderText, colors.muted)
    pal.setColor(roles.Highlight, colors.accent)
    pal.setColor(roles.HighlightedText, QColor("#ffffff"))
    pal.setColor(roles.Link, colors.link)
    pal.setColor(roles.ToolTipBase, colors.surface)
    pal.setColor(roles.ToolTipText, colors.text)
    pal.setColor(QPalette.ColorGroup.Disabled, roles.Text, colors.muted)
    pal.setColor(QPalette.ColorGroup.Disabled, roles.ButtonText, colors.muted)
    pal.setColor(QPalette.ColorGroup.Disabled, roles.WindowText, colors.muted)
    return pal


def stylesheet(colors: Colors) -> str:
    qss = resources.files("specchat").joinpath("resources/styles/app.qss").read_text("utf-8")
    # Longest names first so "@user_bubble" is not eaten by "@user".
    for f in sorted(fields(Colors), key=lambda f: -len(f.name)):
        value = getattr(colors, f.name)
        if isinstance(value, QColor):
            qss = qss.replace("@" + f.name, value.name())
    return qss


def apply(app) -> Colors:
    """Set palette and stylesheet for the current system scheme."""
    colors = current()
    app.setPalette(palette_for(colors))
    app.setStyleSheet(stylesheet(colors))
    return colors
