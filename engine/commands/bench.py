"""``bench``: mlx-lm (and mlx-vlm, where installed) vs depth 0 vs each depth, one process,
median of repeats."""
from __future__ import annotations

import argparse

import json
import sys

from engine.types import DRAFT_MODES, MAX_DEPTH

HELP = ("benchmark decode speed: mlx-lm's own generation, mlx-vlm's plain and MTP decoding "
        "(where installed), depth 0 and each MTP depth, side by side")


def add_arguments(p) -> None:
    from engine.commands.generate import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--depths", default="0,1,2,3",
                   help=f"comma-separated depths (0..{MAX_DEPTH}, auto)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--repeats", type=lambda t: _positive(t, "repeats"), default=3)
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
    p.add_argument("--no-mlx-vlm", action="store_true",
                   help="skip mlx-vlm's decoding (run only where mlx-vlm is installed)")
    p.add_argument("--vlm-drafts", default="1,2,3,4", type=_positives, metavar="N,N,...",
                   help="mlx-vlm's MTP at these drafts a round (its draft_block_size N + 1); "
                        "each is a row vlm_dN, and the fastest is the peer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampling", action="store_true",
                   help="only time sampling per verified row at --vocab (no model): the dense "
                        "path against the compact one (top-k, or top-p without top-k)")
    p.add_argument("--vocab", type=int, default=248_320, help="vocabulary size for --sampling")
    p.add_argument("--simulate", action="store_true",
                   help="no model: depth auto against every fixed depth per prompt class in "
                        "the simulator (engine.bench.adaptive_sim), started cold, from a saved "
                        "tuning and carried over from the other class")
    p.add_argument("--context", default=None, metavar="N,N,...", type=_positives,
                   help="long-context mode: prefill and decode tok/s at each context length "
                        "(real text repeated to the length), mlx-lm vs depth 0 vs --depths")
    p.add_argument("--long-max-tokens", default=None, metavar="N,N,...", type=_positives,
                   help="decode tokens per --context length (default: --max-tokens, halved "
                        "above 8k tokens)")
    p.add_argument("--streams", default=None, metavar="N,N,...", type=_stream_counts,
                   help="batched mode: aggregate tok/s of N streams decoded together "
                        "(mlx-lm's BatchGenerator vs this engine's batch at depth 0 and "
                        "--depths), peak memory per stream, and a joining stream's TTFT")
    p.add_argument("--reopen", type=_positive, default=None, metavar="TOKENS",
                   help="time to first token of a reopened TOKENS-token chat on a freshly "
                        "loaded model, with and without the prompt cache on disk")


def _run_sampling(args) -> int:
    from engine import SamplingParams
    from engine.bench.side_by_side import sampling_cost

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


def _texts(model, args) -> list[str]:
    from engine.bench.side_by_side import load_prompt_sets

    if args.prompt:
        return list(args.prompt)
    return [p for ps in load_prompt_sets(model, args.prompts).values() for p in ps]


def _positive(text: str, what: str = "tokens") -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of {what} >= 1, not {text!r}")
    return n


def _positives(text: str, what: str = "tokens") -> str:
    """An argparse type: comma-separated counts (of ``what``), each >= 1 (kept as the text)."""
    for part in text.split(","):
        _positive(part.strip(), what)
    return text


def _stream_counts(text: str) -> str:
    """An argparse type for ``--streams``: comma-separated stream counts, each >= 1."""
    return _positives(text, "streams")


def _run_context(args, model, depths) -> int:
    from engine.bench.long_context import context_bench

    lengths = [int(x) for x in args.context.split(",") if x.strip()]
    if args.long_max_tokens:
        budgets = [int(x) for x in args.long_max_tokens.split(",")]
        max_tokens = dict(zip(lengths, budgets + budgets[-1:] * len(lengths)))
    else:
        max_tokens = {n: args.max_tokens if n <= 8192 else max(args.max_tokens // 2, 4)
                      for n in lengths}
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    res = context_bench(model, lengths=lengths, depths=depths, texts=_texts(model, args),
                        max_tokens=max_tokens, repeats=args.repeats, replay=args.replay,
                        progress=log)
    if args.json:
        print(json.dumps({"context": res, "max_tokens": max_tokens, "replay": args.replay},
                         indent=1))
        return 0
    print(f"model {model.info.name} ({model.info.num_parameters / 1e6:.1f}M params, "
          f"{model.info.dtype}), greedy, median of {args.repeats}"
          + (", depths > 0 draft a REPLAY of depth 0" if args.replay else ""))
    labs = [k for k in next(iter(res.values())) if not k.startswith("prefill")]
    print(f"{'context':>7} {'decode':>6} {'prefill tok/s':>22}  decode tok/s: "
          + " ".join(f"{lab:>7}" for lab in labs) + "   d/mlx-lm")
    print(f"{'':>7} {'tokens':>6} {'mlx-lm':>10} {'engine':>11}")
    for n, r in res.items():
        ratios = " ".join(f"{lab}:{r[lab] / r['mlx_lm']:.2f}" for lab in labs[1:] if r["mlx_lm"])
        print(f"{n:>7} {max_tokens[n]:>6} {r['prefill mlx_lm']:>10.1f} {r['prefill engine']:>11.1f}"
              "                " + " ".join(f"{r[lab]:>7.2f}" for lab in labs) + f"   {ratios}")
    return 0


def _run_reopen(args, depths) -> int:
    from engine import default_model_path, load
    from engine.bench.long_context import reopen_bench

    path = args.model or default_model_path()
    texts = _texts(load(path, dtype=args.dtype), args)
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    res = reopen_bench(path, tokens=args.reopen, texts=texts, depths=depths,
                       repeats=args.repeats, dtype=args.dtype, progress=log)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"reopened chat: {args.reopen} saved tokens + a new turn, model loaded afresh for "
          f"each measurement, median of {args.repeats}")
    print(f"{'depth':>5} {'prompt':>7} {'reused':>7} {'TTFT no disk cache':>19} "
          f"{'TTFT disk cache':>16} {'speed-up':>8}")
    for d, r in res.items():
        print(f"{d:>5} {r['prompt_tokens']:>7} {r['reused_tokens']:>7} "
              f"{r['ttft_without_s']:>18.3f}s {r['ttft_with_s']:>15.3f}s "
              f"{r['ttft_without_s'] / r['ttft_with_s']:>7.1f}x")
    return 0


def _run_simulate(args) -> int:
    from engine.bench.adaptive_sim import WORKLOADS, format_table, table
    from engine.bench.adaptive_traces import workloads as recorded

    rows = table(workloads=WORKLOADS + tuple(recorded()), max_tokens=args.max_tokens)
    if args.json:
        keep = ("workload", "start", "class", "auto", "fixed", "best", "ratio")
        print(json.dumps([{k: r[k] for k in keep} for r in rows], indent=1))
        return 0
    print(f"simulated replies of up to {args.max_tokens} tokens, 4 runs x 20 replies per row "
          "(engine.bench.adaptive_sim; recorded-*: replies replaying the demo model's recorded "
          "cycles, engine.bench.adaptive_traces)")
    print(format_table(rows))
    return 0


def run(args) -> int:
    if args.sampling:
        return _run_sampling(args)
    if args.simulate:
        return _run_simulate(args)
    if args.reopen:
        from engine.commands.generate import parse_depth

        return _run_reopen(args, [parse_depth(d.strip()) for d in args.depths.split(",")
                                  if d.strip()])
    if args.prompts:
        from engine.bench.side_by_side import read_prompt_file

        read_prompt_file(args.prompts)  # a bad file is refused before the model loads
    from engine import SamplingParams, default_model_path, load
    from engine.bench.side_by_side import load_prompt_sets, mixed_prompt_sets, run_bench
    from engine.commands.generate import parse_depth
    from engine.sysinfo import system_info

    model = load(args.model or default_model_path(), dtype=args.dtype)
    depths = [parse_depth(d.strip()) for d in args.depths.split(",") if d.strip()]
    if 0 not in depths:
        depths.insert(0, 0)
    if args.context:
        return _run_context(args, model, [d for d in depths if d != "auto"])
    if args.streams:
        from engine.bench.streams import run_streams

        return run_streams(args, model, depths, _texts(model, args))
    if args.prompt:
        prompts = {"prompts": args.prompt}
    elif args.mixed:
        prompts = mixed_prompt_sets(model, args.prompts, per_class=args.per_class)
    else:
        prompts = load_prompt_sets(model, args.prompts)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    vlm, why_not = _vlm_peer(args, model)
    result = run_bench(model, prompts=prompts, depths=depths, max_tokens=args.max_tokens,
                       params=params, repeats=args.repeats, chat=not args.raw, replay=args.replay,
                       profile=args.profile, include_mlx_lm=not args.no_mlx_lm, seed=args.seed,
                       draft_mode=args.draft_mode, progress=log, vlm=vlm,
                       vlm_drafts=tuple(int(n) for n in args.vlm_drafts.split(",")))
    result["mlx_vlm"] = _vlm_version() if vlm is not None else why_not
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
    if vlm is None:
        print(f"mlx-vlm: {why_not}")
    for cls, rows in result["classes"].items():
        _print_class(cls, rows, result["auto_vs_best_fixed"].get(cls), profile=args.profile,
                     peers=result["peers"].get(cls))
    return 0


def _vlm_peer(args, model) -> tuple:
    """(mlx-vlm's decoding of the model or None, why not)."""
    if args.no_mlx_vlm:
        return None, "skipped (--no-mlx-vlm)"
    from engine.bench.side_by_side import MlxVlmPeer

    return MlxVlmPeer.make(model.info.path, want_mtp=model.info.has_mtp)


def _vlm_version() -> str:
    from importlib.metadata import version

    return f"mlx-vlm {version('mlx-vlm')}"


def _print_class(cls: str, rows: dict, auto: dict | None, *, profile: bool,
                 peers: dict | None = None) -> None:
    """One class's table; ``vs best`` is each decoder against the class's fastest fixed
    depth, ``ids`` the prompts whose greedy tokens equal depth 0's; a line says how ``auto``
    did against the best fixed depth, repeat by repeat, and one how it did against the peers."""
    print(f"\n[{cls}]")
    print(f"{'decoder':>8} {'tok/s':>8} {'vs d0':>6} {'vs best':>7} {'tok/cyc':>7} {'peak MiB':>8}"
          f" {'ids':>5}  acceptance rate by position")
    for lab, r in rows.items():
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r.get("acceptance_rate_by_position", [])[:4])
        sp = "" if r["speedup_vs_depth0"] is None else f"{r['speedup_vs_depth0']:.2f}x"
        vs = "" if r.get("vs_best_fixed") is None else f"{r['vs_best_fixed']:.3f}"
        share = r.get("time_share")
        split = (" | draft {draft:.0%} verify {verify:.0%} accept {accept:.0%} "
                 "commit {commit:.0%}".format(**share)) if share and profile else ""
        same = r.get("same_tokens_as_depth0")
        ids = f"{same[0]}/{same[1]}" if same else ""
        print(f"{lab:>8} {r['tok_s']:8.1f} {sp:>6} {vs:>7} {r.get('tokens_per_cycle', ''):>7} "
              f"{r['peak_memory_mib']:8.1f} {ids:>5}  {acc}{split}")
    if auto and auto["ratio"] is not None:
        each = " ".join(f"{x:.3f}" for x in auto["ratio_by_repeat"])
        print(f"auto / best fixed depth ({auto['best_depth']}): {auto['ratio']:.3f} "
              f"(by repeat: {each})")
    if peers and peers.get("best_depth") is not None:
        parts = [f"{name} {peers[key]:.2f}x" for key, name in (
            ("best_vs_mlx_lm", "/ mlx-lm"),
            ("best_vs_mlx_vlm_mtp", f"/ mlx-vlm MTP ({peers.get('vlm_best')})"))
            if peers.get(key) is not None]
        plain = [f"{name} {peers[key]:.2f}x" for key, name in (
            ("depth0_vs_mlx_lm", "/ mlx-lm"), ("depth0_vs_mlx_vlm", "/ mlx-vlm plain"))
            if peers.get(key) is not None]
        if parts:
            print(f"best depth ({peers['best_depth']}) " + ", ".join(parts)
                  + ("; depth 0 " + ", ".join(plain) if plain else ""))
