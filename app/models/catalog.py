"""The model manager's catalog page: curated MTP-capable models with verdicts for this machine
(memory, disk, and speed from the machine's measured bandwidth).

Signals: ``check_requested(str repo_id)`` and
``download_requested(str repo_id, str revision, object bits_or_None, dict option)``.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from app.models.panels import fmt_bytes, fmt_gib, model_table, verdict_chip
from engine.errors import EngineError

CATALOG_COLUMNS = ("Model", "Parameters", "Download", "Memory", "Best choice", "Speed here",
                   "Verdict", "")
VERDICT_COL, BUTTONS_COL = 6, 7
# The footer, in the window's own terms (the catalog file's notes name command lines).
NOTES = (
    "Sizes and memory needs are estimates from each model's published configuration: Check "
    "reads the exact figures from Hugging Face before anything is downloaded.",
    "Official models come in bf16 (DeepSeek-V3 in fp8) with their MTP head; for 8-bit or "
    "4-bit, Download converts them on this computer after the download and keeps the MTP "
    "head (GLM, DeepSeek and Qwen3-Next keep the download beside the conversion).",
    "Memory needed = text weights + 10% + caches for 8k tokens + 0.5 GB.",
    "No MLX build that keeps the MTP head is verified yet, so none is listed: Check any MLX "
    "model (Add from Hugging Face) before downloading it.",
)


class CatalogPanel(QWidget):
    check_requested = Signal(str)
    download_requested = Signal(str, str, object, dict)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.catalog: dict | None = None
        self._build()

    def _build(self) -> None:
        page = self
        lay = QVBoxLayout(page)
        self.machine_label = QLabel("", page)
        self.machine_label.setAccessibleName("This machine")
        self.machine_label.setWordWrap(True)  # a long models folder must not widen the window
        lay.addWidget(self.machine_label)
        self.table = model_table(page, CATALOG_COLUMNS, "Model catalog")
        self.table.verticalHeader().setDefaultSectionSize(34)
        self.table.setWordWrap(False)
        # elide in the middle: "…-A3B-Instruct" and "…-A3B-Thinking" must stay apart
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        hdr = self.table.horizontalHeader()
        for col in range(1, len(CATALOG_COLUMNS)):
            hdr.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        lay.addWidget(self.table, 1)
        self.notes = QLabel("", page)
        self.notes.setWordWrap(True)
        self.notes.setObjectName("muted")
        lay.addWidget(self.notes)

    def refresh(self, *, store_root, total_memory: int | None = None,
                free_space=None, machine: dict | None = None) -> None:
        from engine.hub.catalog import catalog_for_machine

        try:
            cat = catalog_for_machine(store_root=store_root, total_mem=total_memory,
                                      free_fn=free_space, machine=machine)
        except EngineError as exc:
            self.machine_label.setText(str(exc))
            return
        self.catalog = cat
        m = cat["machine"]
        bw = m.get("bandwidth_bytes_per_s")
        self.machine_label.setText(
            f"<b>{m['name']}:</b> {fmt_gib(m['total_memory_bytes'])} memory · "
            + (f"{bw / 1e9:.0f} GB/s measured memory bandwidth · " if bw else "")
            + f"{fmt_bytes(m['free_disk_bytes'])} free on the disk holding {m['store']}")
        t = self.table
        t.setRowCount(len(cat["models"]))
        for row, e in enumerate(cat["models"]):
            best = next((o for o in e["options"] if o["quantization"] == e["best_quantization"]),
                        {})
            q = e["best_quantization"] or "-"
            choice = {"bf16": "bf16 as published"}.get(q, f"{q[:-3]}-bit (convert)")
            tok_s = best.get("estimated_tok_s")
            cells = (e["repo_id"], f"{e['parameters_b']:g} B" + (" MoE" if e.get("moe") else ""),
                     fmt_bytes(best.get("download_bytes")), fmt_gib(best.get("memory_bytes", 0)),
                     choice, f"≈ {tok_s:g} tok/s" if tok_s else "–")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(self._options_tooltip(e))
                t.setItem(row, col, item)
            t.setCellWidget(row, VERDICT_COL, _padded(verdict_chip(e["verdict"])))
            t.setCellWidget(row, BUTTONS_COL, self._buttons(e, best))
        self.notes.setText(" ".join(NOTES))

    @staticmethod
    def _options_tooltip(e: dict) -> str:
        def speed(o: dict) -> str:
            return f", about {o['estimated_tok_s']:g} tok/s here" if o.get("estimated_tok_s") \
                else ""
        return e["repo_id"] + "\n" + "\n".join(f"{o['quantization']}: memory {fmt_gib(o['memory_bytes'])}, disk "
                         f"{fmt_bytes(o['disk_needed_bytes'])}{speed(o)} — {o['verdict']}"
                         for o in e["options"])

    def _buttons(self, e: dict, best: dict) -> QWidget:
        w = QWidget(self.table)
        lay = QHBoxLayout(w)
        lay.setContentsMargins(2, 0, 2, 0)
        check = QPushButton("Check", w)
        check.setAccessibleName(f"Check {e['repo_id']}")
        check.clicked.connect(lambda: self.check_requested.emit(e["repo_id"]))
        get = QPushButton("Download", w)
        get.setAccessibleName(f"Download {e['repo_id']}")
        fits = e["verdict"] in ("recommended", "tight fit", "too slow")
        get.setEnabled(fits)
        get.setToolTip(download_tooltip(best) if fits else f"{e['verdict']} on this machine")
        bits = best.get("bits") if best.get("needs_conversion") else None
        get.clicked.connect(lambda: self.download_requested.emit(e["repo_id"], "main", bits, best))
        lay.addWidget(check)
        lay.addWidget(get)
        return w


def download_tooltip(best: dict) -> str:
    """What Download does, in words: size, and the conversion it runs afterwards."""
    size = fmt_bytes(best.get("download_bytes"))
    if best.get("needs_conversion"):
        q = str(best.get("quantization", "")).removesuffix("bit")
        return f"Download {size}, then convert it to {q}-bit on this computer (keeps the MTP head)"
    return f"Download {size}"


def _padded(widget: QWidget) -> QWidget:
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(6, 4, 6, 4)
    lay.addWidget(widget)
    return box
