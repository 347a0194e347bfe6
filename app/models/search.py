"""The model manager's Search page: the Hub, filtered to the models this engine runs.

``SearchPanel`` signals: ``check_requested(str repo_id)`` (show the full pre-download check)
and ``download_requested(str repo_id, str revision, object bits_or_None, dict option)``.

A query runs :class:`engine.hub.search.HubSearch` on the thread pool; each result's MTP / size /
verdict check (safetensors headers only) runs there too and fills its row when it arrives.
"More results" fetches the next page. Offline, the status line says so and the other tabs
(the models on this machine) keep working.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QLineEdit, QPushButton, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from app.models.jobs import run_in_pool
from app.models.panels import fmt_bytes, fmt_gib, model_table, verdict_chip

log = logging.getLogger(__name__)
SEARCH_COLUMNS = ("Model", "MTP", "Quantization", "Size", "Gated / licence", "Downloads",
                  "Likes", "Verdict", "")


class SearchPanel(QWidget):
    check_requested = Signal(str)
    download_requested = Signal(str, str, object, dict)

    def __init__(self, parent: QWidget | None = None, *, total_memory: int | None = None,
                 page_size: int = 20) -> None:
        super().__init__(parent)
        self.total_memory, self.page_size = total_memory, page_size
        self.results: list = []
        self.search = None
        self._seq = 0
        self._relays: list = []
        self._build()

    def _build(self) -> None:
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        self.query_edit = QLineEdit(self)
        self.query_edit.setPlaceholderText("Search the Hugging Face Hub, e.g. Qwen3.5 4B")
        self.query_edit.setAccessibleName("Search query")
        self.query_edit.returnPressed.connect(self.start_search)
        self.search_button = QPushButton("Search", self)
        self.search_button.clicked.connect(self.start_search)
        row.addWidget(self.query_edit, 1)
        row.addWidget(self.search_button)
        lay.addLayout(row)
        self.status = QLabel("Only Qwen3.5 / Qwen3.6 models (dense and MoE) are listed; each is "
                             "checked for an MTP head by reading its safetensors headers.", self)
        self.status.setWordWrap(True)
        self.status.setObjectName("muted")
        self.status.setAccessibleName("Search status")
        lay.addWidget(self.status)
        t = self.table = model_table(self, SEARCH_COLUMNS, "Search results")
        t.itemDoubleClicked.connect(
            lambda item: self.check_requested.emit(self.results[item.row()].repo_id))
        lay.addWidget(t, 1)
        self.more_button = QPushButton("More results", self)
        self.more_button.clicked.connect(self.more)
        self.more_button.setEnabled(False)
        lay.addWidget(self.more_button)

    # ------------------------------------------------------------------ searching
    def start_search(self) -> None:
        from engine.errors import HubError
        from engine.hub.search import HubSearch

        try:
            self.search = HubSearch(self.query_edit.text(), page_size=self.page_size)
        except HubError as exc:
            self.status.setText(str(exc))
            return
        self._seq += 1
        self.results = []
        self.table.setRowCount(0)
        self.more()

    def more(self) -> None:
        if self.search is None:
            return
        seq, search = self._seq, self.search
        self.search_button.setEnabled(False)
        self.more_button.setEnabled(False)
        self.status.setText(f"Searching for “{search.query}”…")
        self._relays.append(run_in_pool(search.next_page,
                                        on_done=lambda page: self._on_page(seq, page),
                                        on_error=lambda msg: self._on_error(seq, msg),
                                        parent=self))

    def _on_error(self, seq: int, message: str) -> None:
        if seq != self._seq:
            return
        self.search_button.setEnabled(True)
        from app.models.jobs import OFFLINE_MESSAGE

        if message.startswith(OFFLINE_MESSAGE):
            message += " The models on this machine are still listed under “On this machine”."
        self.status.setText(f"Search failed: {message}")

    def _on_page(self, seq: int, page: list) -> None:
        if seq != self._seq:
            return
        self.search_button.setEnabled(True)
        start = len(self.results)
        self.results += page
        self.table.setRowCount(len(self.results))
        for i, r in enumerate(page, start):
            self._fill(i, r)
            self._check(seq, i, r)
        n = len(self.results)
        self.status.setText(f"{n} model{'s' if n != 1 else ''} for “{self.search.query}”"
                            + (" — more on the Hub" if self.search.more else "")
                            if n else f"No Qwen3.5/3.6 models match “{self.search.query}”.")
        self.more_button.setEnabled(self.search.more)

    def _check(self, seq: int, row: int, result) -> None:
        from engine.hub.search import check

        mem = self.total_memory
        self._relays.append(run_in_pool(
            lambda: check(result, total_memory=mem),
            on_done=lambda r: self._on_checked(seq, row, r),
            on_error=lambda msg: log.warning("checking %s failed: %s", result.repo_id, msg),
            parent=self))

    def _on_checked(self, seq: int, row: int, result) -> None:
        if seq != self._seq or row >= len(self.results):
            return
        self.results[row] = result
        self._fill(row, result)

    # ------------------------------------------------------------------ rows
    def _fill(self, i: int, r) -> None:
        mtp = {True: "yes", False: "no — cannot speculate", None: "checking…"}[r.has_mtp]
        if r.has_mtp is None and r.note:
            mtp = "?"
        quant = f"{r.quantization.get('bits')}-bit" if r.quantization else "bf16 / none"
        gated = ("gated — " if r.gated else "") + (r.license or "")
        cells = (r.repo_id, mtp, quant, fmt_bytes(r.download_bytes or r.size_bytes),
                 gated or "-", f"{r.downloads:,}", f"{r.likes:,}")
        mem = f"memory {fmt_gib(r.memory_needed_bytes)}" if r.memory_needed_bytes else ""
        tip = "\n".join(x for x in (r.repo_id, r.note or "", mem) if x)
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(tip)
            self.table.setItem(i, col, item)
        self.table.setCellWidget(i, 7, verdict_chip(r.verdict or ("gated" if r.gated and r.note
                                                                   else "unknown")))
        self.table.setCellWidget(i, 8, self._buttons(r))

    def _buttons(self, r) -> QWidget:
        w = QWidget(self.table)
        lay = QHBoxLayout(w)
        lay.setContentsMargins(2, 0, 2, 0)
        check = QPushButton("Check", w)
        check.setAccessibleName(f"Check {r.repo_id}")
        check.clicked.connect(lambda: self.check_requested.emit(r.repo_id))
        lay.addWidget(check)
        get = QPushButton("Download", w)
        get.setAccessibleName(f"Download {r.repo_id}")
        get.setEnabled(bool(r.supported) and r.verdict in ("recommended", "tight fit",
                                                             "too slow"))
        get.clicked.connect(lambda: self.download_requested.emit(
            r.repo_id, "main", None, {"download_bytes": r.download_bytes,
                                      "memory_bytes": r.memory_needed_bytes or 0}))
        lay.addWidget(get)
        return w
