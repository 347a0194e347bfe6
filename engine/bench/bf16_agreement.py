"""How often greedy decoding at depth k gives exactly depth 0's tokens in bfloat16.

Speculative decoding is exact in exact arithmetic; in bfloat16 the verify forward (k+1 tokens
per row) rounds differently from plain decoding's one-token steps, so a near-tie between the
two best tokens can flip. This measures how often that happens on held-out prompts (the model
folder's ``heldout_prompts.json``; the demo model ships 64), through ``Model.generate`` only,
and replays depth 0 step by step (engine/models/trunk.py on a fresh cache) at each divergence to
print the top-2 logit margin there: a margin within a bfloat16 ulp or two is a near-tie.

    python -m engine.bench.bf16_agreement [--model PATH] [--depths 1,2,3] [--max-tokens N]
        [--prompts N] [--branch cpu|metal]

The device branch (engine/models/device.py) is ``--branch``, else $MTPCHAT_DEVICE_BRANCH,
else the device's.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import engine  # noqa: F401  (before mlx: the engine picks the BLAS)
import mlx.core as mx
import numpy as np

from engine.core.carryover import carryover_of
from engine.models import device
from engine.types import SamplingParams

FALLBACK_PROMPTS = ["Write a python function that sorts a list.", "Explain json.dumps.",
                    "What does os.path.join do?", "Write a stack class."]


@dataclass
class Divergence:
    prompt: int
    position: int       # index into the reply where depth k first differs
    plain: int          # depth 0's token there
    spec: int           # depth k's token there
    margin: float = float("nan")   # replay: top-1 minus top-2 logit
    gap: float = float("nan")      # replay: logit(plain) - logit(spec)
    ulp: float = float("nan")      # bfloat16 spacing at the top logit
    replay_top: int = -1           # replay's argmax (== plain when the replay is faithful)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.bench.bf16_agreement",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the demo model)")
    p.add_argument("--depths", default="1,2,3", help="comma-separated depths k >= 1")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=64, help="how many held-out prompts")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--branch", choices=device.BRANCHES, default=None,
                   help="device branch (default: $MTPCHAT_DEVICE_BRANCH, else the device's)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return p.parse_args(argv)


def heldout_prompts(model, n: int) -> list[list[int]]:
    """The first ``n`` of the model folder's held-out prompts, chat-templated, no thinking."""
    path = Path(model.info.path) / "heldout_prompts.json"
    texts = json.loads(path.read_text("utf-8")) if path.is_file() else FALLBACK_PROMPTS
    return [model.chat_ids([{"role": "user", "content": t}], enable_thinking=False)
            for t in texts[:n]]


def forget_prompts(model) -> None:
    """Empty the model's prompt cache (its carryover's): every reply prefills its prompt
    itself, so depth k never starts from depth 0's prefill."""
    carryover_of(model).reset_prompt_cache()


def reply(model, ids: list[int], depth: int, max_tokens: int) -> list[int]:
    forget_prompts(model)
    out: list[int] = []
    for ev in model.generate(ids, max_tokens=max_tokens, depth=depth,
                             sampling=SamplingParams(temperature=0.0), seed=0):
        out.extend(ev.token_ids)
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a length when one is the other's
    prefix), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def replay_logits(model, ids: list[int], tokens: list[int], position: int) -> np.ndarray:
    """Depth 0 replayed on a fresh cache: the prompt in one prefill forward, then one-token
    steps over ``tokens[:position]``; the float32 view of the logits predicting
    ``tokens[position]``."""
    cache = model.make_cache()
    h, _ = model.forward_hidden(mx.array([ids]), cache)
    h = h[:, -1:]
    for t in tokens[:position]:
        h, _ = model.forward_hidden(mx.array([[t]]), cache)
    return np.array(model.lm_head(h)[0, -1].astype(mx.float32))


def explain(model, ids, plain: list[int], d: Divergence) -> None:
    """Fill ``d``'s replay figures (the logits at the divergence, from depth 0's tokens)."""
    logits = replay_logits(model, ids, plain, d.position)
    top2 = np.argsort(logits)[-2:][::-1]
    d.replay_top = int(top2[0])
    d.margin = float(logits[top2[0]] - logits[top2[1]])
    if d.spec >= 0:
        d.gap = float(logits[d.plain] - logits[d.spec])
    top = float(abs(logits[top2[0]]))
    d.ulp = float(2.0 ** (np.floor(np.log2(top)) - 7)) if top > 0 else 0.0


def compare_depth(model, prompts, plains, depth: int, max_tokens: int) -> dict:
    """Depth ``depth`` against depth 0 on every prompt: counts, positions, divergences."""
    divergences, agreed, total = [], 0, 0
    for i, (ids, plain) in enumerate(zip(prompts, plains)):
        got = reply(model, ids, depth, max_tokens)
        pos = first_divergence(plain, got)
        total += len(plain)
        agreed += len(plain) if pos is None else pos
        if pos is None:
            continue
        d = Divergence(prompt=i, position=pos,
                       plain=plain[pos] if pos < len(plain) else -1,
                       spec=got[pos] if pos < len(got) else -1)
        if d.plain >= 0:
            explain(model, ids, plain, d)
        divergences.append(d)
    return dict(depth=depth, prompts=len(prompts), identical=len(prompts) - len(divergences),
                agreed_tokens=agreed, tokens=total, divergences=divergences)


def report(r: dict) -> list[str]:
    divs = r["divergences"]
    pct = 100.0 * r["agreed_tokens"] / max(1, r["tokens"])
    lines = [f"depth {r['depth']}: {r['prompts']} prompts compared, {r['identical']} identical "
             f"({100.0 * r['identical'] / max(1, r['prompts']):.1f} %); first divergences at "
             f"{[d.position for d in divs] or '-'}; tokens agreeing up to divergence "
             f"{r['agreed_tokens']}/{r['tokens']} ({pct:.2f} %)"]
    for d in divs:
        faithful = "" if d.replay_top == d.plain else f"  (replay's argmax {d.replay_top})"
        lines.append(f"    prompt {d.prompt:2d} at {d.position:3d}: depth 0 {d.plain}, depth "
                     f"{r['depth']} {d.spec}; replay top-2 margin {d.margin:.4g}, "
                     f"logit gap {d.gap:.4g}, bf16 ulp {d.ulp:.4g}{faithful}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.branch:
        device.set_branch(args.branch)
    depths = [int(x) for x in args.depths.split(",") if x.strip()]
    path = args.model or engine.default_model_path()
    model = engine.load(path, dtype=args.dtype)
    prompts = heldout_prompts(model, args.prompts)
    print(f"{Path(path).name} ({args.dtype}), branch {device.branch()} on "
          f"{mx.default_device()}: {len(prompts)} prompts, max {args.max_tokens} tokens")
    plains = [reply(model, ids, 0, args.max_tokens) for ids in prompts]
    results = []
    for depth in depths:
        results.append(compare_depth(model, prompts, plains, depth, args.max_tokens))
        print("\n".join(report(results[-1])), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            [dict(r, divergences=[vars(d) for d in r["divergences"]]) for r in results],
            indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
