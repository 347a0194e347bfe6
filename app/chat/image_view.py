"""Images on screen (issue 32): thumbnails, the full-size viewer, clipboard images as bytes.

Pixels come from ``app.chat.images`` (decoded by Pillow, EXIF rotation and alpha already
applied), so what the user sees is what the model gets; Qt only paints them. Qt's own image
readers are used for one thing: a pasted clipboard image (a ``QImage``) is saved as PNG bytes,
which then go through the same decoding and limits as a file.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QImage, QPixmap
from PySide6.QtWidgets import (QDialog, QLabel, QScrollArea, QToolButton, QVBoxLayout,
                               QWidget)

from app.chat.images import decoded, describe, thumbnail
from app.db import Attachment

THUMB = 56          # composer thumbnails (px)
MESSAGE_THUMB = 160  # thumbnails in a sent message


def to_qimage(pixels: np.ndarray) -> QImage:
    """A QImage that owns a copy of (h, w, 3) uint8 RGB ``pixels``."""
    h, w, _ = pixels.shape
    data = np.ascontiguousarray(pixels)
    return QImage(data.tobytes(), w, h, 3 * w, QImage.Format.Format_RGB888).copy()


def png_bytes(image: QImage) -> bytes:
    """A clipboard or dropped ``QImage`` as PNG file bytes."""
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    return bytes(QByteArray(buf.data()).data())


def thumb_pixmap(a: Attachment, box: int) -> QPixmap:
    return QPixmap.fromImage(to_qimage(thumbnail(a.data, box)))


class ImageThumb(QToolButton):
    """An image attachment's thumbnail; ``clicked`` is wired by its owner (remove it in the
    composer, open it full size in a message)."""

    def __init__(self, a: Attachment, box: int, *, text: str = "",
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.attachment = a
        self.setObjectName("imageThumb")
        pix = thumb_pixmap(a, box)
        self.setIcon(QIcon(pix))
        self.setIconSize(pix.size())
        if text:
            self.setText(text)
            self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        else:
            self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.setAutoRaise(True)
        # a neutral frame: a dark screenshot stays visible on the dark theme, a white one on
        # the light theme
        self.setStyleSheet("QToolButton#imageThumb { border: 1px solid rgba(128, 128, 128, 0.6);"
                           " border-radius: 4px; padding: 2px; }")
        self.setCursor(Qt.CursorShape.PointingHandCursor)


class ImageViewer(QDialog):
    """One image at full size (scrolls when larger than the screen allows)."""

    def __init__(self, a: Attachment, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageViewer")
        self.setWindowTitle(describe(a))
        self.image = to_qimage(decoded(a.data).pixels)
        self.label = QLabel(self)
        self.label.setPixmap(QPixmap.fromImage(self.image))
        self.label.setAccessibleName(f"Image {a.name}")
        scroll = QScrollArea(self)
        scroll.setWidget(self.label)
        scroll.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(scroll)
        screen = QGuiApplication.primaryScreen()
        avail = screen.availableGeometry().size() * 0.9 if screen is not None else None
        w, h = self.image.width() + 24, self.image.height() + 24
        if avail is not None:
            w, h = min(w, avail.width()), min(h, avail.height())
        self.resize(max(w, 200), max(h, 150))
