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

from specchat import origins


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
    error: QColor
    warning_bg: QColor
    border: QColor


# Every colour as (light, dark), side by side, so that one is changed while
# looking at the other.
_PALETTE: dict[str, tuple[str, str]] = {
    "window": ("#f6f7f9", "#1b1d21"),
    "surface": ("#ffffff", "#24272c"),
    "text": ("#1d2126", "#e6e8eb"),
    "muted": ("#6b7280", "#9aa1ab"),
    "accent": ("#2f6fde", "#6ea0ff"),
    "user_bubble": ("#dbe8ff", "#2c3f63"),
    "user_text": ("#10213f", "#e9f0ff"),
    "assistant_bubble": ("#ffffff", "#2a2d33"),
    "code_bg": ("#f1f3f6", "#1e2024"),
    "code_header": ("#6b7280", "#9aa1ab"),
    "link": ("#2f6fde", "#8db4ff"),
    "error": ("#b3261e", "#ff8a80"),
    "warning_bg": ("#fff4d6", "#4a3b12"),
    "border": ("#dfe3e8", "#3a3e45"),
}

LIGHT = Colors(dark=False, **{name: QColor(pair[0]) for name, pair in _PALETTE.items()})
DARK = Colors(dark=True, **{name: QColor(pair[1]) for name, pair in _PALETTE.items()})


def origin_color(colors: Colors, origin: str) -> QColor | None:
    """Colour tokens' tint for a token's origin (specchat/origins.py, where
    each drafter's origin declares it): None for the target's own tokens and
    for an origin this version does not know."""
    tint = origins.get(origin).tint[1 if colors.dark else 0]
    return QColor(tint) if tint else None


def origin_swatches(colors: Colors) -> str:
    """Stylesheet rules giving each origin's legend swatch its tint
    (``#OriginSwatch[origin="<name>"]``)."""
    return "".join(f'\n#OriginSwatch[origin="{o.name}"] {{ background: {c.name()}; }}'
                   for o in origins.ORIGINS.values()
                   if (c := origin_color(colors, o.name)) is not None)


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
    for role in (roles.Text, roles.ButtonText, roles.WindowText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, colors.muted)
    return pal


def stylesheet(colors: Colors) -> str:
    qss = resources.files("specchat").joinpath("resources/styles/app.qss").read_text("utf-8")
    # Longest names first so "@user_bubble" is not eaten by "@user".
    for f in sorted(fields(Colors), key=lambda f: -len(f.name)):
        value = getattr(colors, f.name)
        if isinstance(value, QColor):
            qss = qss.replace("@" + f.name, value.name())
    return qss + origin_swatches(colors)


def apply(app) -> Colors:
    """Set palette and stylesheet for the current system scheme."""
    colors = current()
    app.setPalette(palette_for(colors))
    app.setStyleSheet(stylesheet(colors))
    return colors
