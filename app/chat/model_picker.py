"""The model picker above the conversation: which model, is it loaded, can it speculate.

Lists what the model store says can be loaded (the embedded demo model first, then installed
models of the user's chosen store folder; never a download in progress or a folder that fails
validation), the models of saved server connections ("remote", with their host: paths made by
``app.remote.connections.remote_path``) and the current model; "Open model folder…" picks any
folder, "Connect to a server…" asks for one.
Signals: ``load_requested(str path)``, ``connect_requested()``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlsplit

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QWidget,
)

from app.remote.connections import ConnectionStore, is_remote, parse_remote_path, remote_path
from engine.hub.store import Store
from engine.paths import store_root

log = logging.getLogger(__name__)
_OPEN = "__open__"
_CONNECT = "__connect__"


def loadable_models() -> list[tuple[str, str]]:
    """(label, folder) of every model the store offers for loading, the demo model first."""
    try:
        rows = Store().loadable()
    except OSError as exc:  # an unreadable store folder: the demo and "Open…" still work
        log.warning("cannot list the model store: %s", exc)
        from engine.resources import default_model_path

        demo = default_model_path()
        return [(f"Demo model ({demo.name})", str(demo))]
    return [(f"Demo model ({r.name})" if r.status == "builtin" else r.name, r.path) for r in rows]


def remote_models() -> list[tuple[str, str]]:
    """(label, path) of every model of the saved server connections."""
    try:
        conns = ConnectionStore().load()
    except OSError as exc:  # no config folder: local models still work
        log.warning("cannot list the saved servers: %s", exc)
        return []
    return [(f"{m} — {c.host} (remote)", remote_path(c, m)) for c in conns for m in c.models]


def describe_capability(info) -> str:
    if info is None:
        return ""
    if is_remote(info.path):
        host = urlsplit(parse_remote_path(info.path)[0]).netloc
        return f"remote · {host}" + (" · MTP" if info.has_mtp else "")
    if not info.has_mtp:
        return "no MTP"
    return f"MTP · ≤{info.max_depth} drafts"


class FittingCombo(QComboBox):
    """A combo box as wide as its longest entry where there is room, narrower (down to
    ``minimumContentsLength`` characters, the current entry elided with "…") where not."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        base = super().sizeHint()
        fm = self.fontMetrics()
        widest = max((fm.horizontalAdvance(self.itemText(i)) for i in range(self.count())),
                     default=0)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        size = self.style().sizeFromContents(QStyle.ContentsType.CT_ComboBox, opt,
                                             QSize(widest + 4, fm.height()), self)
        return QSize(max(base.width(), size.width()), base.height())

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        p = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        p.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        opt.currentText = self.fontMetrics().elidedText(opt.currentText,
                                                        Qt.TextElideMode.ElideRight, field.width())
        p.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)


class ModelPicker(QWidget):
    load_requested = Signal(str)
    connect_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.combo = FittingCombo(self)
        self.combo.setAccessibleName("Model")
        self.combo.setToolTip("The model this window chats with")
        self.combo.setMinimumContentsLength(12)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.activated.connect(self._on_activated)
        self.badge = QLabel("", self)
        self.badge.setObjectName("mtpBadge")
        self.badge.setAccessibleName("Model capability")
        self.badge.hide()
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(120)
        self.progress.setAccessibleName("Loading progress")
        self.progress.hide()
        self.status = QLabel("", self)
        self.status.setObjectName("muted")
        self.status.setAccessibleName("Model status")
        # never widens the header: a narrow window shows less of it, not a clipped panel
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        lay.addWidget(self.combo, 0)
        lay.addWidget(self.badge)
        lay.addWidget(self.progress)
        lay.addWidget(self.status, 1)
        lay.addStretch(0)  # room left over stays beside the picker, not inside it
        self.current_path: str | None = None
        self.info = None
        self.refresh()

    def refresh(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        for label, path in loadable_models() + remote_models():
            self.combo.addItem(label, path)
        if self.current_path and self.combo.findData(self.current_path) < 0:
            name = (parse_remote_path(self.current_path)[1] if is_remote(self.current_path)
                    else Path(self.current_path).name)
            self.combo.addItem(name, self.current_path)
        self.combo.addItem("Open model folder…", _OPEN)
        self.combo.addItem("Connect to a server…", _CONNECT)
        if self.current_path:
            self.combo.setCurrentIndex(max(0, self.combo.findData(self.current_path)))
        self.combo.blockSignals(False)
        self._sync_tooltip()
        self.combo.updateGeometry()

    def _sync_tooltip(self) -> None:
        """The full name of the model (the combo may show it elided)."""
        name = self.combo.currentText() if self.current_path else ""
        if self.info is not None and self.info.name not in name:
            name = f"{name} — {self.info.name}"
        self.combo.setToolTip(f"{name}\nThe model this window chats with" if name
                              else "The model this window chats with")

    def _on_activated(self, index: int) -> None:
        path = self.combo.itemData(index)
        if path == _CONNECT:
            self.refresh()
            self.connect_requested.emit()
            return
        if path == _OPEN:
            path = QFileDialog.getExistingDirectory(self, "Open a model folder", str(store_root()))
            if not path:
                self.refresh()
                return
        if path and path != self.current_path or self.info is None:
            self.load_requested.emit(path)

    def set_loading(self, path: str, text: str) -> None:
        self.current_path = str(path)
        self.info = None
        self.refresh()
        self.badge.hide()
        self.progress.show()
        self.status.setText(text)
        self.status.show()

    def set_loaded(self, info) -> None:
        self.info = info
        self.current_path = info.path
        self.refresh()
        self.progress.hide()
        self.badge.setText(describe_capability(info))
        self.badge.setToolTip(
            "Served by another machine" if is_remote(info.path) else
            "Drafts tokens with its multi-token-prediction heads" if info.has_mtp else
            "No MTP heads: plain decoding only")
        self.badge.show()
        # the name is the picker's own entry (and its tooltip): no second label beside it
        self.status.setText(info.name)
        self.status.setToolTip("")
        self.status.hide()
        self._sync_tooltip()

    def set_failed(self, message: str) -> None:
        self.info = None
        self.progress.hide()
        self.badge.hide()
        self.status.setText(message)
        self.status.setToolTip(message)
        self.status.show()
