"""``bench --streams 1,2,4,8``: batched decoding measured side by side, in ONE process.

For each batch size B, B different prompts (the bench prompts, chat-templated, cycled) are
decoded together, each for ``max_tokens`` tokens, by
- ``mlx_lm``: mlx-lm's own continuous batching (``BatchGenerator``) on the same weights;
- ``0``: this engine's batch (``engine.decoding.decoder.BatchDecoder``) at depth 0;
- each requested depth (``3``, ``auto``, ...) with the MTP head drafting;
- with ``replay``: each depth drafting a replay of the stream's own depth-0 output (acceptance
  1: the ceiling of the batched cycle, the only meaningful speculation on random weights).

Aggregate decode tok/s = the tokens every stream generates after all B prompts are prefilled
and have their first token / the wall time from then to the last token (for every decoder
alike; prefill is measured by ``bench --context``, joining by the TTFT below). Cells
are interleaved within each repeat, in an order that rotates from one repeat to the next, and
the median of ``repeats`` is reported. Also reported:
peak memory of each engine batch (``mx.get_peak_memory``) and its growth per added stream,
and the time to first token of a stream that joins a busy batch of B - 1 streams with a
one-chunk prompt (``PREFILL_CHUNK`` tokens), next to one prefill chunk plus one cycle.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import mlx.core as mx

from engine.core.carryover import carryover_of
from engine.decoding.decoder import BatchDecoder
from engine.decoding.drafters import ReplayDrafter
from engine.decoding.session import PREFILL_CHUNK, Session
from engine.types import SamplingParams


def _prompts(model, texts: list[str], n: int) -> list[list[int]]:
    ids = [model.chat_ids([{"role": "user", "content": t}], enable_thinking=False)
           for t in texts]
    return [ids[i % len(ids)] for i in range(n)]


def mlx_lm_batch(model, prompts: list[list[int]], max_tokens: int,
                 params: SamplingParams) -> tuple[float, int]:
    """mlx-lm's ``BatchGenerator`` on ``prompts``: (seconds, generated tokens)."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=params.temperature, top_p=params.top_p, top_k=params.top_k)
    gen = BatchGenerator(model.trunk, max_tokens=max_tokens, sampler=sampler,
                         stop_tokens=[[t] for t in model.info.eos_token_ids])
    gen.insert(prompts, [max_tokens] * len(prompts))
    gen.next_generated()  # prefill of every prompt and each stream's first token
    t0, n = time.perf_counter(), 0
    while True:
        got = gen.next_generated()
        if not got:
            break
        n += len(got)
    return time.perf_counter() - t0, n


def engine_batch(model, prompts: list[list[int]], max_tokens: int, params: SamplingParams,
                 depth, *, replays: list[list[int]] | None = None, seed: int = 0,
                 ) -> tuple[float, int, list[list[int]], int, dict[str, float]]:
    """This engine's batch: (seconds, generated tokens, each stream's tokens, peak bytes,
    the anatomy of its full-batch cycles: ``_anatomy``)."""
    carryover_of(model).reset_prompt_cache()
    mx.reset_peak_memory()
    dec = BatchDecoder(model, max_streams=len(prompts), use_mtp=replays is None)
    streams = [dec.add(p, max_tokens=max_tokens, depth=depth, sampling=params, seed=seed + i,
                       drafter=None if replays is None else ReplayDrafter(replays[i]))
               for i, p in enumerate(prompts)]
    out = {s.id: [] for s in streams}
    while dec.waiting or dec.admission.joining:  # every prompt prefilled, every first token out
        for st, ev in dec.admit_step():
            out[st.id].extend(ev.token_ids)
    t0, n, full = time.perf_counter(), 0, {}
    for st, ev in dec.run():
        out[st.id].extend(ev.token_ids)
        n += len(ev.token_ids)
        if ev.stats is not None and ev.stats.batch_rows == len(prompts):
            full.setdefault(dec.cycles, []).append(ev.stats)  # a cycle's rows share its times
    dt = time.perf_counter() - t0
    return dt, n, [out[s.id] for s in streams], mx.get_peak_memory(), _anatomy(full)


PHASES = ("total", "draft", "verify", "accept", "commit")


def _anatomy(cycles: dict[int, list]) -> dict[str, float]:
    """Medians over the cycles in which every stream had a row: the cycle's seconds in all
    (``total``) and by phase (``accept`` includes the wait on its host sync), and the mean
    tokens a row got from a cycle (``tokens_per_row``); ``cycles``: how many. Empty when no
    cycle had every row (the streams ended at once)."""
    if not cycles:
        return {}
    rows = list(cycles.values())

    def seconds(s, phase: str) -> float:
        return s.t_accept + s.t_sync if phase == "accept" else getattr(s, "t_" + phase)
    out = {p: statistics.median(seconds(r[0], p) for r in rows) for p in PHASES}
    out["tokens_per_row"] = statistics.mean(s.accepted + 1 for r in rows for s in r)
    out["cycles"] = float(len(rows))
    return out


def _cells(model, prompts, max_tokens, params, depths, replay, mlx_lm) -> dict[str, Callable]:
    """label -> a no-argument run returning (seconds, tokens); fills ``plain`` (depth 0's
    tokens, the replays), ``peak`` and ``anatomy`` (a list per label) as a side effect."""
    state: dict = {"plain": None, "peak": {}, "anatomy": {}}

    def eng(depth, lab):
        def go():
            replays = state["plain"] if (replay and depth != 0) else None
            dt, n, toks, peak, anatomy = engine_batch(model, prompts, max_tokens, params,
                                                      depth, replays=replays)
            if depth == 0:
                state["plain"] = toks
            state["peak"][lab] = peak
            if anatomy:
                state["anatomy"].setdefault(lab, []).append(anatomy)
            return dt, n
        return go

    cells: dict[str, Callable] = {}
    if mlx_lm:
        cells["mlx_lm"] = lambda: mlx_lm_batch(model, prompts, max_tokens, params)
    cells["0"] = eng(0, "0")
    for d in depths:
        if d != 0:
            lab = f"{d}" + ("r" if replay else "")
            cells[lab] = eng(d, lab)
    cells["_state"] = state  # type: ignore[assignment]
    return cells


def streams_bench(model, *, streams: list[int], depths: list, max_tokens: int,
                  texts: list[str], params: SamplingParams, repeats: int = 3,
                  replay: bool = False, mlx_lm: bool = True,
                  progress: Callable[[str], None] | None = None) -> dict:
    """The table: {B: {label: aggregate tok/s (median)}, ...} plus peaks, and each engine
    cell's cycle anatomy ({B: {label: {phase: median over repeats}}}, see ``_anatomy``)."""
    table, peaks, anatomy = {}, {}, {}
    for b in streams:
        prompts = _prompts(model, texts, b)
        cells = _cells(model, prompts, max_tokens, params, depths, replay, mlx_lm)
        state = cells.pop("_state")
        runs: dict[str, list[float]] = {lab: [] for lab in cells}
        cells["0"]()  # warm-up (and the replays)
        state["anatomy"].clear()
        order = list(cells.items())
        for r in range(repeats):
            turn = r % len(order)  # a rotating order: no decoder always runs right after
            for lab, go in order[turn:] + order[:turn]:  # the same other one
                dt, n = go()
                runs[lab].append(n / dt if dt > 0 else 0.0)
                if progress:
                    progress(f"streams {b} repeat {r + 1}/{repeats} {lab}: {n / dt:.1f} tok/s")
        table[b] = {lab: statistics.median(v) for lab, v in runs.items()}
        peaks[b] = dict(state["peak"])
        anatomy[b] = {lab: {k: statistics.median(a[k] for a in runs_)
                            for k in runs_[0]} for lab, runs_ in state["anatomy"].items()}
    return {"aggregate_tok_s": table, "peak_bytes": peaks,
            "per_stream_bytes": _per_stream(peaks, streams), "anatomy": anatomy}


def _per_stream(peaks: dict, streams: list[int]) -> dict[str, float]:
    """Peak-memory growth per added stream, from the smallest to the largest batch."""
    lo, hi = min(streams), max(streams)
    if lo == hi:
        return {}
    return {lab: (peaks[hi][lab] - peaks[lo][lab]) / (hi - lo)
            for lab in peaks[hi] if lab in peaks[lo]}


def join_ttft(model, *, busy: int, depth, texts: list[str], params: SamplingParams,
              repeats: int = 3) -> dict:
    """Time to first token of a stream joining ``busy`` running streams with a one-chunk
    prompt, against one prefill chunk alone plus the batch's cycle time (medians)."""
    import dataclasses

    from engine.bench.long_context import fill_prompt
    from engine.models.model import Model

    long = fill_prompt(model, PREFILL_CHUNK, texts)
    # the busy streams must stay busy: the same weights without an end-of-sequence token
    model = Model(trunk=model.trunk, mtp=model.mtp, tokenizer=model.tokenizer,
                  info=dataclasses.replace(model.info, eos_token_ids=()))
    ttfts, bounds = [], []
    for r in range(repeats):
        carryover_of(model).reset_prompt_cache()
        dec, stop = BatchDecoder(model, max_streams=busy + 1), threading.Event()
        for p in _prompts(model, texts, busy):
            dec.add(p, max_tokens=10_000, depth=depth, sampling=params, seed=r, cancel=stop)
        while dec.waiting or dec.admission.joining:
            dec.step()
        cycles = [ev.stats.t_total for _ in range(4) for st, ev in dec.step() if ev.stats]
        joiner = dec.add(long, max_tokens=4, depth=depth, sampling=params, seed=r)
        t0 = time.perf_counter()
        while not any(st is joiner for st, _ in dec.admit_step()):
            cycles += [ev.stats.t_total for st, ev in dec.cycle_step() if ev.stats]
        ttfts.append(time.perf_counter() - t0)
        bounds.append(_chunk_seconds(model, long) + statistics.median(cycles))
        stop.set()
        while dec.busy:
            dec.step()
    return {"busy_streams": busy, "prompt_tokens": len(long),
            "ttft_s": statistics.median(ttfts), "chunk_plus_cycle_s": statistics.median(bounds)}


def _chunk_seconds(model, ids: list[int]) -> float:
    s = Session.fresh(model, use_mtp=model.mtp is not None)
    t0 = time.perf_counter()
    s.prefill(ids)
    mx.eval(s.last_logits)
    return time.perf_counter() - t0


def run_streams(args, model, depths: list, texts: list[str]) -> int:
    """The ``bench --streams`` command: measure, then print the table (or JSON)."""
    import json
    import sys

    streams = [int(x) for x in args.streams.split(",") if x.strip()]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    res = streams_bench(model, streams=streams, depths=depths, max_tokens=args.max_tokens,
                        texts=texts, params=params, repeats=args.repeats, replay=args.replay,
                        mlx_lm=not args.no_mlx_lm, progress=log)
    best = next((d for d in depths if d != 0), 0)
    res["join"] = join_ttft(model, busy=max(max(streams) - 1, 1), depth=best, texts=texts,
                            params=params, repeats=args.repeats)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    _print(model, args, res, streams)
    return 0


def _print(model, args, res: dict, streams: list[int]) -> None:
    table = res["aggregate_tok_s"]
    labs = list(next(iter(table.values())))
    print(f"model {model.info.name} ({model.info.num_parameters / 1e6:.1f}M params, "
          f"{model.info.dtype}), temperature {args.temperature}, {args.max_tokens} tokens per "
          f"stream, median of {args.repeats}; aggregate tok/s over all streams"
          + (" (r: REPLAY drafter, the ceiling)" if args.replay else ""))
    ref = "mlx_lm" if "mlx_lm" in labs else "0"
    print(f"{'streams':>7} " + " ".join(f"{lab:>8}" for lab in labs) + "   best/" + ref
          + "  best/1-stream")
    one = max(v for k, v in table[min(streams)].items() if k != "mlx_lm")
    for b in streams:
        row = table[b]
        best = max(v for k, v in row.items() if k != "mlx_lm")
        print(f"{b:>7} " + " ".join(f"{row[lab]:8.1f}" for lab in labs)
              + f"   {best / row[ref]:6.2f}x  {best / one:6.2f}x")
    for lab, per in res["per_stream_bytes"].items():
        print(f"peak memory per added stream ({lab}): {per / 2**20:.2f} MiB")
    _print_anatomy(res["anatomy"], table, streams)
    j = res["join"]
    print(f"joining a busy batch of {j['busy_streams']} with a {j['prompt_tokens']}-token "
          f"prompt: time to first token {j['ttft_s'] * 1000:.0f} ms (one prefill chunk + one "
          f"cycle: {j['chunk_plus_cycle_s'] * 1000:.0f} ms)")


def _print_anatomy(anatomy: dict, table: dict, streams: list[int]) -> None:
    """Depth 0's cycle and the fastest engine cell's, at each batch size: where the time of a
    cycle with every stream in it goes, and what scaling it allows (``bound``: B rows x the
    tokens a row gets a cycle / the cycle's time, against the same for one stream's fastest
    cell: what B streams could reach against one if no stream ever left the batch)."""
    rows = []
    for b in streams:
        got = anatomy.get(b, {})
        fastest = max((lab for lab in table[b] if lab in got), key=table[b].get, default=None)
        rows += [(b, lab, got[lab]) for lab in dict.fromkeys(("0", fastest)) if lab in got]
    if not rows:
        return
    one = min(streams)
    ref = [a for b, lab, a in rows if b == one][-1]
    per = one * ref["tokens_per_row"] / ref["total"]
    print("cycles with every stream in the batch (median ms; tokens a row gets a cycle):")
    print(f"{'streams':>7} {'cell':>5} " + " ".join(f"{p:>7}" for p in PHASES)
          + "  tok/row    bound")
    for b, lab, a in rows:
        bound = b * a["tokens_per_row"] / a["total"] / per
        print(f"{b:>7} {lab:>5} " + " ".join(f"{1000 * a[p]:7.2f}" for p in PHASES)
              + f"  {a['tokens_per_row']:7.2f}  {bound:6.2f}x")
