"""The model manager's "Downloads" tab: one row per download (progress, pause, resume, retry,
a token for gated models, load once installed). Downloads run on their own threads
(``app.models.jobs.DownloadJob``) and go on while the window is closed.

``DownloadsPanel(parent, store=, options=)``: ``start(repo, revision=, convert_bits=)``
starts or resumes one, ``adopt_incomplete(start=)`` lists (and resumes) what an earlier session
left unfinished, ``shutdown()`` stops them all (what was fetched is kept); ``ask(title, text)``
confirms deleting a partial download (tests replace it). Signals: ``load_requested(str path)``, ``job_ended()``
(a download finished or failed), ``changed()`` (how many run, ``active_count()``, may have
changed). ``store`` is where downloads go; set it when it changes.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from app.models.jobs import DownloadJob
from app.models.panels import DownloadRow, ask_yes_no, edit_token, fmt_bytes
from engine.hub.store import Store


class DownloadsPanel(QScrollArea):
    load_requested = Signal(str)
    job_ended = Signal()
    changed = Signal()

    def __init__(self, parent: QWidget | None = None, *, store: Store, options: dict) -> None:
        super().__init__(parent)
        self.store = store
        self.options = options
        self.jobs: dict[tuple, DownloadJob] = {}
        self.rows: dict[tuple, DownloadRow] = {}
        self.setWidgetResizable(True)
        inner = QWidget(self)
        self.downloads_layout = QVBoxLayout(inner)
        self.no_downloads = QLabel("No downloads yet. Pick a model in the Catalog or add one "
                                   "from Hugging Face.", inner)
        self.no_downloads.setObjectName("muted")
        self.downloads_layout.addWidget(self.no_downloads)
        self.downloads_layout.addStretch(1)
        self.setWidget(inner)

    def ask(self, title: str, text: str) -> bool:
        return ask_yes_no(self, title, text)

    def active_count(self) -> int:
        """How many downloads are running."""
        return sum(1 for j in self.jobs.values() if j.state == "running")

    def start(self, repo_id: str, *, revision: str = "main",
              convert_bits: int | None = None) -> DownloadJob:
        """Start (or resume) a download and show it."""
        key = (repo_id, revision, convert_bits)
        job = self.jobs.get(key) or self._add_job(repo_id, revision, convert_bits)
        job.start()
        self.rows[key].refresh()
        self.changed.emit()
        return job

    def _add_job(self, repo_id: str, revision: str, bits: int | None) -> DownloadJob:
        key = (repo_id, revision, bits)
        job = DownloadJob(repo_id, revision=revision, convert_bits=bits, store=self.store,
                          options=self.options, parent=self)
        job.finished.connect(lambda _result: self.job_ended.emit())
        job.failed.connect(lambda _message: self.job_ended.emit())
        row = DownloadRow(job, self)
        row.load_requested.connect(self.load_requested)
        row.remove_requested.connect(self._remove_job)
        row.token_requested.connect(self._token_then_retry)
        for sig in (row.buttons["resume"].clicked, row.buttons["retry"].clicked):
            sig.connect(lambda _checked=False: self.changed.emit())
        self.jobs[key], self.rows[key] = job, row
        self.downloads_layout.insertWidget(0, row)
        self.no_downloads.hide()
        self.changed.emit()
        return job

    def adopt_incomplete(self, *, start: bool) -> None:
        """List downloads an earlier session left unfinished (and resume them)."""
        from engine.hub.client import DownloadProgress

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

    def _token_then_retry(self, job: DownloadJob) -> None:
        if edit_token(self):
            job.start()
            self.changed.emit()

    def _remove_job(self, job: DownloadJob) -> None:
        key = (job.repo_id, job.revision, job.convert_bits)
        if job.running:
            return
        partial = self.store.staging_path(_name(job)) if job.state != "done" else None
        if partial is not None and partial.exists():
            if not self.ask("Delete partial download",
                            f"Delete the {fmt_bytes(_dir_size(partial))} already downloaded "
                            f"for {job.repo_id}? It cannot be resumed afterwards."):
                return
            self.store.delete(partial.name)
        row = self.rows.pop(key)
        self.jobs.pop(key)
        row.setParent(None)
        row.deleteLater()
        self.no_downloads.setVisible(not self.rows)
        self.changed.emit()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every download (what was fetched is kept for the next start)."""
        for job in self.jobs.values():
            job.cancel()
        deadline = time.monotonic() + timeout
        for job in self.jobs.values():
            job.wait(max(0.0, deadline - time.monotonic()))


def _name(job: DownloadJob) -> str:
    from engine.hub.store import model_name

    return model_name(job.repo_id, revision=job.revision)


def _dir_size(path: Path) -> int:
    from engine.hub.store import dir_size

    return dir_size(path)
