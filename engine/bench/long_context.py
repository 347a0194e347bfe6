"""Long-context and reopened-chat measurements, each in ONE process (``bench --context``,
``bench --reopen``).

- ``context_bench``: for each context length the prompt is real text (the held-out prompts,
  repeated) cut to that many tokens. mlx-lm's ``stream_generate`` prefills and decodes it on
  the same weights; this engine prefills it once with the MTP head (what every depth > 0 pays)
  and then decodes from that prefilled state at depth 0 and at each requested depth (the
  in-memory snapshot is handed to each run, so one prefill serves them all). Reported per
  length: prefill tok/s (mlx-lm, engine) and decode tok/s per decoder, medians of
  ``repeats``. ``replay``: depths > 0 draft a replay of the depth-0 output (acceptance 1, the
  cycle cost alone; random-weight models have no useful MTP head).
- ``reopen_bench``: time to first token of a reopened conversation (the saved ``tokens`` plus
  a new user turn) on a freshly loaded model, with the disk prompt cache (``engine.decoding.diskcache``)
  and without it. The conversation is saved first by a run on another model instance; the
  cache folder is a temporary one, removed afterwards.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from engine.core.carryover import carryover_of
from engine.decoding.drafters import ReplayDrafter
from engine.metrics.summary import ReplyTally
from engine.types import SamplingParams

GREEDY = SamplingParams()


def fill_prompt(model, n: int, texts: list[str]) -> list[int]:
    """``n`` token ids of real text: ``texts`` joined, repeated until long enough."""
    block = list(model.tokenizer.encode("\n\n".join(texts) + "\n\n", add_special_tokens=False))
    if not block:
        raise ValueError("the prompt texts encode to no tokens")
    ids = block * (n // len(block) + 1)
    return ids[:n]


def _mlx_lm(model, ids: list[int], max_tokens: int) -> tuple[float, float, list[int]]:
    """mlx-lm's own generation: (prefill tok/s, decode tok/s, tokens)."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    toks, t_first, prompt_tps = [], None, 0.0
    for r in stream_generate(model.trunk, model.tokenizer, mx.array(ids), max_tokens=max_tokens,
                             sampler=make_sampler(temp=0.0)):
        if t_first is None:
            t_first, prompt_tps = time.perf_counter(), r.prompt_tps
        toks.append(r.token)
    dt = time.perf_counter() - t_first
    return prompt_tps, (len(toks) - 1) / dt if len(toks) > 1 and dt > 0 else 0.0, toks


def _engine(model, ids, depth, max_tokens, snap=None, drafter=None) -> tuple[ReplyTally, object]:
    """One engine run (resumed from ``snap`` when given); returns its tally and the snapshot
    taken after the prompt."""
    carryover_of(model).reset_prompt_cache()
    if snap is not None:
        carryover_of(model).prompt_cache.keep(snap)
    tally = ReplyTally()
    for ev in model.generate(ids, max_tokens=max_tokens, depth=depth, sampling=GREEDY,
                             drafter=drafter):
        tally.add(ev)
    after = next((s for s in carryover_of(model).prompt_cache.snapshots
                  if len(s.fed) == len(ids)), None)
    return tally, after


def _one_length(model, ids: list[int], depths: list[int], max_tokens: int,
                replay: bool) -> dict:
    """Prefill and decode figures at one context length (one repeat)."""
    row = {}
    pre, dec, _ = _mlx_lm(model, ids, max_tokens)
    row["prefill mlx_lm"], row["mlx_lm"] = pre, dec
    first = max(depths) if max(depths) > 0 and model.mtp is not None else 0
    tally, snap = _engine(model, ids, first, 1)
    pf = tally.summary()
    row["prefill engine"] = pf.prompt_tokens / pf.ttft_s if pf.ttft_s else 0.0
    ref, _ = _engine(model, ids, 0, max_tokens, snap)
    row["0"] = ref.summary().tokens_per_s
    for d in depths:
        if d == 0:
            continue
        drafter = ReplayDrafter(ref.token_ids) if replay else None
        t, _ = _engine(model, ids, d, max_tokens, snap, drafter)
        if t.summary().reused_tokens != len(ids):
            raise RuntimeError("the prefilled state was not reused")
        row[str(d)] = t.summary().tokens_per_s
    return row


def context_bench(model, *, lengths: list[int], depths: list[int], texts: list[str],
                  max_tokens: dict[int, int], repeats: int = 1, replay: bool = False,
                  progress=None) -> dict:
    """{length: {label: median}} with labels "prefill mlx_lm", "prefill engine", "mlx_lm",
    "0" and each depth; ``max_tokens`` is the decode budget per length."""
    carry = carryover_of(model)
    saved, carry.disk_cache = carry.disk_cache, None  # every prefill is a real one
    try:
        _engine(model, fill_prompt(model, 64, texts), 0, 4)  # warm-up
        out = {}
        for n in lengths:
            ids = fill_prompt(model, n, texts)
            runs = [_one_length(model, ids, depths, max_tokens[n], replay)
                    for _ in range(repeats)]
            out[n] = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
            if progress:
                progress(f"context {n}: {out[n]}")
        return out
    finally:
        carryover_of(model).disk_cache = saved
        carryover_of(model).reset_prompt_cache()


def _ttft(model, ids: list[int], depth: int) -> tuple[float, int]:
    """(seconds to the first event, reused tokens) of one reply of one token."""
    carryover_of(model).reset_prompt_cache()
    t0 = time.perf_counter()
    ev = next(iter(model.generate(ids, max_tokens=1, depth=depth, sampling=GREEDY)))
    return time.perf_counter() - t0, ev.prefill.reused_tokens


def reopen_bench(path: str, *, tokens: int, texts: list[str], depths: list[int],
                 repeats: int = 3, dtype: str | None = None, progress=None) -> dict:
    """Time to first token of a reopened ``tokens``-token chat, with and without the disk
    cache, on a model loaded afresh for every measurement; medians of ``repeats``."""
    from engine.models.model import load
    from engine.paths import folder_size

    root = Path(tempfile.mkdtemp(prefix="mtpchat-reopen-"))
    out = {}
    try:
        for depth in depths:
            first = load(path, dtype=dtype)
            carryover_of(first).disk_cache = _disk(first, root, dtype)
            ids = fill_prompt(first, tokens, texts)
            reopened = ids + fill_prompt(first, 24, texts[::-1])  # the new user turn
            _engine(first, ids, depth, 2)
            carryover_of(first).disk_cache.flush()
            times = {"with": [], "without": [], "reused": 0}
            for _ in range(repeats):
                for mode in ("without", "with"):
                    model = load(path, dtype=dtype)
                    carryover_of(model).disk_cache = \
                        _disk(model, root, dtype) if mode == "with" else None
                    before = set(root.rglob("*"))
                    secs, reused = _ttft(model, reopened, depth)
                    times[mode].append(secs)
                    _forget_new(model, root, before)  # the next measurement reopens again
                    if mode == "with":
                        times["reused"] = reused
            out[depth] = {"prompt_tokens": len(reopened), "reused_tokens": times["reused"],
                          "ttft_without_s": round(statistics.median(times["without"]), 4),
                          "ttft_with_s": round(statistics.median(times["with"]), 4),
                          "entry_mib": round(folder_size(root) / 2**20, 2)}
            if progress:
                progress(f"depth {depth}: {out[depth]}")
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return out


def _disk(model, root: Path, dtype):
    from engine.decoding import diskcache

    return diskcache.from_env(model.info.path, model.info.dtype, model.make_cache(),
                              model.mtp.make_cache() if model.mtp is not None else None,
                              root=root, enabled=True)


def _forget_new(model, root: Path, before: set) -> None:
    """Remove what a measurement saved to the disk cache (its own reopened prompt)."""
    if carryover_of(model).disk_cache is not None:
        carryover_of(model).disk_cache.flush()
    for f in set(root.rglob("*")) - before:
        if f.is_file():
            f.unlink()
