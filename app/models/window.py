"""The model manager window: catalog, check-before-download, downloads, installed models.

``ModelsWindow(parent=None)`` signals:

- ``load_requested(str path)``: the user wants to chat with this model;
- ``tune_requested(str path)``: the user wants the tuner to measure the best depth.

It is a ``TunerView`` (``on_tune_progress(done, total, message)``, ``on_tune_finished(result)``,
``on_tune_failed(message)`` show the tuner's state) and follows the ``LoadedModel``
(``set_loaded_model(info)``: the model in use is shown in bold). Downloads run on their own threads (``app.models.jobs``) and go on while the
window is closed (closing only hides it); they stop, keeping what was fetched, when the app
quits, and incomplete downloads found at start are resumed. Pre-checks run on the thread pool;
nothing here blocks the UI on the network.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QApplication, QComboBox, QFileDialog,
                               QHBoxLayout, QHeaderView, QInputDialog, QLabel, QLineEdit,
                               QMainWindow, QMessageBox, QProgressBar, QPushButton, QScrollArea,
                               QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from app.models.catalog import CatalogPanel
from app.models.search import SearchPanel
from app.models.jobs import DownloadJob, run_in_pool
from app.models.panels import (STYLE, VERDICT_COLORS, DownloadRow, convert_options, fmt_bytes,
                               fmt_gib, report_html)
from engine import hub
from engine.errors import EngineError
from engine.store import Store, set_store_root

log = logging.getLogger(__name__)
INSTALLED_COLUMNS = ("Name", "Where", "Status", "Size", "Family", "Quantization", "MTP",
                     "Verdict", "Tuned depth", "Last used")


class ModelsWindow(QMainWindow):
    load_requested = Signal(str)
    tune_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, store: Store | None = None,
                 total_memory: int | None = None,
                 free_space: Callable[[Path], int] | None = None, auto_resume: bool = True,
                 download_options: dict | None = None, machine: dict | None = None,
                 scan_external: bool = True) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models — MTP Chat")
        self.resize(1060, 680)
        self.setStyleSheet(STYLE)
        self.store = store or Store()
        self._total_memory = total_memory
        self._free_space = free_space
        self._machine = machine
        self._scan_external = scan_external
        self.external: list = []  # models found outside the store (engine.local)
        self.download_options = dict(download_options or {})
        if free_space is not None:
            self.download_options.setdefault("free_space", free_space)
        self.jobs: dict[tuple, DownloadJob] = {}
        self.rows: dict[tuple, DownloadRow] = {}
        self.report: dict | None = None
        self.loaded_path: str | None = None
        self._check_seq = 0
        self._relays: list = []
        self.tabs = QTabWidget(self)
        self.setCentralWidget(self.tabs)
        self.catalog_panel = CatalogPanel(self)
        self.catalog_panel.check_requested.connect(self.check_repo)
        self.catalog_panel.download_requested.connect(self._confirm_download)
        self.tabs.addTab(self.catalog_panel, "Catalog")
        self.tabs.addTab(self._build_add(), "Add from Hugging Face")
        self.tabs.addTab(self._build_downloads(), "Downloads")
        self.tabs.addTab(self._build_installed(), "On this machine")
        self.search_panel = SearchPanel(self, total_memory=total_memory)
        self.search_panel.check_requested.connect(self.check_repo)
        self.search_panel.download_requested.connect(self._confirm_download)
        self.tabs.addTab(self.search_panel, "Search")
        self.refresh_catalog()
        self.refresh_installed()
        self.refresh_external()
        self._adopt_incomplete(start=auto_resume)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    # ================================================================== catalog
    def refresh_catalog(self) -> None:
        self.catalog_panel.refresh(store_root=self.store.root, total_memory=self._total_memory,
                                   free_space=self._free_space, machine=self._machine)

    def _confirm_download(self, repo: str, revision: str, bits, spec: dict) -> None:
        what = f" and convert it to MLX {bits}-bit" if bits else ""
        size = fmt_bytes(spec.get("disk_needed_bytes") or spec.get("download_bytes"))
        if self._ask("Download model", f"Download {repo}{what}?\n\nAbout {size} of disk; "
                     f"about {fmt_gib(spec.get('memory_bytes', 0))} of memory to run."):
            self.start_download(repo, revision=revision, convert_bits=bits)

    # ================================================================== add / check
    def _build_add(self) -> QWidget:
        page = QWidget(self)
        lay = QVBoxLayout(page)
        lay.addWidget(QLabel("Paste a Hugging Face model id (org/name) or link. MTP Chat checks "
                             "it before downloading anything: architecture, MTP head, size, "
                             "memory and disk.", page))
        row = QHBoxLayout()
        self.repo_edit = QLineEdit(page)
        self.repo_edit.setPlaceholderText("Qwen/Qwen3.5-4B or https://huggingface.co/…")
        self.repo_edit.setAccessibleName("Repository id or link")
        self.repo_edit.returnPressed.connect(self.check_repo)
        self.rev_edit = QLineEdit(page)
        self.rev_edit.setPlaceholderText("main")
        self.rev_edit.setMaximumWidth(140)
        self.rev_edit.setAccessibleName("Revision")
        self.check_button = QPushButton("Check", page)
        self.check_button.clicked.connect(lambda: self.check_repo())
        token = QPushButton("Hugging Face token…", page)
        token.clicked.connect(self._edit_token)
        for w in (self.repo_edit, self.rev_edit, self.check_button, token):
            row.addWidget(w, 1 if w is self.repo_edit else 0)
        lay.addLayout(row)
        self.check_busy = QProgressBar(page)
        self.check_busy.setRange(0, 0)
        self.check_busy.setMaximumHeight(6)
        self.check_busy.setTextVisible(False)
        self.check_busy.hide()
        lay.addWidget(self.check_busy)
        self.report_label = QLabel("", page)
        self.report_label.setAccessibleName("Check result")
        self.report_label.setWordWrap(True)
        self.report_label.setTextFormat(Qt.TextFormat.RichText)
        self.report_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.report_label.setAlignment(Qt.AlignmentFlag.AlignTop)
        lay.addWidget(self.report_label)
        act = QHBoxLayout()
        self.option_combo = QComboBox(page)
        self.option_combo.setAccessibleName("Download option")
        self.download_button = QPushButton("Download", page)
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self._download_checked)
        act.addWidget(self.option_combo)
        act.addWidget(self.download_button)
        act.addStretch(1)
        lay.addLayout(act)
        self.option_combo.hide()
        lay.addStretch(1)
        return page

    def check_repo(self, text: str | None = None) -> None:
        """Start a pre-check of ``text`` (or the entry's text) on the thread pool."""
        if text:
            self.repo_edit.setText(text)
            self.tabs.setCurrentIndex(1)
        try:
            repo, url_rev = hub.parse_repo_ref(self.repo_edit.text())
        except EngineError as exc:
            self._show_check_error(str(exc))
            return
        revision = self.rev_edit.text().strip() or url_rev or "main"
        self._check_seq += 1
        seq = self._check_seq
        self.report = None
        self.check_busy.show()
        self.check_button.setEnabled(False)
        self.download_button.setEnabled(False)
        self.option_combo.hide()
        self.report_label.setText(f"Checking {repo}…")
        root, free_fn = self.store.root, self._free_space
        self._relays.append(run_in_pool(
            lambda: _precheck(repo, revision, root, free_fn, self._total_memory),
            on_done=lambda r: self._on_checked(seq, r),
            on_error=lambda msg: self._on_check_failed(seq, msg), parent=self))

    def _on_checked(self, seq: int, report: dict) -> None:
        if seq != self._check_seq:
            return  # the user asked for something else meanwhile
        self.check_busy.hide()
        self.check_button.setEnabled(True)
        self.report = report
        self.report_label.setText(report_html(report))
        self.option_combo.clear()
        total = report["machine"]["total_memory_bytes"]
        from engine.catalog import memory_verdict

        chosen = 0
        for i, (label, bits, mem) in enumerate(convert_options(report)):
            v = memory_verdict(mem, total_memory=total)["verdict"]
            self.option_combo.addItem(f"{label} — {fmt_gib(mem)} memory, {v}", bits)
            if i and v == "recommended" and chosen == 0 and report["memory_needed_bytes"] > \
                    0.6 * total:
                chosen = i
        self.option_combo.setCurrentIndex(chosen)
        self.option_combo.setVisible(report["supported"])
        ok = report["supported"] and report["disk"]["fits"]
        self.download_button.setEnabled(ok)
        self.download_button.setToolTip("" if ok else "not supported, or not enough disk")
        self.report_label.setProperty("verdict", report["machine"]["verdict"])

    def _on_check_failed(self, seq: int, message: str) -> None:
        if seq == self._check_seq:
            self._show_check_error(message)

    def _show_check_error(self, message: str) -> None:
        self.check_busy.hide()
        self.check_button.setEnabled(True)
        self.download_button.setEnabled(False)
        self.report_label.setText(f"<b style='color:{VERDICT_COLORS['not enough memory']}'>"
                                  f"✗</b> {message}")

    def _download_checked(self) -> None:
        r = self.report
        if r is None:
            return
        self.start_download(r["repo_id"], revision=r["revision"],
                            convert_bits=self.option_combo.currentData())

    def _edit_token(self) -> bool:
        """Ask for the user's Hugging Face token and save it (returns whether one is set)."""
        tok, ok = QInputDialog.getText(
            self, "Hugging Face token", "Token for gated models (from huggingface.co/settings/"
            "tokens; leave empty to forget it):", QLineEdit.EchoMode.Password,
            hub.saved_token() or "")
        if ok:
            hub.save_token(tok.strip() or None)
        return bool(ok and tok.strip())

    def _token_then_retry(self, job: DownloadJob) -> None:
        if self._edit_token():
            job.start()
            self._update_tab_titles()

    # ================================================================== downloads
    def _build_downloads(self) -> QWidget:
        page = QScrollArea(self)
        page.setWidgetResizable(True)
        inner = QWidget(page)
        self.downloads_layout = QVBoxLayout(inner)
        self.no_downloads = QLabel("No downloads yet. Pick a model in the Catalog or add one "
                                   "from Hugging Face.", inner)
        self.no_downloads.setObjectName("muted")
        self.downloads_layout.addWidget(self.no_downloads)
        self.downloads_layout.addStretch(1)
        page.setWidget(inner)
        return page

    def start_download(self, repo_id: str, *, revision: str = "main",
                       convert_bits: int | None = None) -> DownloadJob:
        """Start (or resume) a download and show it in the Downloads tab."""
        key = (repo_id, revision, convert_bits)
        job = self.jobs.get(key) or self._add_job(repo_id, revision, convert_bits)
        job.start()
        self.rows[key].refresh()
        self._update_tab_titles()
        self.tabs.setCurrentIndex(2)
        return job

    def _add_job(self, repo_id: str, revision: str, bits: int | None) -> DownloadJob:
        key = (repo_id, revision, bits)
        job = DownloadJob(repo_id, revision=revision, convert_bits=bits, store=self.store,
                          options=self.download_options, parent=self)
        job.finished.connect(self._on_job_finished)
        job.failed.connect(self._on_job_finished)
        row = DownloadRow(job, self)
        row.load_requested.connect(self.load_requested)
        row.remove_requested.connect(self._remove_job)
        row.token_requested.connect(self._token_then_retry)
        for sig in (row.buttons["resume"].clicked, row.buttons["retry"].clicked):
            sig.connect(self._update_tab_titles)
        self.jobs[key], self.rows[key] = job, row
        self.downloads_layout.insertWidget(0, row)
        self.no_downloads.hide()
        self._update_tab_titles()
        return job

    def _adopt_incomplete(self, *, start: bool) -> None:
        """List downloads an earlier session left unfinished (and resume them)."""
        from engine.hub import DownloadProgress

        for r in self.store.list(include_builtin=False):
            if r.status != "incomplete" or not r.repo_id:
                continue
            job = self._add_job(r.repo_id, r.revision or "main", None)
            job.last = DownloadProgress(repo_id=r.repo_id, phase="cancelled",
                                        bytes_done=r.size_bytes, bytes_total=r.bytes_total or 0)
            job.state = "cancelled"
            if start:
                job.start()
            self.rows[(r.repo_id, r.revision or "main", None)].refresh()

    def _on_job_finished(self, *_args) -> None:
        self.refresh_installed()
        self._update_tab_titles()

    def _remove_job(self, job: DownloadJob) -> None:
        key = (job.repo_id, job.revision, job.convert_bits)
        if job.running:
            return
        partial = self.store.staging_path(_name(job)) if job.state != "done" else None
        if partial is not None and partial.exists():
            if not self._ask("Delete partial download",
                             f"Delete the {fmt_bytes(_dir_size(partial))} already downloaded "
                             f"for {job.repo_id}? It cannot be resumed afterwards."):
                return
            self.store.delete(partial.name)
        row = self.rows.pop(key)
        self.jobs.pop(key)
        row.setParent(None)
        row.deleteLater()
        self.no_downloads.setVisible(not self.rows)
        self._update_tab_titles()

    def _update_tab_titles(self) -> None:
        active = sum(1 for j in self.jobs.values() if j.state == "running")
        self.tabs.setTabText(2, f"Downloads ({active})" if active else "Downloads")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every download (what was fetched is kept for the next start)."""
        for job in self.jobs.values():
            job.cancel()
        deadline = time.monotonic() + timeout
        for job in self.jobs.values():
            job.wait(max(0.0, deadline - time.monotonic()))

    # ================================================================== installed
    def _build_installed(self) -> QWidget:
        page = QWidget(self)
        lay = QVBoxLayout(page)
        top = QHBoxLayout()
        self.folder_label = QLabel("", page)
        self.folder_label.setAccessibleName("Models folder")
        change = QPushButton("Change folder…", page)
        change.clicked.connect(self._change_folder)
        refresh = QPushButton("Refresh", page)
        refresh.clicked.connect(self.refresh_external)
        top.addWidget(self.folder_label, 1)
        top.addWidget(change)
        top.addWidget(refresh)
        lay.addLayout(top)
        t = self.installed_table = QTableWidget(0, len(INSTALLED_COLUMNS), page)
        t.setHorizontalHeaderLabels(INSTALLED_COLUMNS)
        t.setAccessibleName("Installed models")
        t.verticalHeader().setVisible(False)
        t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        t.itemSelectionChanged.connect(self._update_installed_buttons)
        t.itemDoubleClicked.connect(lambda _item: self._load_selected())
        lay.addWidget(t, 1)
        acts = QHBoxLayout()
        self.installed_buttons: dict[str, QPushButton] = {}
        for key, text, slot in (("load", "Load", self._load_selected),
                                ("tune", "Tune", self._tune_selected),
                                ("open", "Open folder", self._open_selected),
                                ("import", "Import into MTP Chat", self._import_selected),
                                ("delete", "Delete…", self._delete_selected)):
            b = QPushButton(text, page)
            b.clicked.connect(slot)
            acts.addWidget(b)
            self.installed_buttons[key] = b
        acts.addStretch(1)
        self.tune_status = QLabel("", page)
        self.tune_status.setAccessibleName("Tuning status")
        acts.addWidget(self.tune_status)
        lay.addLayout(acts)
        return page

    def refresh_installed(self) -> None:
        self.folder_label.setText(f"Models folder: {self.store.root}")
        rows = [r for r in self.store.list() if r.status != "incomplete"] + self.external
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
        self._update_installed_buttons()

    def selected_model(self):
        rows = self.installed_table.selectionModel().selectedRows()
        return self.installed[rows[0].row()] if rows else None

    def select_model(self, name: str) -> None:
        for i, r in enumerate(self.installed):
            if r.name == name:
                self.installed_table.selectRow(i)
                return
        raise KeyError(name)

    def _update_installed_buttons(self) -> None:
        r = self.selected_model()
        b = self.installed_buttons
        b["load"].setEnabled(bool(r and r.loadable))
        b["tune"].setEnabled(bool(r and r.loadable and r.has_mtp))
        b["open"].setEnabled(bool(r and Path(r.path).exists()))
        b["delete"].setEnabled(bool(r and r.deletable))
        b["delete"].setToolTip("" if not r or r.deletable else
                               f"{r.name} lives in the {r.location_label}: MTP Chat never deletes it"
                               if r.external else "built into the app")
        b["import"].setEnabled(bool(r and r.external and r.loadable))
        b["import"].setToolTip("Hard-links the files into MTP Chat's models folder (no extra disk "
                               "on the same drive; a copy otherwise)")

    def refresh_external(self) -> None:
        """Rescan the Hugging Face cache, LM Studio and MTPLX folders (on the thread pool)."""
        self.refresh_installed()
        if not self._scan_external:
            return
        from engine.local import external_rows

        store, mem = self.store, self._total_memory
        self._relays.append(run_in_pool(
            lambda: external_rows(store, total_memory=mem), on_done=self._on_external,
            on_error=lambda msg: log.warning("scanning for models failed: %s", msg),
            parent=self))

    def _on_external(self, rows: list) -> None:
        self.external = rows
        self.refresh_installed()

    def _import_selected(self) -> None:
        r = self.selected_model()
        if not r or not r.external:
            return
        from engine.local import import_model

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
        self.refresh_installed()

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
        if not self._ask("Delete model", f"Delete {r.name} ({fmt_bytes(r.size_bytes)})?\n\n"
                         f"{r.path}\n\nThis cannot be undone."):
            return
        try:
            self.store.delete(r.name)
        except EngineError as exc:
            QMessageBox.warning(self, "Delete model", str(exc))
        self.refresh_installed()
        self.refresh_catalog()

    def _change_folder(self) -> None:
        if any(j.running for j in self.jobs.values()):
            QMessageBox.information(self, "Models folder", "Wait for downloads to finish (or "
                                    "cancel them) before changing the models folder.")
            return
        path = QFileDialog.getExistingDirectory(self, "Models folder", str(self.store.root))
        if path:
            set_store_root(path)
            self.store = Store()
            self.refresh_installed()
            self.refresh_catalog()

    def set_loaded_model(self, info) -> None:
        """The model the chat uses (a ``ModelInfo``, or None)."""
        self.loaded_path = info.path if info is not None else None
        self.refresh_installed()

    # TunerView (driven by app.chat.aux_windows)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        self.tune_status.setText(f"Tuning {done}/{total}: {message}")

    def on_tune_finished(self, obj) -> None:
        depth = getattr(obj, "best_depth", None)
        self.tune_status.setText("Tuning done" + (f": best depth {depth}" if depth is not None
                                                  else ""))
        self.refresh_installed()

    def on_tune_failed(self, message: str) -> None:
        self.tune_status.setText(f"Tuning failed: {message}")

    # ================================================================== misc
    def _ask(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(self, title, text)
        return answer == QMessageBox.StandardButton.Yes


def _installed_cells(r) -> tuple[str, ...]:
    q = r.quantization
    return (r.name, r.location_label, r.status, fmt_bytes(r.size_bytes), r.family or "-",
            f"{q.get('bits')}-bit" if q else "none",
            "-" if r.has_mtp is None else ("yes" if r.has_mtp else "no"), r.verdict or "-",
            "-" if r.tuned_depth is None else str(r.tuned_depth),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_used))
            if r.last_used else "never")


def _precheck(repo: str, revision: str, root: Path, free_fn, total_memory) -> dict:
    """Runs on the thread pool: inspect the repo and add disk and memory verdicts."""
    from engine.catalog import DISK_MARGIN, free_disk, memory_verdict, warning_for
    from engine.inspection import inspect_repo

    report = inspect_repo(repo, revision=revision)
    warn = warning_for(repo)
    if warn and warn not in report["reasons"]:
        report["reasons"].append(warn)
    free = (free_fn or free_disk)(root)
    report["disk"] = {"free_bytes": free, "fits": report["download_bytes"] * DISK_MARGIN <= free}
    report["machine"] = memory_verdict(report["memory_needed_bytes"], total_memory=total_memory)
    return report


def _name(job: DownloadJob) -> str:
    from engine.store import model_name

    return model_name(job.repo_id, revision=job.revision)


def _dir_size(path: Path) -> int:
    from engine.store import dir_size

    return dir_size(path)
