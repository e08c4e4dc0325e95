"""The app as a person sees it, saved: the real window mid-reply with Colour
tokens on and the charts showing, written to docs/screenshots/ci-main-window.png
on every run (CI keeps it as an artifact). It is driven by the same code as
benchmarks/screenshot.py, which takes the README's picture with real models."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
from PySide6.QtGui import QImage
from specchat.ui import theme
from ui_support import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHOT = ROOT / "docs" / "screenshots" / "ci-main-window.png"


def _screenshot_script():
    spec = importlib.util.spec_from_file_location("screenshot", ROOT / "benchmarks" /
                                                  "screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pixels(path: Path) -> np.ndarray:
    img = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB32)
    rows = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine()).copy()
    return rows[:, :img.width() * 4].reshape(img.height(), img.width(), 4)[..., 2::-1]  # RGB


def _shows(pixels: np.ndarray, color, tolerance: int = 0) -> bool:
    rgb = np.array((color.red(), color.green(), color.blue()), np.int16)
    return bool((np.abs(pixels.astype(np.int16) - rgb) <= tolerance).all(axis=-1).any())


def _area(pixels: np.ndarray, window, widget) -> np.ndarray:
    """The pixels of ``widget`` in a picture of ``window``."""
    top_left = widget.mapTo(window, widget.rect().topLeft())
    x, y = top_left.x(), top_left.y()
    return pixels[y:y + widget.height(), x:x + widget.width()]


def test_screenshot_mid_reply_with_colour_tokens_and_charts(qtbot, window, tiny_target,
                                                            tiny_draft):
    shoot = _screenshot_script().shoot
    task = asyncio.ensure_future(shoot(window, str(tiny_target), str(tiny_draft), SHOT,
                                       prompt="def fibonacci(n): def fibonacci(n):",
                                       max_tokens=1500, after_chars=300, plain_tokens=24,
                                       timeout=60))
    wait_until(task.done, timeout=90_000)
    shown = task.result()
    assert shown["streaming"] and shown["chars"] >= 300  # caught mid-reply
    assert SHOT.stat().st_size > 20_000
    img = QImage(str(SHOT))
    assert (img.width(), img.height()) == (window.width(), window.height())
    # What the picture must show: tinted tokens in the chat, the legend over
    # it, and the charts under the gauges (a speed line in the accent colour).
    pixels = _pixels(SHOT)
    colors = window.chat_view.delegate.colors
    chat = _area(pixels, window, window.chat_view)
    drafted = [o for o in shown["origins"] if o != "target"]
    assert drafted
    for origin in drafted:
        assert _shows(chat, theme.origin_color(colors, origin)), origin
    legend = _area(pixels, window, window.options.legend)
    assert all(_shows(legend, theme.origin_color(colors, o))
               for o in ("draft", "conversation", "history"))
    assert window.gauges.charts.isVisible()
    assert _shows(_area(pixels, window, window.gauges.charts.speed), colors.accent, 24)
    # The settings it changed are back (the fixture's short replies).
    assert window.session.settings.max_tokens == 48 and not window.session.settings.color_tokens
