"""``python -m app.dashboard [--demo]``: the dashboard window on its own, fed by the simulated
workload of ``app.dashboard.demo`` with ``--demo`` (``--screenshot PATH`` saves a PNG and quits)."""
from __future__ import annotations

import argparse

from PySide6.QtCore import QTimer

from app.dashboard.demo import DEMO_INFO, DemoFeed, demo_memory, demo_tune_result
from app.dashboard.window import DashboardWindow
from engine.metrics.stats import StatsAggregator


def _dark_palette(app) -> None:
    from PySide6.QtGui import QColor, QPalette

    app.setStyle("Fusion")
    pal = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#1e1f24"), (QPalette.ColorRole.Base, "#26272d"),
                         (QPalette.ColorRole.AlternateBase, "#2c2d34"),
                         (QPalette.ColorRole.WindowText, "#e6e6ea"), (QPalette.ColorRole.Text, "#e6e6ea"),
                         (QPalette.ColorRole.Button, "#2c2d34"), (QPalette.ColorRole.ButtonText, "#e6e6ea"),
                         (QPalette.ColorRole.Midlight, "#3a3b44"), (QPalette.ColorRole.Mid, "#3a3b44"),
                         (QPalette.ColorRole.PlaceholderText, "#9a9ba5")):
        pal.setColor(role, QColor(colour))
    app.setPalette(pal)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m app.dashboard")
    ap.add_argument("--demo", action="store_true", help="feed simulated statistics")
    ap.add_argument("--history", type=float, default=150.0, help="simulated seconds replayed at start")
    ap.add_argument("--dark", action="store_true", help="dark palette (Fusion style)")
    ap.add_argument("--screenshot", default=None, help="save a PNG after --after seconds and quit")
    ap.add_argument("--after", type=float, default=1.5)
    ap.add_argument("--size", default=None, help="window size, e.g. 1100x760")
    return ap.parse_args(argv)


def demo_window(*, history: float = 150.0, size: str | None = None) -> tuple[DashboardWindow, DemoFeed]:
    """A dashboard fed ``history`` simulated seconds, mid-reply (not yet shown)."""
    feed = DemoFeed()
    agg = StatsAggregator(clock=feed.clock, memory_probe=lambda: demo_memory(feed.clock))
    win = DashboardWindow(aggregator=agg)
    win.setWindowTitle(win.windowTitle() + " (demo data)")
    if size:
        w, h = (int(v) for v in size.lower().split("x"))
        win.resize(w, h)
    feed.stats.connect(win.on_stats)
    feed.finished.connect(win.on_finished)
    win.set_model_info(DEMO_INFO)
    win.set_tuner_result(demo_tune_result())
    feed.advance(history)
    while feed.remaining <= 0:  # make sure a reply is streaming when the window opens
        feed.advance(feed.now + 0.05)
    return win, feed


def main(argv: list[str] | None = None) -> int:
    from app.qt_app import application

    args = _parse(argv)
    app = application()
    if args.dark:
        _dark_palette(app)
    if not args.demo:
        win = DashboardWindow()
        win.show()
        return app.exec()
    win, feed = demo_window(history=args.history, size=args.size)
    win.show()
    timer = QTimer(win)
    timer.timeout.connect(lambda: feed.advance(feed.now + 0.03))
    timer.start(30)
    if args.screenshot:
        def shoot() -> None:
            if feed.remaining < 60:  # grab mid-reply, not in a pause between replies
                QTimer.singleShot(100, shoot)
                return
            win.refresh()
            win.grab().save(args.screenshot)
            app.quit()
        QTimer.singleShot(int(args.after * 1000), shoot)
    return app.exec()


if __name__ == "__main__":
    raise SystemExit(main())
