"""The model manager's "Add from Hugging Face" tab: a model id or link is checked before
anything is downloaded (architecture, MTP head, size, memory and disk), on the thread pool.

``AddPanel(parent, store_root=, total_memory=, free_space=)``; ``check(text=None)`` checks
``text`` (or the entry's text); ``download_requested(str repo, str revision, object bits)`` asks
for the checked model with the chosen option (``bits``: None, or a conversion to MLX).
``store_root`` is where downloads go (its disk is the one checked); set it when it changes.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QVBoxLayout, QWidget)

from app.models.jobs import run_in_pool
from app.models.panels import VERDICT_COLORS, convert_options, edit_token, fmt_gib, report_html
from engine.errors import EngineError
from engine.hub import client as hub


class AddPanel(QWidget):
    download_requested = Signal(str, str, object)

    def __init__(self, parent: QWidget | None = None, *, store_root: Path,
                 total_memory: int | None = None,
                 free_space: Callable[[Path], int] | None = None) -> None:
        super().__init__(parent)
        self.store_root = store_root
        self._total_memory = total_memory
        self._free_space = free_space
        self.report: dict | None = None
        self._check_seq = 0
        self._relays: list = []
        lay = QVBoxLayout(self)
        intro = QLabel("Paste a Hugging Face model id (org/name) or link. MTP Chat checks it "
                       "before downloading anything: architecture, MTP head, size, memory and "
                       "disk.", self)
        intro.setWordWrap(True)  # the window fits 900 px
        lay.addWidget(intro)
        lay.addLayout(self._build_entry())
        self.check_busy = QProgressBar(self)
        self.check_busy.setRange(0, 0)
        self.check_busy.setMaximumHeight(6)
        self.check_busy.setTextVisible(False)
        self.check_busy.hide()
        lay.addWidget(self.check_busy)
        self.report_label = QLabel("", self)
        self.report_label.setAccessibleName("Check result")
        self.report_label.setWordWrap(True)
        self.report_label.setTextFormat(Qt.TextFormat.RichText)
        self.report_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.report_label.setAlignment(Qt.AlignmentFlag.AlignTop)
        lay.addWidget(self.report_label)
        act = QHBoxLayout()
        self.option_combo = QComboBox(self)
        self.option_combo.setAccessibleName("Download option")
        self.download_button = QPushButton("Download", self)
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self._download_checked)
        act.addWidget(self.option_combo)
        act.addWidget(self.download_button)
        act.addStretch(1)
        lay.addLayout(act)
        self.option_combo.hide()
        lay.addStretch(1)

    def _build_entry(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.repo_edit = QLineEdit(self)
        self.repo_edit.setPlaceholderText("Qwen/Qwen3.5-4B or https://huggingface.co/…")
        self.repo_edit.setAccessibleName("Repository id or link")
        self.repo_edit.returnPressed.connect(lambda: self.check())
        self.rev_edit = QLineEdit(self)
        self.rev_edit.setPlaceholderText("main")
        self.rev_edit.setMaximumWidth(140)
        self.rev_edit.setAccessibleName("Revision")
        self.check_button = QPushButton("Check", self)
        self.check_button.clicked.connect(lambda: self.check())
        token = QPushButton("Hugging Face token…", self)
        token.clicked.connect(lambda: edit_token(self))
        for w in (self.repo_edit, self.rev_edit, self.check_button, token):
            row.addWidget(w, 1 if w is self.repo_edit else 0)
        return row

    def check(self, text: str | None = None) -> None:
        """Start a pre-check of ``text`` (or the entry's text) on the thread pool."""
        if text:
            self.repo_edit.setText(text)
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
        root, free_fn, mem = self.store_root, self._free_space, self._total_memory
        self._relays.append(run_in_pool(
            lambda: _precheck(repo, revision, root, free_fn, mem),
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
        from engine.hub.catalog import memory_verdict

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
        if r is not None:
            self.download_requested.emit(r["repo_id"], r["revision"],
                                         self.option_combo.currentData())


def _precheck(repo: str, revision: str, root: Path, free_fn, total_memory) -> dict:
    """Runs on the thread pool: inspect the repo and add disk and memory verdicts."""
    from engine.hub.catalog import DISK_MARGIN, free_disk, memory_verdict, warning_for
    from engine.hub.inspection import inspect_repo

    report = inspect_repo(repo, revision=revision)
    warn = warning_for(repo)
    if warn and warn not in report["reasons"]:
        report["reasons"].append(warn)
    free = (free_fn or free_disk)(root)
    report["disk"] = {"free_bytes": free, "fits": report["download_bytes"] * DISK_MARGIN <= free}
    report["machine"] = memory_verdict(report["memory_needed_bytes"], total_memory=total_memory)
    return report
