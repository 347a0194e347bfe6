"""``python -m app.bench.speed``: does the chat app decode as fast as the engine's CLI?

Drives the real main window (offscreen unless a platform is set) over the real engine: each
round sends the prompt through the composer and waits for the streamed reply, then runs the
same prompt at the same settings through ``python -m engine generate --json`` (a subprocess,
``--reference cli``) and/or ``Model.generate`` on this process's main thread with the window
idle (``--reference inprocess``). Logging is set up as ``python -m app`` sets it up. Rounds
alternate app and reference so a machine shared with other work slows both alike. The figure compared is the reply's ``ReplySummary.tokens_per_s``
(decode tokens over the decode cycles' own wall time, the engine's one definition), whoever
consumed the events; the goal is app / reference >= 0.9 (issue 16, defect 10).

A benchmark command, not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

DEFAULT_PROMPT = "Describe the json module in detail."
GOAL = 0.9


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench.speed",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model folder (default: the embedded demo model)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--depth", default="auto", help="auto or 0..6")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234, help="sampling seed, the same on every side")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dashboard", action="store_true", help="keep the dashboard open in the app")
    p.add_argument("--reference", choices=("cli", "inprocess", "both"), default="both")
    p.add_argument("--profile", help="write a cProfile of the app's GUI thread to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


@dataclass
class Figures:
    """tok/s and token counts of one side's replies, one entry per round."""

    tps: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, tps: float, tokens: int) -> None:
        self.tps.append(round(tps, 1))
        self.tokens.append(int(tokens))

    @property
    def median(self) -> float:
        return statistics.median(self.tps) if self.tps else 0.0


def _spin(cond, timeout: float) -> bool:
    from PySide6.QtCore import QCoreApplication, QEventLoop

    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        time.sleep(0.001)
    return True


def _run_until(signal, start, timeout: float) -> None:
    """Call ``start()`` and run a real event loop (as ``app.exec()`` would) until ``signal``."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    signal.connect(loop.quit)
    QTimer.singleShot(int(timeout * 1000), loop.quit)
    QTimer.singleShot(0, start)
    loop.exec()
    signal.disconnect(loop.quit)


def _depth(text: str) -> int | str:
    return "auto" if text == "auto" else int(text)


class AppSide:
    """The real chat window; ``reply()`` sends the prompt through the composer."""

    def __init__(self, args: argparse.Namespace, path: str) -> None:
        from app.chat.main_window import MainWindow

        self.args = args
        self.window = MainWindow(model_path=path)
        self.window.resize(1180, 780)
        self.window.show()
        if not _spin(lambda: self.window.model.ready, 300):
            raise SystemExit(f"bench.speed: the app did not load {path}: "
                             f"{self.window.model.error}")
        if args.dashboard:
            self.window.aux.show_dashboard()
        submit = self.window.worker.submit  # the chat has no seed setting: add the bench's
        self.window.worker.submit = lambda req: submit(replace(req, seed=args.seed))

    def reply(self) -> tuple[float, int]:
        w, a = self.window, self.args
        conv = w.session.new_conversation()
        settings = replace(w.session.settings_for(conv), temperature=a.temperature,
                           top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens,
                           depth=_depth(a.depth), thinking=False, system_prompt="")
        w.store.set_conversation_settings(conv, settings.to_dict())
        w.chats.open_conversation(conv)
        w.composer.edit.setPlainText(a.prompt)
        _run_until(w.session.stream_finished, w.composer.button.click, 600)
        if w.session.streams:
            raise SystemExit("bench.speed: the app's reply did not finish")
        stats = w.store.messages(conv)[-1].meta.get("stats") or {}
        w.store.erase_conversation(conv)
        return float(stats.get("tokens_per_s", 0.0)), int(stats.get("tokens", 0))

    def close(self) -> None:
        self.window.close()


def cli_reply(args: argparse.Namespace, path: str) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "engine", "generate", "--json", "--model", path, "--chat",
           "--no-think", "--prompt", args.prompt, "--max-tokens", str(args.max_tokens),
           "--depth", args.depth, "--temperature", str(args.temperature),
           "--top-p", str(args.top_p), "--top-k", str(args.top_k), "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    stats = json.loads(out.stdout)["stats"]
    return float(stats["decode_tokens_per_s"]), int(stats["tokens"])


class InProcess:
    """``Model.generate`` on the main thread (the window idle): the engine alone."""

    def __init__(self, args: argparse.Namespace, path: str) -> None:
        import engine

        self.args = args
        self.model = engine.load(path)

    def reply(self) -> tuple[float, int]:
        from engine.metrics.summary import ReplyTally
        from engine.types import SamplingParams

        a = self.args
        ids = self.model.chat_ids([{"role": "user", "content": a.prompt}], enable_thinking=False)
        tally = ReplyTally()
        for ev in self.model.generate(ids, max_tokens=a.max_tokens, depth=_depth(a.depth),
                                      sampling=SamplingParams(temperature=a.temperature,
                                                              top_p=a.top_p, top_k=a.top_k),
                                      seed=a.seed):
            tally.add(ev)
        s = tally.summary()
        return s.tokens_per_s, s.tokens


def _rounds(args, app: AppSide, refs: dict, path: str) -> dict[str, Figures]:
    figs = {"app": Figures(), **{name: Figures() for name in refs}}
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    for r in range(args.rounds):
        order = ["app", *refs] if r % 2 == 0 else [*refs, "app"]
        for side in order:
            if side == "app":
                if profiler is not None:
                    profiler.enable()
                figs["app"].add(*app.reply())
                if profiler is not None:
                    profiler.disable()
            else:
                figs[side].add(*refs[side]())
            _spin(lambda: False, 0.2)
        if not args.json:
            print(f"  round {r + 1}: " + ", ".join(
                f"{k} {v.tps[-1]:.1f} tok/s ({v.tokens[-1]} tokens)" for k, v in figs.items()),
                file=sys.stderr, flush=True)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return figs


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("MTPCHAT_HOME", tempfile.mkdtemp(prefix="mtpchat-bench-"))
    os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")
    from app.logging_setup import install_qt_message_handler, setup_logging
    from app.qt_app import application
    from app.paths import default_model_path

    setup_logging(logging.WARNING)  # as the app does (a DEBUG log file, Qt messages routed)
    install_qt_message_handler()

    path = str(args.model or default_model_path())
    application()  # the QApplication, named "MTP Chat" as the app
    app = AppSide(args, path)
    refs = {}
    if args.reference in ("cli", "both"):
        refs["cli"] = lambda: cli_reply(args, path)
    if args.reference in ("inprocess", "both"):
        refs["inprocess"] = InProcess(args, path).reply
    try:
        figs = _rounds(args, app, refs, path)
    finally:
        app.close()
    _report(args, path, figs)
    return 0


def _report(args, path: str, figs: dict[str, Figures]) -> None:
    app = figs["app"].median
    ratios = {k: round(app / v.median, 3) if v.median else None
              for k, v in figs.items() if k != "app"}
    result = {"model": path, "prompt": args.prompt, "max_tokens": args.max_tokens,
              "depth": args.depth, "temperature": args.temperature, "top_p": args.top_p,
              "top_k": args.top_k, "seed": args.seed, "rounds": args.rounds,
              "dashboard": args.dashboard,
              "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
              "tok_s": {k: v.tps for k, v in figs.items()},
              "tokens": {k: v.tokens for k, v in figs.items()},
              "median_tok_s": {k: round(v.median, 1) for k, v in figs.items()},
              "app_over_reference": ratios, "goal": GOAL,
              "pass": all(r is not None and r >= GOAL for r in ratios.values())}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"bench.speed: {path}, {args.rounds} rounds, max {args.max_tokens} tokens, depth "
          f"{args.depth}, temperature {args.temperature}, top-p {args.top_p}, top-k "
          f"{args.top_k}, seed {args.seed}{', dashboard open' if args.dashboard else ''} (load average {result['load_average']} on {result['cpus']} CPUs)")
    for k, v in figs.items():
        print(f"  {k:10s} median {v.median:7.1f} tok/s  (rounds: {v.tps}; tokens {v.tokens})")
    for k, r in ratios.items():
        print(f"  app / {k}: {r}  (goal >= {GOAL}: {'met' if r and r >= GOAL else 'NOT met'})")


if __name__ == "__main__":
    raise SystemExit(main())
