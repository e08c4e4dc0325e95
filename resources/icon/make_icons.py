"""Draw SpecChat's icon with QPainter and write the files Briefcase needs.

    QT_QPA_PLATFORM=offscreen python resources/icon/make_icons.py

Writes specchat-{16,32,64,128,256,512}.png (Linux, and the window icon) and
specchat.icns (macOS: PNG entries from 16 to 1024 px) next to this script.
The icon: a chat bubble whose line of "tokens" is partly green (accepted
draft tokens) and partly white (the target's own), on a blue-violet tile.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QLinearGradient, QPainter, QPainterPath

HERE = Path(__file__).resolve().parent
PNG_SIZES = (16, 32, 64, 128, 256, 512)
# ICNS entry types holding PNG data, by pixel size.
ICNS_TYPES = ((b"icp4", 16), (b"icp5", 32), (b"ic11", 32), (b"icp6", 64), (b"ic12", 64),
              (b"ic07", 128), (b"ic08", 256), (b"ic13", 256), (b"ic09", 512), (b"ic14", 512),
              (b"ic10", 1024))


def draw(size: int) -> QImage:
    img = QImage(size, size, QImage.Format.Format_ARGB32)
    img.fill(Qt.GlobalColor.transparent)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = size / 1024.0
    # macOS-style tile: 824 px square centred in 1024, radius ~185.
    tile = QRectF(100 * s, 100 * s, 824 * s, 824 * s)
    grad = QLinearGradient(tile.topLeft(), tile.bottomRight())
    grad.setColorAt(0.0, QColor("#3f7bf6"))
    grad.setColorAt(1.0, QColor("#7b4ae8"))
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawRoundedRect(tile, 185 * s, 185 * s)
    # The chat bubble with its tail.
    bubble = QPainterPath()
    bubble.addRoundedRect(QRectF(210 * s, 250 * s, 604 * s, 420 * s), 110 * s, 110 * s)
    tail = QPainterPath()
    tail.moveTo(QPointF(320 * s, 640 * s))
    tail.lineTo(QPointF(270 * s, 790 * s))
    tail.lineTo(QPointF(470 * s, 660 * s))
    tail.closeSubpath()
    p.setBrush(QColor(255, 255, 255, 245))
    p.drawPath(bubble.united(tail))
    # Two lines of tokens: green = accepted draft tokens, blue = target tokens.
    green, blue = QColor("#22b35e"), QColor("#3f6fe0")
    rows = ((360, ((290, 120, green), (425, 90, green), (530, 70, green), (615, 120, blue))),
            (490, ((290, 150, green), (455, 110, green), (580, 95, blue))))
    for y, tokens in rows:
        for x, w, color in tokens:
            p.setBrush(color)
            p.drawRoundedRect(QRectF(x * s, y * s, w * s, 70 * s), 30 * s, 30 * s)
    p.end()
    return img


def png_bytes(img: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")
    buf.close()
    return bytes(data)


def icns(images: dict[int, bytes]) -> bytes:
    body = b"".join(kind + struct.pack(">I", 8 + len(images[px])) + images[px]
                    for kind, px in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841
    images = {px: png_bytes(draw(px)) for px in {px for _, px in ICNS_TYPES} | set(PNG_SIZES)}
    for px in PNG_SIZES:
        (HERE / f"specchat-{px}.png").write_bytes(images[px])
    (HERE / "specchat.icns").write_bytes(icns(images))
    print(f"wrote {len(PNG_SIZES)} PNGs and specchat.icns to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
