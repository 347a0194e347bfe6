"""``verify``: check that MTP speculation leaves the output unchanged (greedy replies identical
to plain decoding; sampled tokens at drafted positions distributed as plain decoding's).
Exit 0 on pass, 1 on fail (``engine.decoding.verify``)."""
from __future__ import annotations

import json
import sys
import threading
import time

_LAST = [0.0]  # when the last progress line was printed (not a terminal)
HELP = "check that speculative decoding gives exactly the output of plain decoding"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--depth", type=int, default=None,
                   help="speculation depth to check (default: the tuned depth if saved, else 3)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="about how long to run (sizes the sampled test; default 60)")
    p.add_argument("--seed", type=int, default=0, help="first seed of the sampled replies")


def _progress(done: int, total: int, message: str) -> None:
    """One updating line on a terminal; elsewhere a line every 5 s (and the last)."""
    tty = sys.stderr.isatty()
    now = time.monotonic()
    if not tty and done != total and now - _LAST[0] < 5:
        return
    _LAST[0] = now
    end = "\n" if done == total or not tty else ""
    print(f"\r[{done}/{total}] {message}\033[K" if tty else f"[{done}/{total}] {message}",
          end=end, file=sys.stderr, flush=True)


def run(args) -> int:
    import engine
    from engine.decoding.verify import verify

    if not args.seconds > 0:
        raise ValueError(f"--seconds must be > 0, not {args.seconds}")
    model = engine.load(args.model or str(engine.default_model_path()))
    cancel = threading.Event()
    try:
        result = verify(model, depth=args.depth, seconds=args.seconds, seed=args.seed,
                        progress=None if args.json else _progress, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.message)
        for t in result.positions:
            print(f"  token {t.position}: chi-square {t.statistic:.2f}, {t.dof} dof, "
                  f"{t.categories} categories, p = {t.p_value:.3g}")
        print(f"Compared: {result.compared}.")
        print(f"{result.elapsed_s:.0f} s")
    return 0 if result.passed else 1
