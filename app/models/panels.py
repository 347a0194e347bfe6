"""Pieces of the model manager: formatting, the pre-check report, one download's row, a table of
models, a yes/no question, the Hugging Face token dialog."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QHBoxLayout, QHeaderView, QInputDialog,
                               QLabel, QLineEdit, QMessageBox, QProgressBar, QPushButton,
                               QTableWidget, QVBoxLayout, QWidget)

from app.models.jobs import DownloadJob
from app.models.units import fmt_bytes, fmt_gib  # noqa: F401  (the window's units)
from engine.hub import client as hub

VERDICT_COLORS = {"recommended": "#1e8e3e", "tight fit": "#c26401", "too slow": "#b3261e",
                  "not enough memory": "#d93025", "not enough disk": "#d93025",
                  "unknown": "#5f6368"}
STYLE = """
QLabel#verdict { border-radius: 9px; padding: 2px 8px; color: white; font-weight: 600; }
QLabel#stalled { color: #c26401; font-weight: 600; }
QLabel#rowError { color: #d93025; }
QLabel#muted { color: #6b7075; }
QFrame#downloadRow { border: 1px solid palette(mid); border-radius: 8px; }
QLabel#rowTitle { font-weight: 600; font-size: 13px; }
"""


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(s)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def model_table(parent: QWidget, columns: tuple[str, ...], accessible_name: str) -> QTableWidget:
    """A read-only table of models, one a row (selected whole), its first column stretched."""
    t = QTableWidget(0, len(columns), parent)
    t.setHorizontalHeaderLabels(columns)
    t.setAccessibleName(accessible_name)
    t.verticalHeader().setVisible(False)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return t


def ask_yes_no(parent: QWidget, title: str, text: str) -> bool:
    """A yes/no question (the model manager asks before deleting or downloading)."""
    answer = QMessageBox.question(parent, title, text)
    return answer == QMessageBox.StandardButton.Yes


def edit_token(parent: QWidget) -> bool:
    """Ask for the user's Hugging Face token and save it (returns whether one is set)."""
    tok, ok = QInputDialog.getText(
        parent, "Hugging Face token", "Token for gated models (from huggingface.co/settings/"
        "tokens; leave empty to forget it):", QLineEdit.EchoMode.Password,
        hub.saved_token() or "")
    if ok:
        hub.save_token(tok.strip() or None)
    return bool(ok and tok.strip())


def verdict_chip(verdict: str, parent: QWidget | None = None) -> QLabel:
    chip = QLabel(verdict, parent)
    chip.setObjectName("verdict")
    chip.setAlignment(Qt.AlignmentFlag.AlignCenter)
    chip.setStyleSheet(f"background: {VERDICT_COLORS.get(verdict, '#5f6368')};")
    chip.setAccessibleName(f"Verdict: {verdict}")
    return chip


def convert_options(report: dict) -> list[tuple[str, int | None, int]]:
    """(label, bits, memory bytes) choices for a checked repo: as published, and conversions
    when the repo is a raw unquantized checkpoint (8-/4-bit shrink the weights ~16/(b+0.5))."""
    from engine.hub.inspection import memory_needed

    mem = report["memory_needed_bytes"]
    opts: list[tuple[str, int | None, int]] = [("As published", None, mem)]
    if report.get("layout") == "hf" and not report.get("quantization"):
        text = {}  # cache size is already inside `mem`; scale only the weights
        for bits in (8, 4):
            w = int(report["weight_bytes"] * (bits + 0.5) / 16)
            opts.append((f"Convert to {bits}-bit", bits,
                         mem - memory_needed(report["weight_bytes"], text)
                         + memory_needed(w, text)))
    return opts


def report_html(r: dict) -> str:
    """The pre-check as rich text: what it is, MTP, sizes, memory and disk verdicts."""
    ok, warn, bad = "<b style='color:#1e8e3e'>✓</b>", "<b style='color:#c26401'>!</b>", \
        "<b style='color:#d93025'>✗</b>"
    e = html.escape
    lines = [f"<b>{e(r.get('repo_id') or r['source'])}</b> "
             f"<span style='color:gray'>@ {e(str(r.get('commit', ''))[:10])}</span>"]
    if r["supported"]:
        layout = {"hf": "raw Hugging Face layout", "mlx": "MLX layout"}.get(r["layout"], "")
        lines.append(f"{ok} {e(r['architecture'] or r['family'])} — supported ({layout})")
    for why in r["reasons"]:
        mark = warn if r["supported"] else bad
        lines.append(f"{mark} {e(why)}")
    if r["supported"] and r["has_mtp"]:
        lines.append(f"{ok} MTP head present ({r['mtp_layers']} layer): can speculate")
    if r.get("fix"):
        how, _, cmd = r["fix"].partition(": ")
        lines.append(f"&nbsp;&nbsp;&nbsp;Fix: {e(how)}: <code>{e(cmd)}</code>" if cmd
                     else f"&nbsp;&nbsp;&nbsp;Fix: {e(how)}")
    params = r.get("parameters")
    ptxt = f" · {params / 1e9:.2f} B parameters" if params and params >= 1e8 else \
        (f" · {params / 1e6:.2f} M parameters" if params else "")
    q = r.get("quantization")
    lines.append(f"Download {fmt_bytes(r.get('download_bytes', r['bytes']))}{ptxt} · "
                 f"{str(q.get('bits')) + '-bit' if q else 'not quantized'}")
    m = r["machine"]
    lines.append(f"Memory needed {fmt_gib(r['memory_needed_bytes'])} of "
                 f"{fmt_gib(m['total_memory_bytes'])}: "
                 f"<b style='color:{VERDICT_COLORS[m['verdict']]}'>{m['verdict']}</b>")
    disk = r.get("disk")
    if disk:
        color = VERDICT_COLORS["recommended" if disk["fits"] else "not enough disk"]
        lines.append(f"Disk: {fmt_bytes(disk['free_bytes'])} free — "
                     f"<b style='color:{color}'>{'enough' if disk['fits'] else 'not enough disk'}"
                     "</b>")
    return "".join(f"<p style='margin:0 0 5px 0'>{line}</p>" for line in lines)


class DownloadRow(QFrame):
    """One download: title, status line, progress bar, stall warning and its buttons.

    Signals: ``load_requested(str path)``, ``remove_requested(object job)``,
    ``token_requested(object job)`` (a gated repo: ask for a token, then retry).
    """

    load_requested = Signal(str)
    remove_requested = Signal(object)
    token_requested = Signal(object)

    def __init__(self, job: DownloadJob, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job = job
        self.setObjectName("downloadRow")
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        bits = f" → MLX {job.convert_bits}-bit" if job.convert_bits else ""
        rev = f" @ {job.revision}" if job.revision != "main" else ""
        self.title = QLabel(f"{job.repo_id}{rev}{bits}", self)
        self.title.setObjectName("rowTitle")
        top.addWidget(self.title, 1)
        self.buttons: dict[str, QPushButton] = {}
        for key, text in (("cancel", "Cancel"), ("resume", "Resume"), ("token", "Add token…"),
                          ("retry", "Retry"), ("load", "Load"), ("remove", "Remove")):
            b = QPushButton(text, self)
            b.setAccessibleName(f"{text} {job.repo_id}")
            top.addWidget(b)
            self.buttons[key] = b
        self.buttons["cancel"].clicked.connect(job.cancel)
        self.buttons["resume"].clicked.connect(job.start)
        self.buttons["retry"].clicked.connect(job.start)
        self.buttons["load"].clicked.connect(self._on_load)
        self.buttons["token"].clicked.connect(lambda: self.token_requested.emit(self.job))
        self.buttons["remove"].clicked.connect(lambda: self.remove_requested.emit(self.job))
        lay.addLayout(top)
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(True)
        self.bar.setAccessibleName(f"Download progress {job.repo_id}")
        lay.addWidget(self.bar)
        self.status = QLabel("", self)
        self.status.setAccessibleName(f"Download status {job.repo_id}")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.stall = QLabel("", self)
        self.stall.setObjectName("stalled")
        self.stall.setWordWrap(True)
        lay.addWidget(self.stall)
        job.progress.connect(self.refresh)
        job.finished.connect(self.refresh)
        job.failed.connect(self.refresh)
        self.refresh()

    def _on_load(self) -> None:
        if self.job.result is not None and self.job.result.path:
            self.load_requested.emit(self.job.result.path)

    def refresh(self, *_args) -> None:
        job, p = self.job, self.job.last
        state = job.state
        if p is not None and p.bytes_total:
            self.bar.setValue(int(1000 * min(1.0, p.fraction)))
            self.bar.setFormat(f"{100 * p.fraction:.0f}%")
        self.status.setText(self._status_text())
        self.status.setObjectName("rowError" if state == "failed" else "")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        stalled = state == "running" and p is not None and p.stalled
        self.stall.setVisible(stalled)
        if stalled:
            self.stall.setText(f"Stalled — no data for {fmt_duration(p.stalled_for_s)}. "
                               "It keeps retrying; you can also cancel and resume later.")
        running = state == "running"
        self.buttons["cancel"].setVisible(running)
        self.buttons["resume"].setVisible(state in ("cancelled", "queued") and not running)
        self.buttons["retry"].setVisible(state == "failed")
        self.buttons["token"].setVisible(state == "failed" and "token" in (job.error or ""))
        self.buttons["load"].setVisible(state == "done")
        self.buttons["remove"].setVisible(not running)

    def _status_text(self) -> str:
        job, p = self.job, self.job.last
        if job.state == "failed":
            return job.error or "failed"
        if p is None:
            return "Waiting to start" if job.state == "queued" else "Starting…"
        if job.state == "done":
            return f"Installed — {fmt_bytes(p.bytes_total)}" + (
                f" ({job.result.notes[0]})" if job.result and job.result.notes else "")
        if job.state in ("cancelled", "queued"):
            return (f"Paused at {fmt_bytes(p.bytes_done)} of {fmt_bytes(p.bytes_total)} — "
                    "Resume continues where it stopped")
        if p.phase == "converting":
            return f"Converting — {p.message or 'working'}"
        if p.phase in ("planning", "verifying", "installing"):
            return {"planning": "Listing files…", "verifying": "Verifying checksums…",
                    "installing": "Installing…"}[p.phase]
        file_txt = f" · file {min(p.files_done + 1, p.files_total)} of {p.files_total}" \
            if p.files_total else ""
        if p.file:
            file_txt += f" ({p.file})"
        resumed = f" · resumed {fmt_bytes(p.resumed_bytes)}" if p.resumed_bytes else ""
        retry = f" · {p.message}" if p.message.startswith("retrying") else ""
        return (f"{fmt_bytes(p.bytes_done)} of {fmt_bytes(p.bytes_total)} · "
                f"{fmt_bytes(p.speed_bps)}/s · ETA {fmt_duration(p.eta_s)}{file_txt}{resumed}"
                f"{retry}")
