"""The dashboard's line about a model served elsewhere (hidden for a local model).

An MTP Chat server sends its speculation figures with every reply (``mtp`` stats): the line
shows the last reply's depth, acceptance by position and tok/s from them (the tiles and the
header show the same ``ReplySummary``). Any other server sends none: the line shows the tok/s
measured here and says that MTP stats are not available for it. The session charts
over time (waterfall, depth per cycle, speed series) need per-cycle stats, which only a local
engine gives; ``show_remote`` fills the gauge, the time-to-first-token and depth tiles and the
acceptance chart from the last reply instead, and names the server in the header."""
from __future__ import annotations

from urllib.parse import urlsplit

from PySide6.QtWidgets import QLabel

from app.dashboard.charts import band_colour

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


LOCAL_ONLY = "The tuner and the exactness check run on a model loaded here"


def show_remote(dash, info: ModelInfo | None, summary: ReplySummary | None) -> None:
    """Point ``dash`` (a ``DashboardWindow``) at a served model's figures; no-op when local."""
    dash.remote.show_summary(info, summary)
    if info is None or not is_remote(info.path):
        dash.acceptance.empty_text = "No drafts yet"
        for button in (dash.tune_button, dash.verify_button):
            if button.toolTip().startswith(LOCAL_ONLY):  # back from a served model
                button.setToolTip("")
                button.setEnabled(True)
        return
    host = urlsplit(parse_remote_path(info.path)[0]).netloc
    for button in (dash.tune_button, dash.verify_button):  # they measure the engine here
        button.setEnabled(False)
        button.setToolTip(f"{LOCAL_ONLY}; this one is served by {host}.")
    kind = "MTP Chat server" if info.has_mtp else "OpenAI-compatible server"
    dash.model_label.set_texts(f"{info.name} · served by {host} ({kind})",
                               f"{info.name} · {host}", info.name)
    mtp = summary is not None and summary.cycles > 0
    dash.acceptance.empty_text = ("No reply yet" if info.has_mtp and summary is None else
                                  "No drafts" if mtp else
                                  "MTP stats are not available for this server")
    if summary is None:
        return
    dash.gauge.set_value(summary.tokens_per_s, caption="server's figure" if mtp else
                         "measured here", dim=True, seen=summary.tokens_per_s)
    dash.gauge_sub.setText("last reply")
    dash.t_ttft.set(f"{1000 * summary.ttft_s:.0f} ms",
                    f"{summary.prompt_tokens} prompt tokens" if summary.prompt_tokens else "")
    if not mtp:
        dash.acceptance.set_bars([])
        return
    dash.t_depth.set(f"≤ {summary.depth_max}", "last reply, on the server")
    dash.acceptance.set_bars([(f"D{p.position}", p.rate, band_colour(p.rate), f"{p.rate:.2f}")
                              for p in summary.positions if p.rate is not None])
    dash.acceptance_sub.set_texts("last reply, from the server", "last reply")
