"""``python -m app.bench_ui``: does the chat window stay responsive while a long reply streams?

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
    p = argparse.ArgumentParser(prog="python -m app.bench_ui", description=__doc__.split("\n")[0])
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


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-bench-"))
    import psutil
    from PySide6.QtCore import QCoreApplication, QElapsedTimer, QEvent, QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    qapp = QApplication.instance() or QApplication(sys.argv[:1])
    from app.fake_engine import FakeModel, make_fake_loader
    from app.main_window import MainWindow

    fake = FakeModel(tokens_per_second=args.tps, repeat_to=args.tokens, acceptance=0.6)
    model_dir = tempfile.mkdtemp(prefix="mtpchat-bench-model-")
    window = MainWindow(model_path=model_dir, loader=make_fake_loader(fake))
    window.resize(1180, 780)
    window.show()
    proc = psutil.Process()

    def spin_until(cond, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not cond() and time.monotonic() < end:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
            # deleteLater() runs from an event loop; this bench drives Qt by processEvents()
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            time.sleep(0.002)

    spin_until(lambda: window.session.model_info is not None, 30)
    if window.session.model_info is None:
        print("bench_ui: the fake model did not load", file=sys.stderr)
        return 1
    update_s: list[float] = []
    original = window.on_stream_updated

    def timed_update(conv_id: int, msg_id: int) -> None:
        t = time.perf_counter()
        original(conv_id, msg_id)
        update_s.append(time.perf_counter() - t)

    window.session.stream_updated.disconnect(window.on_stream_updated)
    window.session.stream_updated.connect(timed_update)

    gc.collect()
    rss = [proc.memory_info().rss]
    widgets = [len(QApplication.allWidgets())]
    runs = []
    for run in range(args.runs):
        lateness: list[float] = []
        clock = QElapsedTimer()
        clock.start()
        last = [clock.nsecsElapsed()]

        def probe() -> None:
            now = clock.nsecsElapsed()
            lateness.append(max(0.0, (now - last[0]) / 1e6 - PROBE_MS))
            last[0] = now

        timer = QTimer()
        timer.setInterval(PROBE_MS)
        timer.timeout.connect(probe)
        update_s.clear()
        window.new_chat()
        conv_settings = window.session.settings_for(window.current_conv).to_dict()
        conv_settings["max_tokens"] = args.tokens
        window.store.set_conversation_settings(window.current_conv, conv_settings)
        t0 = time.perf_counter()
        timer.start()
        window.composer.edit.setPlainText(f"Benchmark run {run + 1}: write a long answer.")
        window.composer.button.click()
        if args.screenshot and run == 0:
            spin_until(lambda: False, 2.0)
            window.grab().save(args.screenshot)
        spin_until(lambda: not window.session.streams, args.tokens / args.tps * 4 + 30)
        timer.stop()
        elapsed = time.perf_counter() - t0
        spin_until(lambda: False, 0.3)
        gc.collect()
        rss.append(proc.memory_info().rss)
        widgets.append(len(QApplication.allWidgets()))
        msg = window.store.messages(window.current_conv)[-1]
        runs.append({
            "run": run + 1, "tokens": (msg.meta.get("stats") or {}).get("tokens"),
            "status": msg.meta.get("status"), "chars": len(msg.content),
            "seconds": round(elapsed, 2), "probes": len(lateness),
            "latency_worst_ms": round(max(lateness, default=0.0), 1),
            "latency_p99_ms": round(_percentile(lateness, 0.99), 1),
            "latency_p50_ms": round(_percentile(lateness, 0.50), 1),
            "ui_updates": len(update_s),
            "ui_update_mean_ms": round(statistics.fmean(update_s) * 1000, 2) if update_s else 0.0,
            "ui_update_max_ms": round(max(update_s, default=0.0) * 1000, 1),
        })
    window.close()
    result = {
        "tokens": args.tokens, "tps": args.tps, "runs": runs,
        "rss_start_mb": round(rss[0] / 2**20, 1),
        "rss_after_runs_mb": [round(r / 2**20, 1) for r in rss[1:]],
        "rss_growth_first_mb": round((rss[1] - rss[0]) / 2**20, 1),
        "rss_growth_next_mb": round((rss[-1] - rss[1]) / 2**20, 1) if len(rss) > 2 else None,
        "widgets_alive": widgets,
        "goal_p99_ms": 50,
        "pass": all(r["latency_p99_ms"] < 50 for r in runs),
    }
    _report(result, as_json=args.json)
    return 0


def _report(result: dict, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"bench_ui: fake engine, {result['tokens']} tokens at {result['tps']:.0f} tok/s")
    for r in result["runs"]:
        print(f"  run {r['run']}: {r['tokens']} tokens ({r['chars']} chars, {r['status']}) in "
              f"{r['seconds']} s; event-loop lateness p50 {r['latency_p50_ms']} ms, "
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
