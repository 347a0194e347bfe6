"""``python -m app.bench.ui``: does the chat window stay responsive while a long reply streams?

Runs the real main window (offscreen unless a platform is set) over the scripted fake engine
emitting ``--tps`` tokens/s (default 500) for ``--tokens`` tokens (default 4,000: Markdown
paragraphs, lists and code blocks), while a 10 ms probe timer measures how late the event loop
serves it. Reports the worst and 99th-percentile lateness (goal: p99 < 50 ms), time spent in
the UI's stream updates, and the process's memory growth over two identical replies.
A benchmark command, not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

PROBE_MS = 10


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench.ui", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--tps", type=float, default=500.0, help="fake engine speed, tokens/s")
    p.add_argument("--runs", type=int, default=2, help="replies to stream (memory growth)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--screenshot", help="save a PNG of the window mid-stream")
    return p.parse_args(argv)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def _spin_until(cond, timeout: float) -> None:
    """Drive Qt until ``cond()`` or ``timeout`` seconds (this bench has no ``exec()`` loop)."""
    from PySide6.QtCore import QCoreApplication, QEvent, QEventLoop

    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        # deleteLater() normally runs from the event loop; run it here too
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        time.sleep(0.002)


class _Probe:
    """A 10 ms timer that records how late each of its ticks is served."""

    def __init__(self) -> None:
        from PySide6.QtCore import QElapsedTimer, QTimer

        self.lateness: list[float] = []
        self._clock = QElapsedTimer()
        self._timer = QTimer()
        self._timer.setInterval(PROBE_MS)
        self._timer.timeout.connect(self._tick)
        self._last = 0

    def start(self) -> None:
        self._clock.start()
        self._last = self._clock.nsecsElapsed()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now = self._clock.nsecsElapsed()
        self.lateness.append(max(0.0, (now - self._last) / 1e6 - PROBE_MS))
        self._last = now


class _Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from app.fake.engine import FakeModel, make_fake_loader
        from app.chat.main_window import MainWindow

        self.args = args
        fake = FakeModel(tokens_per_second=args.tps, repeat_to=args.tokens, acceptance=0.6)
        model_dir = tempfile.mkdtemp(prefix="mtpchat-bench-model-")
        self.window = MainWindow(model_path=model_dir, loader=make_fake_loader(fake))
        self.window.resize(1180, 780)
        self.window.show()
        self.update_s: list[float] = []
        original = self.window.sending.on_stream_updated

        def timed_update(conv_id: int, msg_id: int) -> None:
            t = time.perf_counter()
            original(conv_id, msg_id)
            self.update_s.append(time.perf_counter() - t)

        self.window.session.stream_updated.disconnect(self.window.sending.on_stream_updated)
        self.window.session.stream_updated.connect(timed_update)

    def run_once(self, run: int) -> dict:
        w, args = self.window, self.args
        probe = _Probe()
        self.update_s.clear()
        w.chats.new_chat()
        settings = w.session.settings_for(w.current_conv).to_dict()
        settings["max_tokens"] = args.tokens
        w.store.set_conversation_settings(w.current_conv, settings)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        probe.start()
        w.composer.edit.setPlainText(f"Benchmark run {run}: write a long answer.")
        w.composer.button.click()
        if args.screenshot and run == 1:
            _spin_until(lambda: False, 2.0)
            w.grab().save(args.screenshot)
        _spin_until(lambda: not w.session.streams, args.tokens / args.tps * 4 + 30)
        probe.stop()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        msg = w.store.messages(w.current_conv)[-1]
        lat, upd = probe.lateness, self.update_s
        return {
            "run": run, "tokens": (msg.meta.get("stats") or {}).get("tokens"),
            "status": msg.meta.get("status"), "chars": len(msg.content),
            "seconds": round(elapsed, 2), "cpu_seconds": round(cpu, 2), "probes": len(lat),
            "latency_worst_ms": round(max(lat, default=0.0), 1),
            "latency_p99_ms": round(_percentile(lat, 0.99), 1),
            "latency_p50_ms": round(_percentile(lat, 0.50), 1),
            "ui_updates": len(upd),
            "ui_update_mean_ms": round(statistics.fmean(upd) * 1000, 2) if upd else 0.0,
            "ui_update_max_ms": round(max(upd, default=0.0) * 1000, 1),
        }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-bench-"))
    import psutil
    from PySide6.QtWidgets import QApplication

    from app.qt_app import application

    application()  # the QApplication, named "MTP Chat" as the app
    bench = _Bench(args)
    _spin_until(lambda: bench.window.model.info is not None, 30)
    if bench.window.model.info is None:
        print("bench.ui: the fake model did not load", file=sys.stderr)
        return 1
    idle = _Probe()  # the same probe with nothing streaming: this machine's own noise
    idle.start()
    _spin_until(lambda: False, 2.0)
    idle.stop()
    proc = psutil.Process()
    rss, widgets, runs = [], [], []
    for run in range(args.runs + 1):
        if run:
            runs.append(bench.run_once(run))
            _spin_until(lambda: False, 0.3)
        gc.collect()
        rss.append(proc.memory_info().rss)
        widgets.append(len(QApplication.allWidgets()))
    bench.window.close()
    result = {
        "tokens": args.tokens, "tps": args.tps, "runs": runs,
        "rss_start_mb": round(rss[0] / 2**20, 1),
        "rss_after_runs_mb": [round(r / 2**20, 1) for r in rss[1:]],
        "rss_growth_first_mb": round((rss[1] - rss[0]) / 2**20, 1),
        "rss_growth_next_mb": round((rss[-1] - rss[1]) / 2**20, 1) if len(rss) > 2 else None,
        "widgets_alive": widgets,
        "idle_latency_p99_ms": round(_percentile(idle.lateness, 0.99), 1),
        "idle_latency_worst_ms": round(max(idle.lateness, default=0.0), 1),
        "goal_p99_ms": 50,
        "pass": all(r["latency_p99_ms"] < 50 for r in runs),
    }
    _report(result, as_json=args.json)
    return 0


def _report(result: dict, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"bench.ui: fake engine, {result['tokens']} tokens at {result['tps']:.0f} tok/s "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"  idle event loop (no stream, 2 s): lateness p99 {result['idle_latency_p99_ms']} ms, "
          f"worst {result['idle_latency_worst_ms']} ms")
    for r in result["runs"]:
        print(f"  run {r['run']}: {r['tokens']} tokens ({r['chars']} chars, {r['status']}) in "
              f"{r['seconds']} s (process CPU {r['cpu_seconds']} s); event-loop lateness "
              f"p50 {r['latency_p50_ms']} ms, "
              f"p99 {r['latency_p99_ms']} ms, worst {r['latency_worst_ms']} ms "
              f"({r['probes']} probes); {r['ui_updates']} UI updates, mean "
              f"{r['ui_update_mean_ms']} ms, max {r['ui_update_max_ms']} ms")
    print(f"  memory: RSS {result['rss_start_mb']} MB at start, after each run "
          f"{result['rss_after_runs_mb']} MB (first run +{result['rss_growth_first_mb']} MB, "
          f"later runs +{result['rss_growth_next_mb']} MB)")
    print(f"  live widgets: at start and after each run {result['widgets_alive']}")
    print(f"  goal p99 < {result['goal_p99_ms']} ms: {'met' if result['pass'] else 'NOT met'}")


if __name__ == "__main__":
    raise SystemExit(main())
