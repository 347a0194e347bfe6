"""The model manager's "On this machine" tab: the models in MTP Chat's folder and those other
apps downloaded (the Hugging Face cache, LM Studio, MTPLX: ``engine.hub.local_models``), with
load, tune, open, import, "Add MTP head (N MB)" (``app.models.graft``) and delete; the model
the chat uses is shown in bold. It shows the tuner's run (``on_tune_progress``,
``on_tune_finished``, ``on_tune_failed``).

``InstalledPanel(parent, store=, total_memory=, scan_external=)``: ``refresh()``,
``refresh_external()`` (rescans on the thread pool), ``set_loaded_model(info)``,
``selected_model()``, ``select_model(name)``; ``ask(title, text)`` confirms a deletion (tests
replace it). Signals:
``load_requested(str path)``, ``tune_requested(str path)``, ``deleted()`` (a model was deleted),
``folder_change_requested()``. ``store`` is the models folder's; set it when it changes.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QMessageBox,
                               QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.models.graft import GraftBar, GraftJob, button_text
from app.models.jobs import run_in_pool
from app.models.panels import ask_yes_no, fmt_bytes, model_table
from engine.errors import EngineError
from engine.hub.store import Store

log = logging.getLogger(__name__)
INSTALLED_COLUMNS = ("Name", "Where", "Status", "Size", "Family", "Quantization", "MTP",
                     "Verdict", "Tuned depth", "Last used")


class InstalledPanel(QWidget):
    load_requested = Signal(str)
    tune_requested = Signal(str)
    deleted = Signal()
    folder_change_requested = Signal()

    def __init__(self, parent: QWidget | None = None, *, store: Store,
                 total_memory: int | None = None, scan_external: bool = True) -> None:
        super().__init__(parent)
        self.store = store
        self._total_memory = total_memory
        self._scan_external = scan_external
        self.external: list = []  # models found outside the store (engine.hub.local_models)
        self.installed: list = []
        self.loaded_path: str | None = None
        self._relays: list = []
        self._offers: dict[str, dict] = {}  # store models' MTP head offers, read online
        self.graft_job: GraftJob | None = None
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        self.folder_label = QLabel("", self)
        self.folder_label.setAccessibleName("Models folder")
        change = QPushButton("Change folder…", self)
        change.clicked.connect(lambda _checked=False: self.folder_change_requested.emit())
        refresh = QPushButton("Refresh", self)
        refresh.clicked.connect(self.refresh_external)
        top.addWidget(self.folder_label, 1)
        top.addWidget(change)
        top.addWidget(refresh)
        lay.addLayout(top)
        lay.addWidget(self._build_table(), 1)
        self.graft_bar = GraftBar(self)
        lay.addWidget(self.graft_bar)
        lay.addLayout(self._build_actions())

    def _build_table(self) -> QTableWidget:
        t = self.installed_table = model_table(self, INSTALLED_COLUMNS, "Installed models")
        t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        t.itemSelectionChanged.connect(self._update_buttons)
        t.itemDoubleClicked.connect(lambda _item: self._load_selected())
        return t

    def _build_actions(self) -> QHBoxLayout:
        acts = QHBoxLayout()
        self.installed_buttons: dict[str, QPushButton] = {}
        for key, text, slot in (("load", "Load", self._load_selected),
                                ("tune", "Tune", self._tune_selected),
                                ("open", "Open folder", self._open_selected),
                                ("import", "Import into MTP Chat", self._import_selected),
                                ("graft", "Add MTP head", self._graft_selected),
                                ("delete", "Delete…", self._delete_selected)):
            b = QPushButton(text, self)
            b.clicked.connect(slot)
            acts.addWidget(b)
            self.installed_buttons[key] = b
        acts.addStretch(1)
        self.tune_status = QLabel("", self)
        self.tune_status.setAccessibleName("Tuning status")
        acts.addWidget(self.tune_status)
        return acts

    def ask(self, title: str, text: str) -> bool:
        return ask_yes_no(self, title, text)

    def refresh(self) -> None:
        self.folder_label.setText(f"Models folder: {self.store.root}")
        from dataclasses import replace

        own = [replace(r, mtp_offer=self._offers.get(r.path) or r.mtp_offer)
               for r in self.store.list() if r.status != "incomplete"]
        rows = own + self.external
        self.installed = rows
        t = self.installed_table
        t.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = _installed_cells(r)
            in_use = self.loaded_path is not None and r.path == self.loaded_path
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{r.path}\n{r.problem or ''}".strip()
                                + ("\nLoaded in the chat" if in_use else ""))
                if in_use:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                if col == 2 and r.status in ("corrupt", "unsupported"):
                    item.setForeground(Qt.GlobalColor.red)
                t.setItem(i, col, item)
        t.resizeColumnsToContents()
        t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self._update_buttons()

    def selected_model(self):
        rows = self.installed_table.selectionModel().selectedRows()
        return self.installed[rows[0].row()] if rows else None

    def select_model(self, name: str) -> None:
        for i, r in enumerate(self.installed):
            if r.name == name:
                self.installed_table.selectRow(i)
                return
        raise KeyError(name)

    def _update_buttons(self) -> None:
        r = self.selected_model()
        b = self.installed_buttons
        b["load"].setEnabled(bool(r and r.loadable))
        b["tune"].setEnabled(bool(r and r.loadable and r.has_mtp))
        b["open"].setEnabled(bool(r and Path(r.path).exists()))
        b["delete"].setEnabled(bool(r and r.deletable))
        b["delete"].setToolTip("" if not r or r.deletable else
                               f"{r.name} lives in the {r.location_label}: MTP Chat never deletes it"
                               if r.external else "included with the app: it cannot be deleted")
        b["import"].setEnabled(bool(r and r.external and r.loadable))
        b["import"].setToolTip("Hard-links the files into MTP Chat's models folder (no extra disk "
                               "on the same drive; a copy otherwise)")
        offer = r.mtp_offer if r is not None and r.has_mtp is False and r.loadable else None
        busy = self.graft_job is not None and self.graft_job.state == "running"
        b["graft"].setText(button_text(offer))
        b["graft"].setVisible(offer is not None)
        b["graft"].setEnabled(offer is not None and not busy)
        b["graft"].setToolTip(f"{offer['line']}: downloads only the head and measures it before "
                              "adding it; the model's own files are not changed" if offer else "")

    def refresh_external(self) -> None:
        """Rescan the Hugging Face cache, LM Studio and MTPLX folders (on the thread pool)."""
        self.refresh()
        if not self._scan_external:
            return
        from engine.hub.local_models import external_rows

        store, mem = self.store, self._total_memory

        def scan() -> tuple[list, dict]:
            from engine.hub.local_models import with_offers

            own = with_offers(store.list(include_incomplete=False), online=True, store=store)
            return (with_offers(external_rows(store, total_memory=mem), online=True,
                                store=store),
                    {r.path: r.mtp_offer for r in own if r.mtp_offer})
        self._relays.append(run_in_pool(
            scan, on_done=self._on_external,
            on_error=lambda msg: log.warning("scanning for models failed: %s", msg),
            parent=self))

    def _on_external(self, found: tuple[list, dict]) -> None:
        self.external, self._offers = found
        self.refresh()

    def _graft_selected(self) -> None:
        """Add the selected model's MTP head (engine.hub.graft) on a thread of its own."""
        r = self.selected_model()
        busy = self.graft_job is not None and self.graft_job.state == "running"
        if not r or r.has_mtp is not False or busy:
            return
        job = self.graft_job = GraftJob(r.path, store=self.store, parent=self)
        self.graft_bar.follow(job, r.name)
        job.finished.connect(lambda _res: self.refresh_external())
        job.failed.connect(lambda _msg: self._update_buttons())
        job.start()
        self._update_buttons()

    def _import_selected(self) -> None:
        r = self.selected_model()
        if not r or not r.external:
            return
        from engine.hub.local_models import import_model

        self.tune_status.setText(f"Importing {r.name}…")
        store = self.store
        self._relays.append(run_in_pool(
            lambda: import_model(r.path, store=store), on_done=self._on_imported,
            on_error=lambda msg: (self.tune_status.setText(""),
                                  QMessageBox.warning(self, "Import model", msg)), parent=self))

    def _on_imported(self, result) -> None:
        dest, linked, copied = result
        how = f"{linked} file(s) hard-linked" + (f", {copied} copied" if copied else "")
        self.tune_status.setText(f"Imported as {dest.name} ({how})")
        self.refresh()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel a graft in progress (what it fetched is kept for the next try)."""
        if self.graft_job is not None:
            self.graft_job.cancel()
            self.graft_job.wait(timeout)

    def _load_selected(self) -> None:
        r = self.selected_model()
        if r and r.loadable:
            self.load_requested.emit(r.path)

    def _tune_selected(self) -> None:
        r = self.selected_model()
        if r and r.loadable:
            self.tune_status.setText(f"Tuning {r.name}…")
            self.tune_requested.emit(r.path)

    def _open_selected(self) -> None:
        r = self.selected_model()
        if r:
            QDesktopServices.openUrl(QUrl.fromLocalFile(r.path))

    def _delete_selected(self) -> None:
        r = self.selected_model()
        if not r or not r.deletable:
            return
        if not self.ask("Delete model", f"Delete {r.name} ({fmt_bytes(r.size_bytes)})?\n\n"
                        f"{r.path}\n\nThis cannot be undone."):
            return
        try:
            self.store.delete(r.name)
        except EngineError as exc:
            QMessageBox.warning(self, "Delete model", str(exc))
        self.refresh()
        self.deleted.emit()

    def set_loaded_model(self, info) -> None:
        """The model the chat uses (a ``ModelInfo``, or None)."""
        self.loaded_path = info.path if info is not None else None
        self.refresh()

    # the tuner's run (``app.chat.aux_windows.TunerView``, through the window)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        self.tune_status.setText(f"Tuning {done}/{total}: {message}")

    def on_tune_finished(self, obj) -> None:
        depth = getattr(obj, "best_depth", None)
        self.tune_status.setText("Tuning done" + (f": best depth {depth}" if depth is not None
                                                  else ""))
        self.refresh()

    def on_tune_failed(self, message: str) -> None:
        self.tune_status.setText(f"Tuning failed: {message}")


STATUS_LABELS = {"builtin": "Ready", "installed": "Ready", "external": "Ready",
                 "unverified": "Not checked yet", "corrupt": "Damaged",
                 "unsupported": "Not supported", "incomplete": "Incomplete"}
LOCATION_LABELS = {"built in": "Included with the app"}


def status_label(status: str) -> str:
    """The Status column's words for a store status ("builtin" -> "Ready")."""
    return STATUS_LABELS.get(status, status.replace("_", " ").capitalize())


def location_label(label: str) -> str:
    """The Where column's words ("built in" -> "Included with the app")."""
    return LOCATION_LABELS.get(label, label)


def _installed_cells(r) -> tuple[str, ...]:
    q = r.quantization
    return (r.name, location_label(r.location_label), status_label(r.status),
            fmt_bytes(r.size_bytes), r.family or "-",
            f"{q.get('bits')}-bit" if q else "none",
            "-" if r.has_mtp is None else ("yes" if r.has_mtp else "no"), r.verdict or "-",
            "-" if r.tuned_depth is None else str(r.tuned_depth),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_used))
            if r.last_used else "never")
