"""Draw MTP Chat's 1024x1024 app icon (``packaging/icon/icon.png``) with QPainter.

A macOS-style rounded square with an indigo-to-teal gradient holds a white chat bubble.
Inside the bubble, "text" lines are rows of tokens: verified tokens are solid indigo, and
the last line ends in a stack of draft tokens (the MTP head's guesses) that fade out as
they run ahead -- the app's idea in one picture.

    QT_QPA_PLATFORM=offscreen python packaging/icon/draw_icon.py [OUT.png]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPointF, QRectF, Qt  # noqa: E402
from PySide6.QtGui import (  # noqa: E402
    QColor, QGuiApplication, QImage, QLinearGradient, QPainter, QPainterPath, QPen,
)

SIZE = 1024
INDIGO = QColor("#4F46E5")
VIOLET = QColor("#7C3AED")
TEAL = QColor("#14B8A6")
DRAFT = QColor("#0EA5A4")
OUT = Path(__file__).with_name("icon.png")


def _rounded(rect: QRectF, radius: float) -> QPainterPath:
    path = QPainterPath()
    path.addRoundedRect(rect, radius, radius)
    return path


def _soft_shadow(p: QPainter, path: QPainterPath, *, dy: float, blur: int, alpha: int) -> None:
    """A blurred drop shadow: paint the shape small, scale it up smoothly (a cheap blur)."""
    small = max(8, SIZE // blur)
    mask = QImage(small, small, QImage.Format.Format_ARGB32_Premultiplied)
    mask.fill(Qt.GlobalColor.transparent)
    mp = QPainter(mask)
    mp.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    mp.scale(small / SIZE, small / SIZE)
    mp.translate(0, dy)
    mp.setPen(Qt.PenStyle.NoPen)
    mp.setBrush(QColor(0, 0, 0, alpha))
    mp.drawPath(path)
    mp.end()
    p.drawImage(QRectF(0, 0, SIZE, SIZE), mask.scaled(
        SIZE, SIZE, Qt.AspectRatioMode.IgnoreAspectRatio, Qt.TransformationMode.SmoothTransformation))


def draw_background(p: QPainter) -> None:
    body = QRectF(100, 100, 824, 824)  # Apple's macOS icon grid: 824 pt body, 100 pt margin
    path = _rounded(body, 185)
    _soft_shadow(p, path, dy=16, blur=24, alpha=110)
    grad = QLinearGradient(body.topLeft(), body.bottomRight())
    grad.setColorAt(0.0, VIOLET)
    grad.setColorAt(0.45, INDIGO)
    grad.setColorAt(1.0, TEAL)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawPath(path)
    gloss = QLinearGradient(body.topLeft(), QPointF(body.left(), body.center().y()))
    gloss.setColorAt(0.0, QColor(255, 255, 255, 46))
    gloss.setColorAt(1.0, QColor(255, 255, 255, 0))
    p.setBrush(gloss)
    p.drawPath(path)


def bubble_path() -> QPainterPath:
    bubble = _rounded(QRectF(196, 250, 632, 452), 118)
    tail = QPainterPath()
    tail.moveTo(300, 660)
    tail.cubicTo(300, 740, 262, 790, 206, 820)
    tail.cubicTo(310, 812, 384, 772, 424, 690)
    tail.closeSubpath()
    return bubble.united(tail)


def draw_bubble(p: QPainter) -> None:
    path = bubble_path()
    _soft_shadow(p, path, dy=14, blur=32, alpha=80)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor("#FFFFFF"))
    p.drawPath(path)


def _pill(p: QPainter, x: float, y: float, w: float, color: QColor, *, dashed: bool = False) -> None:
    rect = QRectF(x, y, w, 62)
    if dashed:
        fill = QColor(color)
        fill.setAlpha(color.alpha() // 3)
        p.setBrush(fill)
        pen = QPen(color, 9, Qt.PenStyle.DashLine, Qt.PenCapStyle.RoundCap)
        pen.setDashPattern([1.6, 1.4])
        p.setPen(pen)
    else:
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(color)
    p.drawRoundedRect(rect, 31, 31)


def draw_tokens(p: QPainter) -> None:
    verified = QColor(INDIGO)
    _pill(p, 276, 336, 250, verified)            # line 1: verified tokens
    _pill(p, 546, 336, 200, verified)
    _pill(p, 276, 450, 150, verified)            # line 2: verified, then drafts
    # Draft tokens stacked like cards, each a step further ahead and fainter.
    steps = [(0, 0, 235), (84, -20, 150), (168, -40, 80)]
    for dx, dy, alpha in reversed(steps):
        c = QColor(DRAFT)
        c.setAlpha(alpha)
        _pill(p, 446 + dx, 450 + dy, 130, c, dashed=dx > 0)
    _pill(p, 276, 564, 330, QColor(INDIGO.red(), INDIGO.green(), INDIGO.blue(), 90))  # line 3: to come


def render(size: int = SIZE) -> QImage:
    img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    img.fill(Qt.GlobalColor.transparent)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    p.scale(size / SIZE, size / SIZE)
    draw_background(p)
    draw_bubble(p)
    draw_tokens(p)
    p.end()
    return img


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # fonts/paint need an app
    img = render().convertToFormat(QImage.Format.Format_ARGB32)
    if not img.save(str(out), "PNG"):
        print(f"could not write {out}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({img.width()}x{img.height()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
