"""``train-demo``: train the embedded demo model (needs the ``train`` extra: PyTorch)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = "train the demo Qwen3.5-architecture model with its MTP head (PyTorch, CPU)"


def fraction(text: str) -> float:
    """An argparse type: a share of windows, 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(text)
    return value


def count(low: int, high: int):
    """An argparse type: a whole number from ``low`` to ``high`` (argparse's one-line error
    names the range otherwise)."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value

    parse.__name__ = f"{low}..{high}"  # argparse: "invalid 1..256 value: '0'"
    return parse


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, type=Path, help="output folder (raw HF layout)")
    p.add_argument("--steps", type=count(1, 1_000_000), default=None, metavar="1..1000000",
                   help="total optimizer steps (joint, MTP and refine phases, ratios kept); "
                        "default: the shipped configuration")
    p.add_argument("--seed", type=int, default=0, help="seed (the run is deterministic)")
    p.add_argument("--tiny", action="store_true", help="a minute-scale configuration for tests")
    p.add_argument("--mtp-tool-share", type=fraction, default=None, metavar="0..1",
                   help="share of tool-chat windows in the MTP phase, drawn from a stream of "
                        "its own (0: the question/answer chats only); default: the joint "
                        "phase's stream goes on, as the shipped demo was trained")
    p.add_argument("--refine-steps", type=count(0, 100_000), default=None, metavar="0..100000",
                   help="phase 3's steps: more distillation of the kept head with a fresh "
                        "schedule (default: the shipped configuration's)")
    p.add_argument("--refine-tool-share", type=fraction, default=None, metavar="0..1",
                   help="share of tool-chat windows in phase 3 (default: the shipped 0.3)")
    p.add_argument("--refine", type=Path, default=None, metavar="DIR",
                   help="run phase 3 alone on the train-demo folder DIR (trained without it) "
                        "and write the result to --out; DIR is left as it was")
    p.add_argument("--threads", type=count(1, 256), default=1, metavar="1..256",
                   help="torch CPU threads (default 1: on a shared 2-core CPU one thread was "
                        "measured faster than two; results depend on the thread count)")


def _line(ev: dict) -> str:
    kind = ev.get("event")
    if kind == "step":
        extra = " ".join(f"{k}={v}" for k, v in ev.items() if k.startswith("mtp_kl"))
        loss = f"loss={ev['loss']:.4f} mtp_loss={ev['mtp_loss']:.4f}" if "loss" in ev else extra
        return (f"[{ev['phase']:5s}] step {ev['step']:5d}  {loss}  "
                f"{ev['tokens_per_s']:.0f} tok/s  elapsed {ev['elapsed_s'] / 60:.1f} min  "
                f"ETA {ev['eta_s'] / 60:.1f} min")
    if kind == "eval" and ev.get("after") == "tools":
        return (f"[eval ] tool calls on unseen names: {ev['calls']:.0%} exact calls, "
                f"{ev['answers']:.0%} answers open with the result's signature "
                f"({ev['prompts']} prompts); the answers' acceptance by position "
                f"{ev.get('acceptance')}, tokens/cycle {ev.get('tokens_per_cycle')}")
    if kind == "eval":
        return (f"[eval ] after {ev['after']}: acceptance by position {ev['acceptance']}, "
                f"tokens/cycle {ev['tokens_per_cycle']} ({ev['prompts']} prompts, "
                f"{ev['generated_tokens']} tokens)")
    return f"[{kind}] " + " ".join(f"{k}={v}" for k, v in ev.items() if k != "event")


def run(args) -> int:
    from dataclasses import replace

    try:
        from engine.training import trainer
    except ModuleNotFoundError as exc:  # torch missing
        print(f"error: train-demo needs the 'train' extra ({exc.name} is not installed): "
              "pip install 'mtpchat[train]'", file=sys.stderr)
        return 2

    def report(ev: dict) -> None:
        print(json.dumps(ev) if args.json else _line(ev), flush=True)

    if args.refine is not None:
        return _refine(args, report)
    cfg = replace(trainer.config_for(tiny=args.tiny, steps=args.steps, seed=args.seed),
                  threads=args.threads, mtp_tool_share=args.mtp_tool_share)
    if args.refine_steps is not None:
        cfg = replace(cfg, refine_steps=args.refine_steps)
    if args.refine_tool_share is not None:
        cfg = replace(cfg, refine_tool_share=args.refine_tool_share)
    trainer.train_demo(args.out, cfg, report)
    return 0


def _refine(args, report) -> int:
    from engine.training import refine, trainer

    fixed = [name for name, value in (("--tiny", args.tiny), ("--steps", args.steps),
                                      ("--seed", args.seed), ("--mtp-tool-share",
                                                              args.mtp_tool_share))
             if value not in (None, False, 0)]
    why = refine.check_refinable(args.refine, args.out)
    if fixed:
        why = f"{', '.join(fixed)} cannot change a trained folder (--refine reads its config)"
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    shipped = trainer.TrainConfig()
    steps = shipped.refine_steps if args.refine_steps is None else args.refine_steps
    share = (shipped.refine_tool_share if args.refine_tool_share is None
             else args.refine_tool_share)
    if not steps:
        print("error: --refine-steps 0 would change nothing", file=sys.stderr)
        return 2
    try:
        refine.refine_demo(args.refine, args.out, steps=steps, tool_share=share, report=report,
                           threads=args.threads)
    except KeyboardInterrupt:
        print(f"interrupted: {args.out} is incomplete", file=sys.stderr)
        return 130
    return 0
