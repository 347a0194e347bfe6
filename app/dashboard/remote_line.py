"""The dashboard's line about a model served elsewhere (hidden for a local model).

An MTP Chat server sends its speculation figures with every reply (``mtp`` stats): the line
shows the last reply's depth, acceptance by position and tok/s from them (the tiles and the
header show the same ``ReplySummary``). Any other server sends none: the line shows the tok/s
measured here and says that MTP stats are not available for it. The session charts
(acceptance over time, waterfall, depth per cycle) need per-cycle stats, which only a local
engine gives."""
from __future__ import annotations

from urllib.parse import urlsplit

from PySide6.QtWidgets import QLabel

from app.remote.connections import is_remote, parse_remote_path
from engine.metrics.summary import ReplySummary
from engine.types import ModelInfo


def remote_text(info: ModelInfo | None, summary: ReplySummary | None) -> str:
    """The line's text; "" for a local model."""
    if info is None or not is_remote(info.path):
        return ""
    host = urlsplit(parse_remote_path(info.path)[0]).netloc
    mtp = summary is not None and summary.cycles > 0
    if summary is None:
        return (f"Served by {host}. Its figures appear after the first reply"
                + ("." if info.has_mtp else "; MTP stats are not available for this server."))
    if not mtp:
        return (f"Served by {host}: {summary.tokens_per_s:.1f} tok/s measured here. MTP stats "
                "are not available for this server.")
    rates = " · ".join(f"D{p.position} {p.rate:.0%}" for p in summary.positions
                       if p.rate is not None)
    acc = summary.draft_acceptance
    return (f"Served by {host} (MTP Chat): {summary.tokens_per_s:.1f} tok/s, depth up to "
            f"{summary.depth_max}, {summary.tokens_per_cycle:.2f} tokens per cycle, acceptance "
            f"{acc:.0%}" + (f" ({rates})" if rates else "") if acc is not None else
            f"Served by {host} (MTP Chat): {summary.tokens_per_s:.1f} tok/s, no drafts "
            "(depth 0).")


class RemoteLine(QLabel):
    def __init__(self) -> None:
        super().__init__("")
        self.setWordWrap(True)
        self.setAccessibleName("Remote server")
        self.hide()

    def show_summary(self, info: ModelInfo | None, summary: ReplySummary | None) -> None:
        text = remote_text(info, summary)
        self.setText(text)
        self.setVisible(bool(text))
