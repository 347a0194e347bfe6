"""``bench``: mlx-lm vs depth 0 vs each depth, one process, median of repeats."""
from __future__ import annotations

import json
import sys

from engine.types import DRAFT_MODES, MAX_DEPTH

HELP = "benchmark decode speed: mlx-lm's own generation, depth 0 and each MTP depth, side by side"


def add_arguments(p) -> None:
    from engine.commands.generate import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--depths", default="0,1,2,3",
                   help=f"comma-separated depths (0..{MAX_DEPTH}, auto)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", default=None, help="JSON file: [prompts] or {class: [prompts]}")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--mixed", action="store_true",
                   help="in-domain (held-out) and out-of-domain classes, plus both alternating")
    p.add_argument("--per-class", type=int, default=6, help="prompts per class with --mixed")
    p.add_argument("--replay", action="store_true",
                   help="draft with a replay of the depth-0 output (best-case ceiling per depth)")
    p.add_argument("--profile", action="store_true",
                   help="synchronise after each phase to measure the cycle's time split")
    p.add_argument("--draft-mode", choices=DRAFT_MODES, default="filtered",
                   help="how the MTP head drafts at temperature > 0 (all exact): the target's "
                        "filters (default), softmax only, or its argmax")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's own generation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampling", action="store_true",
                   help="only time sampling per verified row at --vocab (no model): the dense "
                        "path against the compact top-k one")
    p.add_argument("--vocab", type=int, default=248_320, help="vocabulary size for --sampling")


def _run_sampling(args) -> int:
    from engine import SamplingParams
    from engine.bench import sampling_cost

    params = SamplingParams(temperature=args.temperature or 0.6, top_p=args.top_p,
                            top_k=args.top_k)
    result = sampling_cost(vocab=args.vocab, params=params, repeats=max(args.repeats, 5))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"sampling one verified row, V={args.vocab}, temperature {params.temperature}, "
          f"top-p {params.top_p}, top-k {params.top_k} (median of {max(args.repeats, 5)})")
    for name, ms in result["ms_per_row"].items():
        print(f"{name:>8} {ms:8.3f} ms/row")
    return 0


def run(args) -> int:
    if args.sampling:
        return _run_sampling(args)
    from engine import SamplingParams, default_model_path, load
    from engine.bench import load_prompt_sets, mixed_prompt_sets, run_bench
    from engine.commands.generate import parse_depth
    from engine.sysinfo import system_info

    model = load(args.model or default_model_path(), dtype=args.dtype)
    depths = [parse_depth(d.strip()) for d in args.depths.split(",") if d.strip()]
    if 0 not in depths:
        depths.insert(0, 0)
    if args.prompt:
        prompts = {"prompts": args.prompt}
    elif args.mixed:
        prompts = mixed_prompt_sets(model, args.prompts, per_class=args.per_class)
    else:
        prompts = load_prompt_sets(model, args.prompts)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    result = run_bench(model, prompts=prompts, depths=depths, max_tokens=args.max_tokens,
                       params=params, repeats=args.repeats, chat=not args.raw, replay=args.replay,
                       profile=args.profile, include_mlx_lm=not args.no_mlx_lm, seed=args.seed,
                       draft_mode=args.draft_mode, progress=log)
    info = system_info()
    result["model"] = {"path": model.info.path, "params": model.info.num_parameters,
                       "dtype": model.info.dtype, "has_mtp": model.info.has_mtp}
    result["machine"] = {k: info[k] for k in ("device", "blas", "mlx_version", "mlx_lm_version")}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"model {model.info.name} ({model.info.num_parameters / 1e6:.1f}M params, {model.info.dtype}), "
          f"{info['device']}/{info['blas']}, temperature {args.temperature}, "
          f"{args.max_tokens} tokens, median of {args.repeats}" + (", REPLAY drafter" if args.replay else ""))
    for cls, rows in result["classes"].items():
        print(f"\n[{cls}]")
        print(f"{'decoder':>8} {'tok/s':>8} {'vs d0':>6} {'tok/cyc':>7} {'peak MiB':>8}  acceptance rate by position")
        for lab, r in rows.items():
            acc = " ".join("-" if a is None else f"{a:.2f}" for a in r.get("acceptance_rate_by_position", [])[:4])
            sp = "" if r["speedup_vs_depth0"] is None else f"{r['speedup_vs_depth0']:.2f}x"
            share = r.get("time_share")
            split = (" | draft {draft:.0%} verify {verify:.0%} accept {accept:.0%} "
                     "commit {commit:.0%}".format(**share)) if share and args.profile else ""
            print(f"{lab:>8} {r['tok_s']:8.1f} {sp:>6} {r.get('tokens_per_cycle', ''):>7} "
                  f"{r['peak_memory_mib']:8.1f}  {acc}{split}")
    return 0
