"""``tune``: measure plain decoding against MTP depths on this machine and keep the winner."""
from __future__ import annotations

import json
import sys
import threading

from engine.depth.tuner import DEPTHS

HELP = "measure depth 0 against depths 1..N on this machine and save the fastest (if any wins)"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    default = ",".join(map(str, DEPTHS))
    p.add_argument("--depths", default=default,
                   help=f"comma-separated depths to try (default {default}, as the app's tuner)")
    p.add_argument("--repeats", type=int, default=3, help="runs per prompt and depth (median)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per run")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--no-save", action="store_true", help="measure only, save nothing")


def _depths(text: str) -> tuple[int, ...]:
    from engine.errors import GenerationError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GenerationError(f"--depths must be comma-separated integers, not {text!r}") from None


def _table(result) -> str:
    lines = [f"{'depth':>5}  {'tok/s':>8}  {'speed-up':>8}  {'tok/cycle':>9}  "
             f"{'ms/cycle':>8}  acceptance by position"]
    for r in result.rows:
        acc = " / ".join(f"{a:.2f}" for a in r.acceptance) or "-"
        mark = "  <- winner" if r.depth == result.best_depth and result.best_depth > 0 else ""
        lines.append(f"{r.depth:>5}  {r.tokens_per_second:8.1f}  {r.speedup:7.2f}x  "
                     f"{r.tokens_per_cycle:9.2f}  {r.cycle_ms:8.1f}  {acc}{mark}")
    return "\n".join(lines)


def _progress(done: int, total: int, message: str) -> None:
    end = "\n" if done == total or not sys.stderr.isatty() else ""
    print(f"\r[{done}/{total}] {message}\033[K" if sys.stderr.isatty() else
          f"[{done}/{total}] {message}", end=end, file=sys.stderr, flush=True)


def run(args) -> int:
    import engine
    from engine.depth.tuner import tune
    from engine.types import SamplingParams

    path = args.model or str(engine.default_model_path())
    model = engine.load(path)
    cancel = threading.Event()
    try:
        result = tune(model, depths=_depths(args.depths), repeats=args.repeats,
                      max_tokens=args.max_tokens,
                      sampling=SamplingParams(temperature=args.temperature),
                      progress=None if args.json else _progress, cancel=cancel,
                      save=not args.no_save)
    except KeyboardInterrupt:
        cancel.set()
        raise
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"{model.info.name}: {result.prompts} prompts x {result.repeats} repeats, "
          f"{result.max_tokens} tokens each, {result.elapsed_s:.0f} s")
    print(_table(result))
    print(result.message)
    return 0
