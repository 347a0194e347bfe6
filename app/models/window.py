"""The model manager window: catalog, check-before-download, downloads, installed models.

``ModelsWindow(parent=None)`` signals:

- ``load_requested(str path)``: the user wants to chat with this model;
- ``tune_requested(str path)``: the user wants the tuner to measure the best depth.

It is a ``TunerView`` (``on_tune_progress(done, total, message)``, ``on_tune_finished(result)``,
``on_tune_failed(message)`` show the tuner's state) and follows the ``LoadedModel``
(``set_loaded_model(info)``: the model in use is shown in bold). Downloads run on their own
threads (``app.models.jobs``) and go on while the window is closed (closing only hides it); they
stop, keeping what was fetched, when the app quits, and incomplete downloads found at start are
resumed. Pre-checks run on the thread pool; nothing here blocks the UI on the network.

The window composes one panel per tab, each constructed with what it uses, and wires them:
``catalog_panel`` (``app.models.catalog.CatalogPanel``), ``add_panel``
(``app.models.add.AddPanel``: check a Hugging Face id), ``downloads``
(``app.models.downloads.DownloadsPanel``), ``installed_panel``
(``app.models.installed.InstalledPanel``: on this machine), ``search_panel``
(``app.models.search.SearchPanel``), ``servers_panel`` (``app.models.servers.ServersPanel``:
models served elsewhere). It owns the models folder (``store``).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QApplication, QFileDialog, QMainWindow, QMessageBox, QTabWidget,
                               QWidget)

from app.models.add import AddPanel
from app.models.catalog import CatalogPanel
from app.models.downloads import DownloadsPanel
from app.models.installed import InstalledPanel
from app.models.jobs import DownloadJob
from app.models.panels import STYLE, ask_yes_no, fmt_bytes, fmt_gib
from app.models.search import SearchPanel
from app.models.servers import ServersPanel
from engine.hub.store import Store, set_store_root

ADD_TAB, DOWNLOADS_TAB = 1, 2


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
        options = dict(download_options or {})
        if free_space is not None:
            options.setdefault("free_space", free_space)
        self.tabs = QTabWidget(self)
        self.setCentralWidget(self.tabs)
        self.catalog_panel = CatalogPanel(self)
        self.add_panel = AddPanel(self, store_root=self.store.root, total_memory=total_memory,
                                  free_space=free_space)
        self.downloads = DownloadsPanel(self, store=self.store, options=options)
        self.installed_panel = InstalledPanel(self, store=self.store, total_memory=total_memory,
                                              scan_external=scan_external)
        self.search_panel = SearchPanel(self, total_memory=total_memory)
        self.servers_panel = ServersPanel(self)
        for panel, title in ((self.catalog_panel, "Catalog"),
                             (self.add_panel, "Add from Hugging Face"),
                             (self.downloads, "Downloads"),
                             (self.installed_panel, "On this machine"),
                             (self.search_panel, "Search"),
                             (self.servers_panel, "Servers")):
            self.tabs.addTab(panel, title)
        self._connect()
        self.refresh_catalog()
        self.installed_panel.refresh_external()
        self.downloads.adopt_incomplete(start=auto_resume)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def _connect(self) -> None:
        for panel in (self.catalog_panel, self.search_panel):
            panel.check_requested.connect(self.check_repo)
            panel.download_requested.connect(self._confirm_download)
        self.add_panel.download_requested.connect(
            lambda repo, revision, bits: self.start_download(repo, revision=revision,
                                                             convert_bits=bits))
        d = self.downloads
        d.load_requested.connect(self.load_requested)
        d.job_ended.connect(self._on_job_ended)
        d.changed.connect(self._update_tab_titles)
        i = self.installed_panel
        i.load_requested.connect(self.load_requested)
        i.tune_requested.connect(self.tune_requested)
        i.deleted.connect(self.refresh_catalog)
        i.folder_change_requested.connect(self._change_folder)
        self.servers_panel.load_requested.connect(self.load_requested)

    # ================================================================== catalog, check
    def refresh_catalog(self) -> None:
        self.catalog_panel.refresh(store_root=self.store.root, total_memory=self._total_memory,
                                   free_space=self._free_space, machine=self._machine)

    def _confirm_download(self, repo: str, revision: str, bits, spec: dict) -> None:
        what = f" and convert it to MLX {bits}-bit" if bits else ""
        size = fmt_bytes(spec.get("disk_needed_bytes") or spec.get("download_bytes"))
        if self._ask("Download model", f"Download {repo}{what}?\n\nAbout {size} of disk; "
                     f"about {fmt_gib(spec.get('memory_bytes', 0))} of memory to run."):
            self.start_download(repo, revision=revision, convert_bits=bits)

    def check_repo(self, text: str | None = None) -> None:
        """Pre-check ``text`` (or the Add tab's entry) on the thread pool, shown in that tab."""
        if text:
            self.tabs.setCurrentIndex(ADD_TAB)
        self.add_panel.check(text)

    # ================================================================== downloads
    def start_download(self, repo_id: str, *, revision: str = "main",
                       convert_bits: int | None = None) -> DownloadJob:
        """Start (or resume) a download and show it in the Downloads tab."""
        job = self.downloads.start(repo_id, revision=revision, convert_bits=convert_bits)
        self.tabs.setCurrentIndex(DOWNLOADS_TAB)
        return job

    def _on_job_ended(self) -> None:
        self.installed_panel.refresh()
        self._update_tab_titles()

    def _update_tab_titles(self) -> None:
        active = self.downloads.active_count()
        self.tabs.setTabText(DOWNLOADS_TAB, f"Downloads ({active})" if active else "Downloads")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every download and graft (what was fetched is kept for the next start)."""
        self.downloads.shutdown(timeout)
        self.installed_panel.shutdown(timeout)

    # ================================================================== the models folder
    def _change_folder(self) -> None:
        if any(j.running for j in self.downloads.jobs.values()):
            QMessageBox.information(self, "Models folder", "Wait for downloads to finish (or "
                                    "cancel them) before changing the models folder.")
            return
        path = QFileDialog.getExistingDirectory(self, "Models folder", str(self.store.root))
        if path:
            set_store_root(path)
            self.store = Store()
            self.add_panel.store_root = self.store.root
            self.downloads.store = self.installed_panel.store = self.store
            self.installed_panel.refresh()
            self.refresh_catalog()

    def set_loaded_model(self, info) -> None:
        """The model the chat uses (a ``ModelInfo``, or None)."""
        self.installed_panel.set_loaded_model(info)

    # TunerView (driven by app.chat.aux_windows)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        self.installed_panel.on_tune_progress(done, total, message)

    def on_tune_finished(self, obj) -> None:
        self.installed_panel.on_tune_finished(obj)

    def on_tune_failed(self, message: str) -> None:
        self.installed_panel.on_tune_failed(message)

    def _ask(self, title: str, text: str) -> bool:
        return ask_yes_no(self, title, text)
