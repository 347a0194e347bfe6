"""The model manager's "Add MTP head" for a model without one (``engine.hub.graft``).

``GraftJob(model_path, store=)`` runs the graft on its own Python thread (the engine's work:
source, trunk check, head-only download, calibration) and reports through Qt signals:
``progress(DownloadProgress)``, ``finished(GraftResult)``, ``failed(str one-line message)``;
``cancel()`` stops it (what was fetched is kept for the next try).

``GraftBar`` is the strip under the "On this machine" table that shows one graft: what it is
doing with a progress bar and Cancel, then the result (acceptance, what was downloaded) or the
one-line refusal.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from app.models.jobs import ThreadJob
from app.models.units import fmt_bytes


def button_text(offer: dict | None) -> str:
    """"Add MTP head (2.3 MB)" when the head's size is known, else "Add MTP head"."""
    if offer and offer.get("bytes"):
        return f"Add MTP head ({fmt_bytes(int(offer['bytes']))})"
    return "Add MTP head"


class GraftJob(ThreadJob):
    done_status = "grafted"
    thread_name = "graft"

    def __init__(self, model_path: str, *, store, source: str | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.model_path, self.store, self.source = model_path, store, source

    def work(self, cancel: threading.Event):
        from engine.hub.graft import Grafter

        return Grafter(self.model_path, source=self.source, store=self.store,
                       progress=self._on_progress, cancel=cancel).run()


def result_text(res) -> str:
    """What a finished graft did, in one line."""
    if res.status != "grafted":
        return "Cancelled — what was fetched is kept: Add MTP head again to continue."
    where = "beside the model" if res.mode == "sidecar" else f"as {res.name}"
    return (f"MTP head added {where} from {res.source}: acceptance {res.acceptance:.2f} at "
            f"depth 3 · downloaded {fmt_bytes(res.bytes_downloaded)} instead of "
            f"{fmt_bytes(res.repo_bytes)}")


PHASE_TEXT = {"planning": "Checking the model against its source…",
              "converting": "Writing the head…",
              "verifying": "Measuring acceptance…", "installing": "Installing…"}


class GraftBar(QFrame):
    """One graft's progress, Cancel, and its outcome."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("downloadRow")
        self.job: GraftJob | None = None
        lay = QHBoxLayout(self)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)
        self.status.setAccessibleName("MTP head status")
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.bar.setMaximumWidth(220)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setAccessibleName("Cancel adding the MTP head")
        self.cancel_button.clicked.connect(self._cancel)
        lay.addWidget(self.status, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel_button)
        self.hide()

    def follow(self, job: GraftJob, name: str) -> None:
        self.job = job
        self.status.setObjectName("")
        self.status.setText(f"Adding the MTP head to {name}…")
        self.bar.setValue(0)
        self.bar.show()
        self.cancel_button.show()
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        job.failed.connect(self._on_failed)
        self.show()

    def _cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _on_progress(self, p) -> None:
        if p.phase == "downloading" and p.bytes_total:
            self.bar.setValue(int(1000 * min(1.0, p.fraction)))
            resumed = f" (resumed {fmt_bytes(p.resumed_bytes)})" if p.resumed_bytes else ""
            self.status.setText(f"Downloading the MTP head from {p.repo_id}: "
                                f"{fmt_bytes(p.bytes_done)} of {fmt_bytes(p.bytes_total)}"
                                f"{resumed}")
        elif p.phase in PHASE_TEXT:
            self.status.setText(PHASE_TEXT[p.phase])

    def _end(self, text: str, *, error: bool) -> None:
        self.bar.hide()
        self.cancel_button.hide()
        self.status.setObjectName("rowError" if error else "")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.status.setText(text)

    def _on_finished(self, res) -> None:
        self._end(result_text(res), error=False)

    def _on_failed(self, message: str) -> None:
        self._end(message[:1].upper() + message[1:], error=True)
