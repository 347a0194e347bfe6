"""One line under the dashboard's memory meters: the loaded model's background warm-up
(``engine.core.warmup``: its batch shapes compiled ahead) and the process's memory against the
engine's budget (``engine.core.memory``).

``EngineLine.watch(status)``: ``status()`` returns the scheduler's ``status()`` dict (read from
the GUI thread every ``POLL_MS``; it only reads counters); the line is hidden while it says
nothing (no model, or a scripted fake).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel

from app.dashboard.charts import fmt_bytes

log = logging.getLogger(__name__)

POLL_MS = 500


def describe(status: dict) -> str:
    """The line's text for a scheduler ``status()`` dict ("" when there is nothing to say)."""
    parts = []
    warm = status.get("warmup") or {}
    if warm and not warm.get("finished"):
        parts.append(f"Warming up: {warm.get('done', 0)} of {warm.get('total', 0)} batch "
                     "shapes compiled (requests go first)")
    mem = status.get("memory") or {}
    if mem.get("budget_bytes"):
        used, budget = mem.get("resident_bytes", 0), mem["budget_bytes"]
        parts.append(f"Memory {fmt_bytes(used)} of the {fmt_bytes(budget)} budget "
                     f"({100 * used / budget:.0f}%; requests reserve "
                     f"{fmt_bytes(mem.get('reserved_bytes', 0))})")
    return " · ".join(parts)


class EngineLine(QLabel):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__("")
        self.setObjectName("muted")
        self.setWordWrap(True)
        self.hide()
        self._status: Callable[[], dict] | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.refresh)

    def watch(self, status: Callable[[], dict]) -> None:
        self._status = status
        self._timer.start()
        self.refresh()

    def refresh(self) -> None:
        try:
            text = describe(self._status() if self._status is not None else {})
        except Exception:  # noqa: BLE001 - a status read never breaks the dashboard
            log.debug("engine status unavailable", exc_info=True)
            text = ""
        self.setText(text)
        self.setVisible(bool(text))
