"""Small QPainter charts for the dashboard: gauge, line, bars, waterfall, depth steps, meters.

Each widget holds plain data set through a ``set_*`` method and repaints on demand; painting
never computes statistics. Colours follow the palette (light or dark) via ``theme()``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

GREEN, AMBER, RED = QColor("#22a565"), QColor("#e8a317"), QColor("#e0524a")
BLUE, PURPLE, TEAL = QColor("#3b82f6"), QColor("#8b5cf6"), QColor("#14b8a6")
GREY, PINK = QColor("#94a3b8"), QColor("#ec4899")
# draft, verify, accept, commit, sync wait, other
PHASE_COLOURS = (PURPLE, BLUE, AMBER, TEAL, PINK, GREY)


@dataclass(frozen=True)
class Theme:
    text: QColor
    muted: QColor
    grid: QColor
    track: QColor
    dark: bool


def theme(widget: QWidget) -> Theme:
    pal = widget.palette()
    text = pal.color(QPalette.ColorRole.WindowText)
    dark = pal.color(QPalette.ColorRole.Window).lightness() < 128
    muted = QColor(text)
    muted.setAlpha(150)
    grid = QColor(text)
    grid.setAlpha(28)
    track = QColor(text)
    track.setAlpha(20)
    return Theme(text, muted, grid, track, dark)


def band_colour(rate: float) -> QColor:
    """Acceptance colour bands: green from 0.7, amber from 0.4, red below."""
    return GREEN if rate >= 0.7 else AMBER if rate >= 0.4 else RED


def nice_ceiling(x: float) -> float:
    """1, 2, 2.5, 5 x 10^n at or above x (axis maxima)."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= x - 1e-12:
            return m * p
    return 10 * p


GAUGE_STEPS = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)


def gauge_ceiling(x: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^n at or above ``x`` (a gauge's
    maximum: finer steps than an axis, so the arc is not mostly empty); at least 10."""
    if x <= 10:
        return 10.0
    p = 10 ** math.floor(math.log10(x))
    for m in GAUGE_STEPS:
        if m * p >= x - 1e-9:
            return float(m * p)
    return 10.0 * p


def fmt_bytes(n: int | None) -> str:
    """Decimal GB/MB/KB, as every other size in the app (and macOS Finder)."""
    if n is None:
        return "n/a"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _font(base: QFont, scale: float = 1.0, bold: bool = False) -> QFont:
    f = QFont(base)
    size = base.pointSizeF() if base.pointSizeF() > 0 else 10.0
    f.setPointSizeF(max(6.0, size * scale))
    f.setBold(bold)
    return f


class _Chart(QWidget):
    """Base: a painter set up with antialiasing, and an empty-state message."""

    empty_text = "No data yet"

    def __init__(self, parent: QWidget | None = None, *, min_height: int = 120) -> None:
        super().__init__(parent)
        self.setMinimumHeight(min_height)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        # preferred = minimum: the dashboard's scroll area sizes its content by preferred
        # heights, and stretch hands out the rest
        return QSize(320, self.minimumHeight())

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt name)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        th = theme(self)
        rect = QRectF(self.rect()).adjusted(4, 4, -4, -4)
        if rect.width() < 20 or rect.height() < 20:
            return
        if not self.has_data():
            p.setPen(th.muted)
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, self.empty_text)
            return
        self.draw(p, rect, th)

    def has_data(self) -> bool:
        return True

    def draw(self, p: QPainter, rect: QRectF, th: Theme) -> None:
        raise NotImplementedError


class Gauge(_Chart):
    """A 240-degree arc gauge with a big number; the scale grows with the values seen."""

    def __init__(self, parent=None, *, unit: str = "tok/s") -> None:
        super().__init__(parent, min_height=140)
        self.unit, self.value, self.caption, self.maximum, self.dim = unit, 0.0, "", 10.0, False

    def set_value(self, value: float, *, caption: str = "", dim: bool = False,
                  seen: float = 0.0) -> None:
        """``seen``: the highest speed shown anywhere (a reply's, the series'); the scale
        grows to the highest figure seen, rounded up by ``gauge_ceiling``."""
        self.value, self.caption, self.dim = value, caption, dim
        self.maximum = max(self.maximum, gauge_ceiling(max(value, seen)))
        self.update()

    def reset_scale(self) -> None:
        self.maximum = 10.0
        self.update()

    def draw(self, p, rect, th) -> None:
        side = min(rect.width(), rect.height() * 1.18)
        r = side / 2 - 8
        c = QPointF(rect.center().x(), rect.top() + 8 + r)
        arc = QRectF(c.x() - r, c.y() - r, 2 * r, 2 * r)
        width = max(8.0, r * 0.13)
        p.setPen(QPen(th.track, width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        p.drawArc(arc, 210 * 16, -240 * 16)
        frac = min(1.0, self.value / self.maximum) if self.maximum > 0 else 0.0
        colour = QColor(BLUE)
        if self.dim:
            colour.setAlpha(110)
        p.setPen(QPen(colour, width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        if frac > 0:
            p.drawArc(arc, 210 * 16, int(-240 * 16 * frac))
        p.setPen(th.muted if self.dim else th.text)
        p.setFont(_font(self.font(), max(1.6, r / 22), bold=True))
        p.drawText(QRectF(c.x() - r, c.y() - r * 0.55, 2 * r, r * 0.75),
                   Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom, f"{self.value:.1f}")
        p.setFont(_font(self.font(), 1.0))
        p.setPen(th.muted)
        p.drawText(QRectF(c.x() - r, c.y() + r * 0.22, 2 * r, r * 0.3),
                   Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop, self.unit)
        p.setFont(_font(self.font(), 0.85))
        p.drawText(QRectF(c.x() - r, c.y() + r * 0.55, 2 * r, r * 0.45),
                   Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop, self.caption)
        p.drawText(QRectF(arc.left() - 4, c.y() + r * 0.62, r * 0.6, 20),
                   Qt.AlignmentFlag.AlignLeft, "0")
        p.drawText(QRectF(arc.right() - r * 0.6 + 4, c.y() + r * 0.62, r * 0.6, 20),
                   Qt.AlignmentFlag.AlignRight, f"{self.maximum:g}")


def _ticks(top: float) -> int:
    """How many intervals make round steps for an axis maximum from ``nice_ceiling``."""
    lead = round(top / 10 ** math.floor(math.log10(top)), 2) if top > 0 else 1
    return {1.0: 5, 2.0: 4, 2.5: 5, 5.0: 5}.get(lead, 4)


def _axes(p: QPainter, plot: QRectF, th: Theme, ymax: float, *, fmt: str | None = None) -> None:
    ticks = _ticks(ymax)
    if fmt is None:
        step = ymax / ticks
        fmt = "{:.0f}" if step >= 1 else "{:.1f}" if step >= 0.1 else "{:.2f}"
    p.setFont(_font(p.font(), 0.8))
    for i in range(ticks + 1):
        y = plot.bottom() - plot.height() * i / ticks
        p.setPen(QPen(th.grid, 1))
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(th.muted)
        p.drawText(QRectF(plot.left() - 44, y - 8, 40, 16),
                   Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                   fmt.format(ymax * i / ticks))


def _dash_legend(p: QPainter, rect: QRectF, th: Theme, label: str) -> None:
    """A dashed-line legend entry in the top-right corner."""
    p.setFont(_font(p.font(), 0.8))
    w = p.fontMetrics().horizontalAdvance(label)
    x = rect.right() - w - 26
    p.setPen(QPen(th.muted, 1.2, Qt.PenStyle.DashLine))
    p.drawLine(QPointF(x, rect.top() + 8), QPointF(x + 18, rect.top() + 8))
    p.setPen(th.muted)
    p.drawText(QPointF(x + 22, rect.top() + 12), label)


class LineChart(_Chart):
    """Time series: ``series`` = [(label, colour, [(x, y), ...])]; x in seconds, shown as
    "seconds ago" relative to ``now``; an optional dashed reference line."""

    empty_text = "Waiting for tokens..."

    def __init__(self, parent=None, *, span: float = 300.0) -> None:
        super().__init__(parent, min_height=120)
        self.span, self.now = span, 0.0
        self.series: list[tuple[str, QColor, Sequence[tuple[float, float]]]] = []
        self.reference: tuple[str, float] | None = None

    def set_series(self, series, *, now: float, reference: tuple[str, float] | None = None):
        self.series, self.now, self.reference = list(series), now, reference
        self.update()

    def has_data(self) -> bool:
        return any(len(pts) > 0 for _, _, pts in self.series)

    def draw(self, p, rect, th) -> None:
        plot = rect.adjusted(48, 22, -8, -20)
        ys = [y for _, _, pts in self.series for _, y in pts]
        if self.reference:
            ys.append(self.reference[1])
        ymax = nice_ceiling(max(ys) * 1.1 if ys else 1.0)
        _axes(p, plot, th, ymax)
        x0 = self.now - self.span

        def pt(x: float, y: float) -> QPointF:
            return QPointF(plot.left() + plot.width() * (x - x0) / self.span,
                           plot.bottom() - plot.height() * y / ymax)

        for i in range(0, int(self.span) + 1, 60):
            p.setPen(th.muted)
            x = plot.right() - plot.width() * i / self.span
            p.drawText(QRectF(x - 30, plot.bottom() + 3, 60, 16), Qt.AlignmentFlag.AlignHCenter,
                       "now" if i == 0 else f"-{i // 60} min")
        p.setClipRect(plot.adjusted(-2, -2, 2, 2))
        for label, colour, pts in self.series:
            pts = [(x, y) for x, y in pts if x >= x0 - 1]
            if not pts:
                continue
            path = QPainterPath(pt(*pts[0]))
            for x, y in pts[1:]:
                path.lineTo(pt(x, y))
            fill = QPainterPath(path)
            fill.lineTo(pt(pts[-1][0], 0))
            fill.lineTo(pt(pts[0][0], 0))
            shade = QColor(colour)
            shade.setAlpha(40)
            p.fillPath(fill, shade)
            p.setPen(QPen(colour, 2))
            p.drawPath(path)
            p.setBrush(colour)
            p.drawEllipse(pt(*pts[-1]), 3, 3)
        if self.reference:
            label, y = self.reference
            p.setPen(QPen(th.muted, 1.2, Qt.PenStyle.DashLine))
            p.drawLine(pt(x0, y), pt(self.now, y))
        p.setClipping(False)
        self._legend(p, rect, th)

    def _legend(self, p, rect, th) -> None:
        p.setFont(_font(self.font(), 0.85))
        x = rect.left() + 48
        items = [(label, colour, False) for label, colour, _ in self.series]
        if self.reference:
            items.append((self.reference[0], th.muted, True))
        for label, colour, dashed in items:
            p.setPen(QPen(colour, 2, Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine))
            p.drawLine(QPointF(x, rect.top() + 9), QPointF(x + 16, rect.top() + 9))
            p.setPen(th.text)
            w = p.fontMetrics().horizontalAdvance(label)
            p.drawText(QPointF(x + 20, rect.top() + 13), label)
            x += w + 40


class BarChart(_Chart):
    """Vertical bars: [(label, value, colour, note)], with value labels; ``ymax`` fixed or auto.
    ``bands`` shades acceptance zones (red < 0.4 <= amber < 0.7 <= green) behind the bars."""

    def __init__(self, parent=None, *, ymax: float | None = None, fmt: str = "{:.2f}",
                 axis_fmt: str | None = None, bands: bool = False, min_height: int = 120) -> None:
        super().__init__(parent, min_height=min_height)
        self.ymax, self.fmt, self.axis_fmt, self.bands = ymax, fmt, axis_fmt, bands
        self.note_label = ""  # names the row of notes, drawn once left of it (e.g. "overall")
        self.bars: list[tuple[str, float, QColor, str]] = []
        self.reference: tuple[str, float] | None = None

    def set_bars(self, bars, *, reference: tuple[str, float] | None = None) -> None:
        self.bars, self.reference = list(bars), reference
        self.update()

    def has_data(self) -> bool:
        return bool(self.bars)

    def draw(self, p, rect, th) -> None:
        plot = rect.adjusted(48, 30 if self.reference else 18, -8, -34)
        top = self.ymax or nice_ceiling(max([v for _, v, _, _ in self.bars] +
                                            [self.reference[1] if self.reference else 0]) * 1.15)
        if self.bands:
            for lo, hi, colour in ((0.0, 0.4, RED), (0.4, 0.7, AMBER), (0.7, 1.0, GREEN)):
                shade = QColor(colour)
                shade.setAlpha(22 if th.dark else 16)
                y0 = plot.bottom() - plot.height() * hi / top
                y1 = plot.bottom() - plot.height() * lo / top
                p.fillRect(QRectF(plot.left(), y0, plot.width(), y1 - y0), shade)
        _axes(p, plot, th, top, fmt=self.axis_fmt)
        n = len(self.bars)
        slot = plot.width() / n
        bw = min(64.0, slot * 0.62)
        for i, (label, value, colour, note) in enumerate(self.bars):
            cx = plot.left() + slot * (i + 0.5)
            h = plot.height() * min(value, top) / top
            bar = QRectF(cx - bw / 2, plot.bottom() - h, bw, h)
            path = QPainterPath()
            path.addRoundedRect(bar, 4, 4)
            p.fillPath(path, colour)
            p.setPen(th.text)
            p.setFont(_font(self.font(), 0.9, bold=True))
            p.drawText(QRectF(cx - slot / 2, bar.top() - 18, slot, 16),
                       Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom,
                       self.fmt.format(value))
            p.setFont(_font(self.font(), 0.9))
            p.drawText(QRectF(cx - slot / 2, plot.bottom() + 3, slot, 16),
                       Qt.AlignmentFlag.AlignHCenter, label)
            if note:
                p.setPen(th.muted)
                p.setFont(_font(self.font(), 0.75))
                if p.fontMetrics().horizontalAdvance(note.split()[-1]) > slot - 4:
                    p.setFont(_font(self.font(), 0.65))  # a narrow bar: a smaller figure
                p.drawText(QRectF(cx - slot / 2, plot.bottom() + 17, slot, 14),
                           Qt.AlignmentFlag.AlignHCenter, fit_note(p.fontMetrics(), note, slot - 4))
        if self.note_label and any(note for *_, note in self.bars):
            p.setPen(th.muted)
            p.setFont(_font(self.font(), 0.75))
            p.drawText(QRectF(rect.left(), plot.bottom() + 17, plot.left() - rect.left() - 4, 14),
                       Qt.AlignmentFlag.AlignRight, self.note_label)
        if self.reference:
            label, y = self.reference
            yy = plot.bottom() - plot.height() * y / top
            p.setPen(QPen(th.muted, 1.2, Qt.PenStyle.DashLine))
            p.drawLine(QPointF(plot.left(), yy), QPointF(plot.right(), yy))
            _dash_legend(p, rect, th, label)


def fit_note(metrics, note: str, width: float) -> str:
    """``note`` if it fits ``width``, else its last word (the figure), else elided: notes under
    neighbouring bars never run into each other."""
    if metrics.horizontalAdvance(note) <= width:
        return note
    last = note.split()[-1]
    if metrics.horizontalAdvance(last) <= width:
        return last
    return metrics.elidedText(last, Qt.TextElideMode.ElideRight, int(max(0.0, width)))


class Waterfall(_Chart):
    """Where a cycle's time goes: one row per phase, each starting where the last ended.
    Phases named in ``optional`` get no row while they take no time."""

    empty_text = "No decode cycles yet"
    optional = ("sync wait", "other")

    def __init__(self, parent=None) -> None:
        super().__init__(parent, min_height=120)
        self.phases: list[tuple[str, float]] = []

    def set_phases(self, phases: Sequence[tuple[str, float]]) -> None:
        self.phases = [(n, max(0.0, t)) for n, t in phases]
        self.update()

    def has_data(self) -> bool:
        return sum(t for _, t in self.phases) > 0

    def draw(self, p, rect, th) -> None:
        total = sum(t for _, t in self.phases)
        rows = [(n, t) for n, t in self.phases if t > 0 or n not in self.optional]
        label_w, value_w = 70.0, 92.0
        plot = QRectF(rect.left() + label_w, rect.top() + 4,
                      rect.width() - label_w - value_w, rect.height() - 8)
        row_h = plot.height() / max(1, len(rows))
        start = 0.0
        p.setFont(_font(self.font(), 0.9))
        for i, (name, t) in enumerate(rows):
            y = plot.top() + i * row_h
            colour = PHASE_COLOURS[[n for n, _ in self.phases].index(name) % len(PHASE_COLOURS)]
            p.fillRect(QRectF(plot.left(), y + row_h * 0.2, plot.width(), row_h * 0.6), th.track)
            x = plot.left() + plot.width() * start / total
            w = max(2.0, plot.width() * t / total)
            path = QPainterPath()
            path.addRoundedRect(QRectF(x, y + row_h * 0.2, w, row_h * 0.6), 3, 3)
            p.fillPath(path, colour)
            p.setPen(th.text)
            p.drawText(QRectF(rect.left(), y, label_w - 6, row_h),
                       Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, name)
            p.setPen(th.muted)
            p.drawText(QRectF(plot.right() + 6, y, value_w - 6, row_h),
                       Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                       f"{1000 * t:.2f} ms  {100 * t / total:.0f}%")
            start += t


class DepthChart(_Chart):
    """Depth per cycle as a step line; explore probes and warm-up as dots, switches as ticks.
    ``points`` = [(seq, depth, reason)]."""

    empty_text = "No cycles yet"

    def __init__(self, parent=None, *, span: int = 300) -> None:
        super().__init__(parent, min_height=120)
        self.span, self.max_depth = span, 3
        self.points: list[tuple[int, int, str]] = []

    def set_points(self, points, *, max_depth: int) -> None:
        self.points = list(points)[-self.span:]
        self.max_depth = max(1, max_depth, *(d for _, d, _ in self.points))
        self.update()

    def has_data(self) -> bool:
        return bool(self.points)

    def draw(self, p, rect, th) -> None:
        plot = rect.adjusted(48, 20, -8, -20)
        top = self.max_depth
        p.setFont(_font(self.font(), 0.8))
        for d in range(top + 1):
            y = plot.bottom() - plot.height() * d / top
            p.setPen(QPen(th.grid, 1))
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            p.setPen(th.muted)
            p.drawText(QRectF(plot.left() - 44, y - 8, 40, 16),
                       Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, f"D{d}")
        first = self.points[0][0]
        n = max(min(self.points[-1][0] - first + 1, self.span), 1)  # the cycles shown fill it

        def pt(seq: float, d: float) -> QPointF:
            return QPointF(plot.left() + plot.width() * (seq - first) / n,
                           plot.bottom() - plot.height() * d / top)

        own = [(s, d) for s, d, r in self.points if r not in ("explore", "warmup")]
        if own:
            path = QPainterPath(pt(*own[0]))
            for (s0, d0), (s1, d1) in zip(own, own[1:]):
                path.lineTo(pt(s1, d0))
                path.lineTo(pt(s1, d1))
            path.lineTo(pt(own[-1][0] + 1, own[-1][1]))
            p.setPen(QPen(BLUE, 2))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawPath(path)
        for s, d, r in self.points:
            if r in ("explore", "warmup") or r.startswith("switch"):
                colour = AMBER if r == "explore" else GREY if r == "warmup" else PINK
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(colour)
                p.drawEllipse(pt(s + 0.5, d), 3, 3)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(th.muted)
        p.drawText(QRectF(plot.left(), plot.bottom() + 3, plot.width(), 16),
                   Qt.AlignmentFlag.AlignLeft, f"cycle {first}")
        p.drawText(QRectF(plot.left(), plot.bottom() + 3, plot.width(), 16),
                   Qt.AlignmentFlag.AlignRight, f"cycle {self.points[-1][0]}")
        self._legend(p, rect, th)

    def _legend(self, p, rect, th) -> None:
        x = rect.left() + 48
        for label, colour in (("chosen", BLUE), ("switch", PINK), ("explore", AMBER),
                              ("warm-up", GREY)):
            if x + 12 + p.fontMetrics().horizontalAdvance(label) > rect.right():
                break
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(colour)
            p.drawEllipse(QPointF(x + 4, rect.top() + 8), 4, 4)
            p.setPen(th.text)
            p.drawText(QPointF(x + 12, rect.top() + 12), label)
            x += p.fontMetrics().horizontalAdvance(label) + 28
        p.setBrush(Qt.BrushStyle.NoBrush)


class Meter(QWidget):
    """One labelled horizontal meter: ``used`` of ``total`` with a text on the right."""

    def __init__(self, label: str, parent=None) -> None:
        super().__init__(parent)
        self.label, self.frac, self.text, self.colour = label, 0.0, "", BLUE
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(260, 22)

    def set_value(self, frac: float, text: str, colour: QColor | None = None) -> None:
        self.frac, self.text = max(0.0, min(1.0, frac)), text
        self.colour = colour or BLUE
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        th = theme(self)
        r = QRectF(self.rect())
        label_w, text_w = 78.0, 124.0
        bar = QRectF(r.left() + label_w, r.center().y() - 5, r.width() - label_w - text_w, 10)
        p.setPen(th.text)
        p.drawText(QRectF(r.left(), r.top(), label_w - 8, r.height()),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.label)
        track = QPainterPath()
        track.addRoundedRect(bar, 5, 5)
        p.fillPath(track, th.track)
        if self.frac > 0 and bar.width() > 0:
            fill = QPainterPath()
            fill.addRoundedRect(QRectF(bar.left(), bar.top(), max(10.0, bar.width() * self.frac),
                                       bar.height()), 5, 5)
            p.fillPath(fill, self.colour)
        p.setPen(th.muted)
        p.drawText(QRectF(bar.right() + 8, r.top(), text_w - 8, r.height()),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.text)
