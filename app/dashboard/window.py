"""The live speculative-stats window: speed, acceptance, cycle timing, depth, memory, tuner.

Slots (connect the worker's signals to them):
- ``on_stats(request_id, obj)``: ``obj`` is a ``PrefillStats`` or ``CycleStats``; it only goes
  into a ``StatsAggregator`` (microseconds), never straight to the screen.
- ``on_finished(request_id, reason, summary)``: a reply ended; ``summary`` is its
  ``engine.metrics.summary.ReplySummary``.
- ``on_tune_progress(done, total, message)``, ``on_tune_finished(result)``,
  ``on_tune_failed(message)``: the tuner's run (a ``TunerView``).
- ``set_model_info(info)`` (None: no model), ``set_tuner_result(result)`` (a ``TuneResult`` or
  its dict).

The reply's own figures (the header, the "At a glance" tokens and tokens per cycle) are read
from a ``ReplySummary``: while a reply streams, one folded here by ``engine.metrics.summary.ReplyTally``
from its stats; once it ends, the worker's, so they equal the chat's stats line. Session-wide
figures (speed over time, acceptance by position, the waterfall) come from the
``StatsAggregator``.

Signals: ``tune_requested()`` and ``tune_cancel_requested()`` from the tuner card's button;
``verify_requested()`` and ``verify_cancel_requested()`` from its "Verify exactness" button.

The exactness check (``engine.decoding.verify`` on the worker thread) is ``verify``
(``verify_control.VerifyControl``): ``on_progress(done, total, message)``, ``on_done(result)``
(a ``VerifyResult`` or its dict: the verdict in words, green for a pass, red for a fail) and
``on_failed(message)``; ``attach_verifier(worker)`` wires the button and these slots to an
``app.worker.Worker``.

A ``QTimer`` repaints at most every ``REFRESH_MS`` and only when something changed (memory is
re-read every ``IDLE_REFRESH_MS`` while idle), so generation speed does not depend on the UI.
"""
from __future__ import annotations

import logging

import psutil
from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QFrame, QGridLayout, QHBoxLayout, QHeaderView, QLabel, QPushButton, QScrollArea, QTableWidget,
    QVBoxLayout, QWidget,
)

from app.dashboard.charts import (
    AMBER, BLUE, GREEN, GREY, RED, BarChart, DepthChart, Gauge, LineChart, Meter, Waterfall,
    band_colour, fmt_bytes,
)
from app.dashboard.engine_line import EngineLine
from app.dashboard.recorder import SessionRecord
from app.dashboard.remote_line import RemoteLine, show_remote
from app.dashboard.tuner_view import show_tuning
from app.dashboard.verify_control import VerifyControl
from app.elided_label import ElidedLabel
from app.window_state import fit_to_screen
from engine.hub import store
from engine.metrics.stats import StatsAggregator, StatsSnapshot
from engine.metrics.summary import ReplySummary
from engine.types import ModelInfo

log = logging.getLogger(__name__)

CHART_MIN_HEIGHT = 120  # the charts' own minimum (charts._Chart)
DEFAULT_SIZE = (1240, 770)  # fits a 1280×800 screen and shows every card without scrolling
MIN_WIDTH = 900
TUNER_IDLE_TEXT = "Run the tuner to compare depths"
REFRESH_MS = 300
IDLE_REFRESH_MS = 2000
IDLE = GREY.darker(150)  # the idle pill: white text stays readable on it (the chart grey is too light)
PHASES = ("draft", "verify", "accept", "commit", "sync wait", "other")
CARD_STYLE = """
QScrollArea, QWidget#content { background: palette(window); }
QFrame#card { background: palette(base); border: 1px solid palette(midlight);
              border-radius: 10px; }
QLabel#cardTitle { font-weight: 600; }
QLabel#muted, QLabel#tileCaption { color: palette(placeholder-text); }
QLabel#tileValue { font-size: 17pt; font-weight: 600; }
QLabel#pill { border-radius: 9px; padding: 2px 10px; color: white; font-weight: 600; }
QLabel#verdict { border-radius: 6px; padding: 4px 6px; }
"""


def _card(title: str, body: QWidget | None = None, *, subtitle: str = "") -> tuple[QFrame, QVBoxLayout, QLabel]:
    frame = QFrame()
    frame.setObjectName("card")
    lay = QVBoxLayout(frame)
    lay.setContentsMargins(12, 10, 12, 10)
    lay.setSpacing(4)
    head = QHBoxLayout()
    t = QLabel(title)
    t.setObjectName("cardTitle")
    head.addWidget(t)
    sub = ElidedLabel(subtitle)
    sub.setObjectName("muted")
    sub.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    head.addWidget(sub, 1)
    lay.addLayout(head)
    if body is not None:
        lay.addWidget(body, 1)
    frame.setAccessibleName(title)
    return frame, lay, sub


def _muted_label(name: str, into: QVBoxLayout) -> ElidedLabel:
    """A hidden muted line added to ``into`` (shown once it has something to say)."""
    label = ElidedLabel("")
    label.setObjectName("muted")
    label.setAccessibleName(name)
    label.hide()
    into.addWidget(label)
    return label


class _CompactTable(QTableWidget):
    """A table that asks for no more height than its minimum (the card's stretch gives more)."""

    def sizeHint(self):  # noqa: N802 (Qt name)
        hint = super().sizeHint()
        hint.setHeight(self.minimumHeight())
        return hint


class _Tile(QWidget):
    """A caption, a big value and a note. ``widest``: (value, note) samples the tile keeps room
    for from the start, so the cards' minimum width (the window's) does not grow as figures come."""

    def __init__(self, caption: str, widest: tuple[str, str] = ("", "")) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setObjectName("tileCaption")
        self.value = QLabel("–")
        self.value.setObjectName("tileValue")
        self.note = QLabel("")
        self.note.setObjectName("muted")
        for w in (self.caption, self.value, self.note):
            lay.addWidget(w)
        self.setAccessibleName(caption)
        self._widest = widest

    def reserve(self) -> None:
        """Keep room for the widest figures (once the style sheet's fonts apply)."""
        value, note = self._widest
        self.ensurePolished()
        for label, sample in ((self.value, value), (self.note, note)):
            label.ensurePolished()
            if sample:
                label.setMinimumWidth(label.fontMetrics().horizontalAdvance(sample) + 2)

    def set(self, value: str, note: str = "") -> None:
        self.value.setText(value)
        self.note.setText(note)


def _tuner_table() -> QTableWidget:
    """The tuner card's table: a row per depth (read-only, compact rows)."""
    table = _CompactTable(0, 5)
    table.setHorizontalHeaderLabels(
        ["Depth", "tok/s", "Speed-up", "Tokens/cycle", "Acceptance rate by position"])
    table.verticalHeader().setVisible(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
    table.setAccessibleName("Tuner results")
    table.verticalHeader().setDefaultSectionSize(22)
    table.setMinimumHeight(4 * 22 + 28)  # the header and D0..D3
    return table


def _header(clear_stats) -> tuple[QHBoxLayout, ElidedLabel, QLabel]:
    """Title, model (shortened to fit: name and depth, then the name), status and Clear."""
    lay = QHBoxLayout()
    title = QLabel("Speculative decoding")
    title.setStyleSheet("font-size: 16pt; font-weight: 700;")
    lay.addWidget(title)
    model_label = ElidedLabel("no model loaded")
    model_label.setObjectName("muted")
    model_label.setAccessibleName("Model")
    lay.addWidget(model_label, 1)
    status = QLabel("idle")
    status.setObjectName("pill")
    status.setAlignment(Qt.AlignmentFlag.AlignCenter)
    status.setMinimumWidth(status.fontMetrics().horizontalAdvance("generating") + 36)
    status.setAccessibleName("Generation status")
    lay.addWidget(status)
    clear = QPushButton("Clear")
    clear.setToolTip("Forget the statistics gathered so far")
    clear.clicked.connect(clear_stats)
    lay.addWidget(clear)
    return lay, model_label, status


class DashboardWindow(QWidget):
    """See the module docstring."""

    tune_requested = Signal()
    tune_cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None, *,
                 aggregator: StatsAggregator | None = None,
                 record: SessionRecord | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("MTP Chat — Speculative decoding dashboard")
        self.setStyleSheet(CARD_STYLE)
        self.record = record or SessionRecord(aggregator)
        self.info: ModelInfo | None = None
        self.tuner: dict | None = None
        self.last_snapshot: StatsSnapshot | None = None
        self.refreshes = 0
        self._dirty = True
        self._tuning = False
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self._tick)
        self._idle_ticks = 0
        self._timer.start()
        fit_to_screen(self, DEFAULT_SIZE)

    # -- the session's figures (kept by ``self.record``) -------------------------------------
    @property
    def aggregator(self) -> StatsAggregator:
        return self.record.aggregator

    @property
    def last_summary(self) -> ReplySummary | None:
        return self.record.last_summary

    @property
    def request_id(self) -> int | None:
        return self.record.request_id

    # -- layout ----------------------------------------------------------------------------
    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

        content = QWidget()
        content.setObjectName("content")
        scroll.setWidget(content)
        outer.addWidget(scroll)
        grid = QGridLayout(content)
        grid.setContentsMargins(14, 12, 14, 14)
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(12)
        grid.addLayout(self._header(), 0, 0, 1, 6)
        self.gauge = Gauge()
        gauge_card, _, self.gauge_sub = _card("Decode speed", self.gauge)
        grid.addWidget(gauge_card, 1, 0, 1, 2)
        grid.addWidget(self._tiles_card(), 1, 2, 1, 2)
        grid.addWidget(self._memory_card(), 1, 4, 1, 2)
        self.series = LineChart()
        card, _, self.series_sub = _card("Tokens per second, last 5 minutes", self.series)
        grid.addWidget(card, 2, 0, 1, 4)
        self.acceptance = BarChart(ymax=1.0, bands=True)
        self.acceptance.empty_text = "No drafts yet"
        self.acceptance.note_label = "overall"
        self.acceptance.setToolTip("Acceptance rate: drafts accepted at a position over drafts "
                                   "made there (smoothed; below each bar, over the session).")
        card, _, self.acceptance_sub = _card("Acceptance rate by draft position", self.acceptance,
                                             subtitle="smoothed")
        grid.addWidget(card, 2, 4, 1, 2)
        self.histogram = BarChart(fmt="{:.0%}", axis_fmt="{:.0%}")
        self.histogram.empty_text = "No drafts yet"
        card, lay, self.histogram_sub = _card("Accepted drafts per cycle", self.histogram)
        self.by_context = _muted_label("Tokens per cycle by context length", lay)
        grid.addWidget(card, 3, 0, 1, 2)
        self.waterfall = Waterfall()
        card, _, self.waterfall_sub = _card("Verify waterfall", self.waterfall)
        grid.addWidget(card, 3, 2, 1, 2)
        self.depth_chart = DepthChart()
        card, _, self.depth_sub = _card("Depth per cycle", self.depth_chart)
        grid.addWidget(card, 3, 4, 1, 2)
        grid.addWidget(self._tuner_card(), 4, 0, 1, 6)
        for row, stretch in ((1, 3), (2, 3), (3, 3), (4, 3)):
            grid.setRowStretch(row, stretch)
        for col in range(6):
            grid.setColumnStretch(col, 1)
        for tile in (self.t_ttft, self.t_prefill, self.t_cycle, self.t_extra, self.t_depth,
                     self.t_tokens):
            tile.reserve()
        # Never narrower than the cards' content (nothing is cut off at the right edge, which
        # has no scroll bar), and not below MIN_WIDTH where the cards get cramped.
        fit = content.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width()
        self.setMinimumWidth(max(MIN_WIDTH, fit))

    def _header(self) -> QHBoxLayout:
        lay, self.model_label, self.status = _header(self.clear)
        return lay

    def _tiles_card(self) -> QFrame:
        # the subtitle is the last reply's line (shortened to fit the card)
        card, lay, self.summary_label = _card("At a glance", subtitle="last reply")
        self.summary_label.setAccessibleName("Last reply")
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        self.t_ttft = _Tile("Time to first token", ("9999 ms", "99999 prompt tokens"))
        self.t_prefill = _Tile("Prefill", ("9999 tok/s", "99999 reused from cache"))
        self.t_cycle = _Tile("Tokens per cycle", ("9.99", "9.99 drafts accepted"))
        self.t_extra = _Tile("Correction / bonus", ("9999 / 9999", "100% all drafts kept"))
        self.t_depth = _Tile("Depth now", ("9", ""))
        self.t_tokens = _Tile("Tokens", ("99999", "9999 cycles, last reply"))
        # the two widest tiles share a column (the card's width is the dashboard's minimum)
        for i, t in enumerate((self.t_ttft, self.t_prefill, self.t_cycle, self.t_depth,
                               self.t_extra, self.t_tokens)):
            grid.addWidget(t, i // 3, i % 3)
        lay.addLayout(grid)
        self.context = Meter("Context")
        lay.addWidget(self.context)
        self.remote = RemoteLine()  # a model served elsewhere: its server's figures
        lay.addWidget(self.remote)
        return card

    def _memory_card(self) -> QFrame:
        card, lay, self.memory_sub = _card("Memory")
        self.m_active, self.m_peak = Meter("MLX active"), Meter("MLX peak")
        self.m_rss, self.m_system = Meter("Process"), Meter("System")
        self.m_weights = Meter("Weights")
        for m in (self.m_weights, self.m_active, self.m_peak, self.m_rss, self.m_system):
            lay.addWidget(m)
        self.memory_note = QLabel("")
        self.memory_note.setObjectName("muted")
        self.memory_note.setWordWrap(True)
        lay.addWidget(self.memory_note)
        self.engine_line = EngineLine()  # warm-up and the memory budget (watch(status))
        lay.addWidget(self.engine_line)
        lay.addStretch(1)
        return card

    def _tuner_card(self) -> QFrame:
        card, lay, self.tuner_sub = _card("Depth tuner", subtitle="not run on this machine yet")
        row = QHBoxLayout()
        self.tuner_table = _tuner_table()
        row.addWidget(self.tuner_table, 3)
        self.tuner_chart = BarChart(fmt="{:.1f}", min_height=110)
        self.tuner_chart.empty_text = TUNER_IDLE_TEXT
        row.addWidget(self.tuner_chart, 2)
        side = QVBoxLayout()
        self.tune_button = QPushButton("Run tuner")
        self.tune_button.setAccessibleName("Run the depth tuner")
        self.tune_button.clicked.connect(self._on_tune_clicked)
        side.addWidget(self.tune_button)
        self.verify = VerifyControl(self, tuning=lambda: self._tuning,
                                    enable_tuner=self.tune_button.setEnabled)
        self.verify_button, self.verify_label = self.verify.button, self.verify.label
        side.addWidget(self.verify_button)
        self.tuner_message = QLabel("Measures plain decoding against depths 1..N on this "
                                    "machine and keeps a depth only if it is faster.")
        self.tuner_message.setWordWrap(True)
        self.tuner_message.setObjectName("muted")
        side.addWidget(self.tuner_message, 1)
        row.addLayout(side, 1)
        lay.addLayout(row, 1)
        lay.addWidget(self.verify_label)
        return card

    # -- slots -----------------------------------------------------------------------------
    @Slot(int, object)
    def on_stats(self, request_id: int, obj: object) -> None:
        """Cheap: record and mark dirty; the timer repaints."""
        if self.record.add_stats(request_id, obj):
            self._dirty = True

    @Slot(int, str, object)
    def on_finished(self, request_id: int, reason: str, summary: ReplySummary) -> None:
        self.record.finish(reason, summary)
        self._dirty = True

    def reply_summary(self) -> ReplySummary | None:
        """The reply the header and "At a glance" describe: the one streaming (as folded so
        far; its first token arrives with the final summary), else the last one."""
        return self.record.reply_summary()

    @Slot(int, int, str)
    def on_tune_progress(self, done: int, total: int, message: str) -> None:
        self._set_tuning(True)
        self.tuner_sub.setText(f"running: {done}/{total}")
        self.tuner_message.setText(message)
        self._tuner_progress(f"Measuring depths… {done} of {total} runs done" if total
                             else "Measuring depths…")

    @Slot(str)
    def on_tune_failed(self, message: str) -> None:
        self._set_tuning(False)
        self.tuner_sub.setText("tuning failed")
        self.tuner_message.setText(message)
        self._tuner_progress(None)

    def set_model_info(self, info: ModelInfo | None) -> None:
        """Show the model, and the tuner result saved for it on this machine (if any)."""
        self.info = info
        self._dirty = True
        if info is None:
            self.model_label.setText("no model loaded")
            return
        mtp = f"MTP depth ≤ {info.max_depth}" if info.has_mtp else "no MTP head"
        self.model_label.set_texts(f"{info.name} · {info.family} · {mtp}", f"{info.name} · {mtp}",
                                   info.name)
        if not self._tuning:
            self.set_tuner_result(_saved_tuning(info.path))

    def on_tune_finished(self, result) -> None:
        self.set_tuner_result(result)

    def set_tuner_result(self, result) -> None:
        """A ``TuneResult`` (or its ``to_dict()``, e.g. read back from the store); None clears."""
        self._set_tuning(False)
        self.tuner = result.to_dict() if hasattr(result, "to_dict") else result
        self._show_tuner()

    def clear(self) -> None:
        self.record.clear()
        self.gauge.reset_scale()
        self._dirty = True
        self.refresh()

    # -- the exactness check (``verify_control.VerifyControl``) ------------------------------
    def attach_verifier(self, worker) -> None:
        """Wire the "Verify exactness" button to ``worker`` (an ``app.worker.Worker``)."""
        self.verify.attach(worker)

    @property
    def verify_result(self) -> dict | None:
        return self.verify.result

    def _on_tune_clicked(self) -> None:
        if self._tuning:
            self.tune_cancel_requested.emit()
        else:
            self._set_tuning(True)
            self.tuner_message.setText("Starting…")
            self._tuner_progress("Starting the tuner…")
            self.tune_requested.emit()

    def _set_tuning(self, on: bool) -> None:
        self._tuning = on
        self._dirty = True
        self.tune_button.setText("Cancel tuning" if on else "Run tuner")
        self.verify.tuning_changed(on)  # one engine job at a time
        if not on:
            self._tuner_progress(None)

    def _tuner_progress(self, text: str | None) -> None:
        """What the tuner chart says while it has no bars: progress while a run goes on."""
        self.tuner_chart.empty_text = text or TUNER_IDLE_TEXT
        self.tuner_chart.update()

    def _tick(self) -> None:
        self._idle_ticks += 1
        if not self.isVisible():
            return
        if self._dirty or self._idle_ticks * REFRESH_MS >= IDLE_REFRESH_MS:
            self.refresh()

    # -- painting --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Take a snapshot and push it into the widgets (the only place that reads stats)."""
        self._dirty = False
        self._idle_ticks = 0
        s = self.aggregator.snapshot()
        self.last_snapshot = s
        self.refreshes += 1
        self._show_speed(s)
        self._show_tiles(s)
        self._show_acceptance(s)
        self._show_cycle(s)
        self._show_memory(s)
        show_remote(self, self.info, self.last_summary)  # a served model: its server's figures

    def _show_speed(self, s: StatsSnapshot) -> None:
        live = s.active
        state = "generating" if live else "tuning" if self._tuning else "idle"
        self.status.setText(state)
        self.status.setStyleSheet(
            f"background: {(GREEN if live else AMBER if self._tuning else IDLE).name()};")
        caption = f"5-min average {s.tps_window:.1f}" if s.tps_window else "no recent decoding"
        seen = [s.tps_instant, s.tps_window, *(y for _, y in s.tps_series)]
        if self.last_summary is not None and self.last_summary.tokens_per_s:
            seen.append(self.last_summary.tokens_per_s)
        self.gauge.set_value(s.tps_instant, caption=caption, dim=not live, seen=max(seen))
        # The gauge is the recent cycles' rate; the whole reply's tok/s is the header's.
        self.gauge_sub.setText("live" if live else "recent cycles")
        self.series.set_series([("decode tok/s", BLUE, s.tps_series)], now=s.elapsed,
                               reference=("5-min average", s.tps_window) if s.tps_window else None)
        replies, tokens = self.record.totals()
        self.series_sub.setText(f"{tokens} tokens in {replies} "
                                f"{'reply' if replies == 1 else 'replies'}")
        if not live and self.last_summary is not None:
            m = self.last_summary
            self.summary_label.set_texts(reply_headline(m),
                                         f"last reply: {m.tokens} tokens, {m.tokens_per_s:.1f} tok/s",
                                         f"{m.tokens} tokens, {m.tokens_per_s:.1f} tok/s", "last reply")

    def _show_tiles(self, s: StatsSnapshot) -> None:
        self.t_ttft.set(f"{1000 * s.ttft_s:.0f} ms" if s.ttft_s is not None else "–",
                        f"{s.prompt_tokens} prompt tokens" if s.prompt_tokens else "")
        self.t_prefill.set(f"{s.prefill_tps:.0f} tok/s" if s.prefill_tps else "–",
                           f"{s.reused_tokens} reused from cache" if s.reused_tokens else "")
        r = self.reply_summary()
        self.t_cycle.set(f"{r.tokens_per_cycle:.2f}" if r and r.cycles else "–",
                         f"{r.accepted_per_cycle:.2f} drafts accepted"
                         if r and r.speculative_cycles else "")
        total = s.corrections + s.bonuses
        self.t_extra.set(f"{s.corrections} / {s.bonuses}" if total else "–",
                         f"{100 * s.bonuses / total:.0f}% all drafts kept" if total else "")
        last = s.depth_history[-1] if s.depth_history else None
        self.t_depth.set(str(s.current_depth) if s.current_depth is not None else "–",
                         last.reason if last and last.reason else "")
        together = f" · batch of {s.batch_rows}" if s.batch_rows > 1 else ""
        self.t_tokens.set(str(r.tokens) if r else "–",
                          f"{r.cycles} cycles, last reply{together}" if r else "")
        ctx = self.info.context_length if self.info else 0
        if ctx:
            frac = s.context_tokens / ctx
            self.context.set_value(frac, f"{s.context_tokens:,} / {ctx:,}",
                                   RED if frac > 0.9 else AMBER if frac > 0.75 else BLUE)
        else:
            self.context.set_value(0.0, f"{s.context_tokens:,} tokens")

    def _show_acceptance(self, s: StatsSnapshot) -> None:
        bars = [(f"D{p.position}", p.smoothed, band_colour(p.smoothed), f"{p.rate:.2f}")
                for p in s.positions]
        self.acceptance_sub.setToolTip("\n".join(
            f"D{p.position}: acceptance rate {p.rate:.2f} · conditional acceptance "
            f"{p.conditional:.2f} (accepted when D1..D{p.position - 1} were)"
            for p in s.positions))
        self.acceptance.set_bars(bars)
        if s.positions:
            expected = 1 + sum(p.smoothed for p in s.positions)
            self.acceptance_sub.set_texts(
                f"smoothed · ≈{expected:.2f} tok/cycle at D{len(s.positions)}",
                f"≈{expected:.2f} tok/cycle at D{len(s.positions)}", f"≈{expected:.2f} tok/cycle")
        n = sum(s.accepted_hist)
        colours = [RED] + [AMBER] * max(0, len(s.accepted_hist) - 2) + [GREEN]
        self.histogram.set_bars([(str(k), c / n if n else 0.0, colours[min(k, len(colours) - 1)],
                                  f"{c}") for k, c in enumerate(s.accepted_hist)])
        self.histogram_sub.set_texts(f"{s.spec_cycles} cycles this session" if n else "",
                                     f"{s.spec_cycles} cycles" if n else "")
        show_by_context(self.by_context, self.histogram, s)

    def _show_cycle(self, s: StatsSnapshot) -> None:
        tr = s.time_recent
        self.waterfall.set_phases(list(zip(PHASES, (tr.draft, tr.verify, tr.accept, tr.commit,
                                                    tr.sync, tr.other))))
        self.waterfall_sub.set_texts(f"recent cycles · {1000 * tr.total:.1f} ms each"
                                     if tr.total else "", f"{1000 * tr.total:.1f} ms each"
                                     if tr.total else "")
        self.waterfall.setToolTip(
            "Profiled: each phase synchronised on its own." if s.profiled else
            "One host sync per cycle: 'sync wait' is the wait for the device at that sync (work "
            "queued by every phase finishes there); the other bars are host time. Turn on "
            "profiling for a true split.")
        max_depth = self.info.max_depth if self.info and self.info.max_depth else 3
        self.depth_chart.set_points([(p.seq, p.depth, p.reason) for p in s.depth_history],
                                    max_depth=max_depth)
        last = s.depth_history[-1] if s.depth_history else None
        self.depth_sub.setText(f"now D{last.depth}: {last.reason}" if last and last.reason
                               else "")

    def _show_memory(self, s: StatsSnapshot) -> None:
        m = s.memory
        vm = psutil.virtual_memory()
        total = vm.total
        weights = self.info.bytes_on_disk if self.info else None

        def colour(frac: float):
            return RED if frac > 0.85 else AMBER if frac > 0.7 else BLUE

        for meter, value in ((self.m_weights, weights),
                             (self.m_active, m.active_bytes if m else None),
                             (self.m_peak, m.peak_bytes if m else None),
                             (self.m_rss, m.rss_bytes if m else None)):
            frac = (value or 0) / total
            meter.set_value(frac, fmt_bytes(value), colour(frac))
        used = 1 - vm.available / total
        self.m_system.set_value(used, f"{100 * used:.0f}% in use", colour(used))
        self.memory_sub.setText(f"of {fmt_bytes(total)}")
        if used > 0.85:
            note = "Memory pressure: close other apps or choose a smaller model."
        elif m is None or m.active_bytes is None:
            note = "MLX figures appear once a model runs."
        else:
            note = f"Peak is {fmt_bytes(m.peak_bytes)}: {fmt_bytes(vm.available)} still available."
        self.memory_note.setText(note)

    def _show_tuner(self) -> None:
        show_tuning(self.tuner, table=self.tuner_table, chart=self.tuner_chart,
                    sub=self.tuner_sub, message=self.tuner_message)

def show_by_context(label: ElidedLabel, chart: QWidget, s: StatsSnapshot) -> None:
    """Tokens a cycle by context band under the histogram ``chart``, once the session spans two
    bands or more: whether drafting holds up as a conversation grows (details in the tooltip).
    The chart gives up the line's height, so the card asks for no more room than before."""
    bands = s.by_context
    shown = len(bands) >= 2
    if shown == label.isHidden():
        label.setVisible(shown)
        chart.setMinimumHeight(CHART_MIN_HEIGHT - (label.sizeHint().height() + 4 if shown else 0))
    if not shown:
        return
    label.set_texts("Tokens per cycle by context: "
                    + " · ".join(f"{b.label} {b.tokens_per_cycle:.2f}" for b in bands),
                    "By context: " + " · ".join(f"{b.label} {b.tokens_per_cycle:.1f}"
                                                for b in bands),
                    " · ".join(f"{b.label} {b.tokens_per_cycle:.1f}" for b in bands))
    label.setToolTip("\n".join(
        f"context {b.label} tokens: {b.cycles} cycles, {b.tokens_per_cycle:.2f} tokens a "
        f"cycle, {b.acceptance:.0%} of drafts accepted" for b in bands
        if b.acceptance is not None))


def reply_headline(m: ReplySummary | None) -> str:
    """The header's line about the last reply (figures as in the chat's stats line)."""
    if m is None:
        return ""
    acceptance = (f", acceptance rate {m.draft_acceptance:.0%}"
                  if m.depth_max and m.draft_acceptance is not None else "")
    return (f"last reply: {m.tokens} tokens, {m.tokens_per_s:.1f} tok/s{acceptance}, "
            f"{m.finish_reason or ''}")


def _saved_tuning(model_path: str) -> dict | None:
    try:
        return store.read_tuned(model_path)
    except Exception:  # a broken store file must not break the dashboard
        log.warning("could not read the saved tuning of %s", model_path, exc_info=True)
        return None
