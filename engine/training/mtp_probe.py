"""Continue a trained demo's MTP phase on its frozen trunk and measure what that changes.

``python -m engine.training.mtp_probe [--model DIR] --steps 150 --mtp-tool-share 0`` prints
the head's greedy acceptance by position and tokens a cycle on the held-out question/answer
prompts (the trainer's eval set) and on the answers to the held-out tool questions, before and
after ``--steps`` more distillation steps on a chosen mix of windows. It checks an MTP-phase
idea on a shipped trunk in minutes, where ``train-demo`` from scratch takes an hour or more;
its result is not a shipped model (``train-demo``, or ``train-demo --refine`` for phase 3 alone,
makes those), so ``--save`` writes the probed head into a copy for inspection only.

What it found (docs/tools.md): the retrained demo's head lost 3 % of its depth-3 tokens a cycle
on the question/answer prompts for want of MTP-phase steps; 150 more gave it back with the
same window mix (``--mtp-tool-share 0.3``) as with question/answer windows only (``0``). The
trainer's phase 3 (``refine_steps``) is that finding made part of the run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from engine.commands.train_demo import count, fraction
from engine.training import acceptance, refine, tool_chats, trainer
from engine.training.export import export_model

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "mtp-demo-qwen3_5"
config_of = refine.config_of


class Probe:
    """A trained demo folder loaded into torch, with its held-out prompts and window streams."""

    def __init__(self, model_dir: Path, threads: int = 1):
        self.run = refine.load_trained(model_dir, threads)
        self.cfg = self.run.cfg

    def measure(self) -> dict:
        """Greedy acceptance on the trainer's eval prompts and on the held-out tool answers."""
        run, cfg, out = self.run, self.cfg, {}
        qa = trainer.prompt_ids(run.tok, run.data.heldout_prompts)[:cfg.eval_prompts]
        sets = {"qa": (qa, cfg.eval_max_new)}
        if run.tool_heldout:
            sets["tool_answers"] = ([tool_chats.answer_prompt(run.tok, h)
                                     for h in run.tool_heldout], 96)
        for name, (prompts, max_new) in sets.items():
            got = acceptance.measure(run.model, prompts, eos=run.eos, depth=cfg.depth,
                                     max_new=max_new)
            out[name] = {"prompts": got["prompts"], "acceptance": got["acceptance"],
                         "tokens_per_cycle": got["tokens_per_cycle"]}
        return out

    def distill(self, steps: int, tool_share: float, seed: int, report) -> None:
        """``steps`` more MTP-phase steps (a fresh optimizer and learning-rate schedule)."""
        cfg = replace(self.cfg, mtp_steps=steps)
        base, tool = self.run.streams(cfg)
        batches = trainer.Batches(base, tool if tool_share else None, cfg.seq_len,
                                  cfg.batch_size, seed, tool_share)
        prog = trainer.Progress(report, steps, cfg.batch_size * cfg.seq_len)
        trainer.mtp_phase(self.run.model, cfg, batches, prog)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.training.mtp_probe",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEMO, help="a train-demo folder")
    p.add_argument("--steps", type=count(1, 100_000), default=150, metavar="1..100000",
                   help="MTP-phase steps to add")
    p.add_argument("--mtp-tool-share", type=fraction, default=0.0, metavar="0..1",
                   help="share of tool-chat windows in those steps (0: question/answer only)")
    p.add_argument("--seed", type=int, default=99, help="the windows' generator seed")
    p.add_argument("--threads", type=count(1, 256), default=1, metavar="1..256")
    p.add_argument("--save", type=Path, help="copy the folder here with the probed head")
    args = p.parse_args(argv)
    if not (args.model / "training.json").is_file():
        p.error(f"{args.model} is not a train-demo folder (it has no training.json)")
    if args.save and args.save.resolve() == args.model.resolve():
        p.error("--save must be another folder: the probed head is not a shippable model")
    try:
        return _probe(args)
    except KeyboardInterrupt:
        print("interrupted (a --save folder may be incomplete)", file=sys.stderr)
        return 130


def _probe(args) -> int:
    probe = Probe(args.model, args.threads)

    def report(ev: dict) -> None:
        if ev.get("event") == "step" and ev["step"] % 25 == 0:
            print(json.dumps(ev), flush=True)

    before = probe.measure()
    print(json.dumps({"before": before}), flush=True)
    probe.distill(args.steps, args.mtp_tool_share, args.seed, report)
    after = probe.measure()
    print(json.dumps({"after": after, "steps": args.steps,
                      "mtp_tool_share": args.mtp_tool_share}), flush=True)
    if args.save:
        shutil.copytree(args.model, args.save, dirs_exist_ok=True)
        export_model(probe.run.model, probe.cfg.size, args.save, ids=probe.run.ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
