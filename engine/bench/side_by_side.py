"""Side-by-side decode benchmark in ONE process: mlx-lm's own ``stream_generate`` on the same
weights, mlx-vlm's plain and MTP decoding where mlx-vlm is installed (``MlxVlmPeer``), this
engine at depth 0, and each requested depth (and ``auto``). Every decoder runs each prompt back
to back in a rotating order; greedy runs also count, per decoder, the prompts whose tokens equal
this engine's depth 0."""
from __future__ import annotations

import json
import stat
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from engine.core.carryover import carryover_of
from engine.decoding.drafters import ReplayDrafter
from engine.metrics.summary import ReplyTally, round_rates, summarize_cycles
from engine.types import DraftMode, SamplingParams

DEFAULT_PROMPTS = {
    "generic": ["Write a short story about a robot learning to paint.",
                "Explain how a hash table works."],
}


def load_prompt_sets(model, path: str | None) -> dict[str, list[str]]:
    """Prompt sets by class: the JSON file ``path`` (see :func:`read_prompt_file`; any problem
    with it is an error, never a silent fallback), else the model folder's
    ``heldout_prompts.json`` (the demo model ships one), else generic prompts."""
    if path:
        return read_prompt_file(path)
    shipped = Path(model.info.path) / "heldout_prompts.json"
    return read_prompt_file(shipped) if shipped.is_file() else DEFAULT_PROMPTS


def read_prompt_file(path: str | Path) -> dict[str, list[str]]:
    """A ``--prompts`` file: a JSON list of prompt strings, or an object of class name ->
    non-empty list of prompt strings. Raises ``ValueError`` naming the file and what is wrong
    (missing, not a regular file, not UTF-8 JSON, the wrong shape); a FIFO or device is
    refused before it is opened, so it cannot block."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ValueError(f"--prompts {p}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ValueError(f"--prompts {p}: {kind}; give a JSON file of prompts")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--prompts {p}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--prompts {p}: not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--prompts {p}: not valid JSON ({exc.msg} at line {exc.lineno} "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise ValueError(f"--prompts {p}: JSON nested too deeply") from None
    shape = "expected a list of prompts or an object of class -> list of prompts"
    listed = isinstance(data, list)
    if listed:
        data = {"prompts": data}
    elif not isinstance(data, dict):
        raise ValueError(f"--prompts {p}: {shape}, not {_json_kind(data)}")
    if not data:
        raise ValueError(f"--prompts {p}: no prompt classes ({shape})")
    out: dict[str, list[str]] = {}
    for cls, prompts in data.items():
        where = "the list" if listed else f"class {cls!r}"
        if not isinstance(prompts, list):
            raise ValueError(  # noqa: TRY004 - the CLI's usage error (exit 2) for bad input
                f"--prompts {p}: {where} is {_json_kind(prompts)}, not a list of prompts")
        if not prompts:
            raise ValueError(f"--prompts {p}: {where} has no prompts")
        bad = next((i for i, x in enumerate(prompts)
                    if not isinstance(x, str) or not x.strip()), None)
        if bad is not None:
            raise ValueError(f"--prompts {p}: prompt {bad + 1} of {where} is "
                             f"{_json_kind(prompts[bad])}, not a non-empty string")
        out[str(cls)] = prompts
    return out


def _json_kind(value) -> str:
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return "an empty object" if not value else "an object"


def mixed_prompt_sets(model, path: str | None, *, per_class: int = 6) -> dict[str, list[str]]:
    """In-domain (the model's held-out prompts) and out-of-domain prompts, each as a class,
    plus a "mixed" class alternating them (the workload where an adaptive depth should win)."""
    from engine.resources import resources_dir

    inside = next(iter(load_prompt_sets(model, path).values()))[:per_class]
    extra = json.loads((resources_dir() / "bench_prompts.json").read_text(encoding="utf-8"))
    outside = extra["out-of-domain"][:per_class]
    mixed = [p for pair in zip(inside, outside) for p in pair]
    return {"in-domain": inside, "out-of-domain": outside, "mixed": mixed}


@dataclass
class Cell:
    tps: list[float] = field(default_factory=list)
    summaries: list[ReplyTally] = field(default_factory=list)
    peak_bytes: int = 0
    tokens: dict[int, list[int]] = field(default_factory=dict)  # prompt -> its first run's ids


VLM_PREFIX = "vlm_d"  # mlx-vlm's MTP at N drafts a round (draft_block_size N + 1): "vlm_d3"


class MlxVlmPeer:
    """mlx-vlm's own decoding on the same weights: its ``load`` of the model folder, and the
    ``qwen3_5_mtp`` drafter its ``split_mtp`` makes from the folder's ``mtp.*`` tensors,
    decoded by its ``generate_step`` (``draft_kind="mtp"``, ``prefill_step_size=None``: its
    default chunked prefill primes the drafter from the last prompt token only). Its layers
    get the engine's weight products (``cpu_products.adopt``), as mlx-lm's row does by running
    on the engine's own modules: the table compares decoders, not BLAS calls. ``make``
    returns None, with the reason, where mlx-vlm is not installed or cannot read the model."""

    def __init__(self, model, draft, kind: str | None) -> None:
        self.model, self.draft, self.kind = model, draft, kind

    @classmethod
    def make(cls, path: str, *, want_mtp: bool) -> tuple["MlxVlmPeer | None", str]:
        try:
            import mlx_vlm  # noqa: F401
        except ImportError:
            return None, "mlx-vlm is not installed (pip install mlx-vlm)"
        import logging
        import tempfile

        from mlx_vlm.utils import load

        logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))
        try:
            model, _processor = load(path)
            draft = kind = None
            if want_mtp:
                from mlx_vlm.speculative.drafters import load_drafter
                from mlx_vlm.split_mtp import split_mtp

                with tempfile.TemporaryDirectory(prefix="mtpchat-vlm-drafter-") as tmp:
                    split_mtp(path, tmp)
                    draft, kind = load_drafter(tmp, kind="mtp")
                    mx.eval(draft.parameters())  # read before the folder goes
        except Exception as e:  # noqa: BLE001 - reported, the rest of the bench runs
            return None, f"mlx-vlm could not load {path}: {type(e).__name__}: {e}"
        from engine.models import cpu_products

        for part in (model, draft):  # the products every row of the table runs
            if part is not None:
                cpu_products.adopt(part)
        return cls(model, draft, kind), ""

    def run(self, ids: list[int], max_tokens: int, params: SamplingParams, eos: set[int],
            drafts: int, seed: int) -> tuple[float, list[int]]:
        from mlx_vlm.generate.ar import generate_step

        kw = {}
        if drafts:
            kw = dict(draft_model=self.draft, draft_kind=self.kind,
                      draft_block_size=drafts + 1, prefill_step_size=None)
        mx.random.seed(seed)
        toks, t_first = [], None
        for tok, _ in generate_step(mx.array([ids]), self.model, None, None,
                                    max_tokens=max_tokens, temperature=params.temperature,
                                    top_p=params.top_p, top_k=params.top_k, seed=seed, **kw):
            if t_first is None:
                t_first = time.perf_counter()
            toks.append(int(tok.item() if hasattr(tok, "item") else tok))
            if toks[-1] in eos:
                break
        dt = time.perf_counter() - t_first
        return ((len(toks) - 1) / dt if dt > 0 and len(toks) > 1 else 0.0), toks


def _mlx_lm_run(model, ids: list[int], max_tokens: int, params: SamplingParams) -> tuple[float, list[int]]:
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=params.temperature, top_p=params.top_p, top_k=params.top_k,
                           min_p=params.min_p)
    toks, t_first = [], None
    eos = set(model.info.eos_token_ids)
    for r in stream_generate(model.trunk, model.tokenizer, mx.array(ids), max_tokens=max_tokens,
                             sampler=sampler):
        if t_first is None:
            t_first = time.perf_counter()
        toks.append(r.token)
        if r.token in eos:
            break
    dt = time.perf_counter() - t_first
    return ((len(toks) - 1) / dt if dt > 0 and len(toks) > 1 else 0.0), toks


def _engine_run(model, ids, depth, max_tokens, params, seed, drafter=None, profile=False,
                draft_mode="filtered") -> ReplyTally:
    s = ReplyTally()
    for ev in model.generate(ids, max_tokens=max_tokens, depth=depth, sampling=params,
                             seed=seed, drafter=drafter, profile=profile, draft_mode=draft_mode):
        s.add(ev)
    return s


def run_bench(model, *, prompts: dict[str, list[str]], depths: list, max_tokens: int,
              params: SamplingParams, repeats: int, chat: bool = True, replay: bool = False,
              profile: bool = False, include_mlx_lm: bool = True, seed: int = 0,
              draft_mode: DraftMode = "filtered", progress=None,
              vlm: MlxVlmPeer | None = None, vlm_drafts: tuple[int, ...] = ()) -> dict:
    """Returns {"classes": {cls: {label: {...}}}, ...} with median tok/s. ``draft_mode`` is
    the MTP head's draft policy (``engine.decoding.drafters``); ``vlm`` adds mlx-vlm's plain
    decoding ("mlx_vlm") and its MTP at each of ``vlm_drafts`` drafts a round ("vlm_dN")."""
    carryover_of(model).disk_cache = None  # every run prefills (no disk prompt cache)
    encoded = {c: [model.chat_ids([{"role": "user", "content": p}]) if chat else
                   list(model.tokenizer.encode(p, add_special_tokens=False)) for p in ps]
               for c, ps in prompts.items()}
    labels = (["mlx_lm"] if include_mlx_lm else []) + [str(d) for d in depths]
    if vlm is not None:
        labels[1 if include_mlx_lm else 0:0] = (
            ["mlx_vlm"] + ([f"{VLM_PREFIX}{n}" for n in vlm_drafts] if vlm.draft else []))
    cells = {c: {lab: Cell() for lab in labels} for c in encoded}
    # warm-up (compiles kernels, fills allocator caches)
    first = next(iter(encoded.values()))[0]
    _engine_run(model, first, 0, 8, params, seed)
    if vlm is not None:
        for lab in labels:
            if lab == "mlx_vlm" or lab.startswith(VLM_PREFIX):
                vlm.run(first, 8, params, set(model.info.eos_token_ids), _vlm_drafts(lab), seed)
    run = dict(max_tokens=max_tokens, params=params, seed=seed, replay=replay, profile=profile,
               draft_mode=draft_mode, vlm=vlm)
    for rep in range(repeats):
        for cls, id_lists in encoded.items():
            totals = {lab: [0, 0.0] for lab in labels}
            for i, ids in enumerate(id_lists):  # every decoder on prompt i, back to back,
                turn = (rep + i) % len(labels)  # in a rotating order: the machine's drift
                for lab in labels[turn:] + labels[:turn]:  # falls on all of them alike
                    n, secs = _one(model, cells[cls][lab], lab, ids, i, **run)
                    totals[lab][0] += n
                    totals[lab][1] += secs
            for lab in labels:
                cell, (total_tok, total_s) = cells[cls][lab], totals[lab]
                cell.tps.append(total_tok / total_s if total_s else 0.0)
                if progress:
                    progress(f"repeat {rep + 1}/{repeats} {cls} {lab}: {cell.tps[-1]:.1f} tok/s")
    classes = {c: _report(cells[c], same_tokens=params.temperature == 0) for c in cells}
    return {"classes": classes, "params": params.__dict__,
            "auto_vs_best_fixed": {c: auto_vs_best_fixed(rows) for c, rows in classes.items()
                                   if "auto" in rows},
            "peers": {c: peer_ratios(rows) for c, rows in classes.items()},
            "max_tokens": max_tokens, "repeats": repeats, "replay": replay,
            "draft_mode": draft_mode}


def _vlm_drafts(lab: str) -> int:
    return int(lab[len(VLM_PREFIX):]) if lab.startswith(VLM_PREFIX) else 0


def _one(model, cell: Cell, lab: str, ids: list[int], i: int, *, max_tokens, params, seed,
         replay, profile, draft_mode, vlm=None) -> tuple[int, float]:
    """One prompt under one decoder: (decode tokens, decode seconds)."""
    carryover_of(model).reset_prompt_cache()
    mx.reset_peak_memory()
    if lab == "mlx_lm" or lab == "mlx_vlm" or lab.startswith(VLM_PREFIX):
        if lab == "mlx_lm":
            tps, toks = _mlx_lm_run(model, ids, max_tokens, params)
        else:
            tps, toks = vlm.run(ids, max_tokens, params, set(model.info.eos_token_ids),
                                _vlm_drafts(lab), seed + i)
        n, secs = len(toks) - 1, (len(toks) - 1) / tps if tps else 0.0
        cell.tokens.setdefault(i, toks)
    else:
        depth = lab if lab == "auto" else int(lab)
        drafter = None
        if replay and depth != 0:
            ref = _engine_run(model, ids, 0, max_tokens, params, seed + i)
            carryover_of(model).reset_prompt_cache()
            drafter = ReplayDrafter(ref.token_ids)
        t = _engine_run(model, ids, depth, max_tokens, params, seed + i, drafter, profile,
                        draft_mode)
        cell.summaries.append(t)
        cell.tokens.setdefault(i, list(t.token_ids))
        s = t.summary()
        n, secs = s.decode_tokens, s.decode_s
    cell.peak_bytes = max(cell.peak_bytes, mx.get_peak_memory())
    return n, secs


def best_fixed(rows: dict[str, dict]) -> str | None:
    """The label of the fastest fixed depth (median tok/s) among a class's rows."""
    fixed = [lab for lab in rows if lab.isdigit() and rows[lab]["tok_s"] > 0]
    return max(fixed, key=lambda lab: rows[lab]["tok_s"], default=None)


def auto_vs_best_fixed(rows: dict[str, dict]) -> dict:
    """``auto`` against the fastest fixed depth of the class: the ratio of their medians, and
    repeat by repeat (within a repeat every decoder runs each prompt back to back, so the
    paired ratios see less of the machine's drift)."""
    best = best_fixed(rows)
    if best is None or "auto" not in rows:
        return {"best_depth": None, "ratio": None, "ratio_by_repeat": []}
    auto, ref = rows["auto"], rows[best]
    return {"best_depth": int(best), "ratio": round(auto["tok_s"] / ref["tok_s"], 3),
            "ratio_by_repeat": [round(a / b, 3) for a, b in zip(auto["tok_s_all"], ref["tok_s_all"])
                                if b > 0]}


def _report(cells: dict[str, Cell], *, same_tokens: bool = False) -> dict:
    """Each decoder's row; with ``same_tokens`` (greedy) also ``same_tokens_as_depth0``:
    [prompts whose ids equal depth 0's, prompts compared] (a reply may differ at a float
    near-tie between two libraries' kernels; within this engine every depth must match)."""
    base = statistics.median(cells["0"].tps) if "0" in cells and cells["0"].tps else None
    ref = cells["0"].tokens if "0" in cells else {}
    out = {}
    for lab, cell in cells.items():
        med = statistics.median(cell.tps) if cell.tps else 0.0
        row = {"tok_s": round(med, 2), "tok_s_all": [round(x, 2) for x in cell.tps],
               "speedup_vs_depth0": round(med / base, 3) if base else None,
               "peak_memory_mib": round(cell.peak_bytes / 2**20, 2)}
        both = [i for i in cell.tokens if i in ref]
        if same_tokens and both and lab != "0":
            row["same_tokens_as_depth0"] = [sum(cell.tokens[i] == ref[i] for i in both),
                                            len(both)]
        if cell.summaries:
            row.update(_cycle_figures([c for t in cell.summaries for c in t.cycles]))
        out[lab] = row
    best = best_fixed(out)
    for row in out.values():  # every decoder against the class's fastest fixed depth
        row["vs_best_fixed"] = round(row["tok_s"] / out[best]["tok_s"], 3) if best else None
    return out


def peer_ratios(rows: dict[str, dict]) -> dict:
    """This engine's fastest fixed depth against each peer: mlx-lm, mlx-vlm's plain decoding
    and mlx-vlm's fastest MTP setting (each by median tok/s); depth 0 against the plain peers."""
    best = best_fixed(rows)
    vlm = [lab for lab in rows if lab.startswith(VLM_PREFIX) and rows[lab]["tok_s"] > 0]
    vlm_best = max(vlm, key=lambda lab: rows[lab]["tok_s"], default=None)
    out = {"best_depth": int(best) if best else None, "vlm_best": vlm_best}

    def ratio(a, b):
        return round(rows[a]["tok_s"] / rows[b]["tok_s"], 3) if (
            a in rows and b in rows and rows[b]["tok_s"] > 0) else None

    out["best_vs_mlx_lm"] = ratio(best, "mlx_lm") if best else None
    out["best_vs_mlx_vlm_mtp"] = ratio(best, vlm_best) if best and vlm_best else None
    out["depth0_vs_mlx_lm"] = ratio("0", "mlx_lm")
    out["depth0_vs_mlx_vlm"] = ratio("0", "mlx_vlm")
    return out


def _cycle_figures(cycles: list) -> dict:
    """Acceptance (both kinds), tokens per cycle, syncs, time shares and mean depth."""
    s = summarize_cycles(cycles)
    out = {"acceptance_rate_by_position": round_rates(p.rate for p in s.positions),
           "conditional_acceptance_by_position": round_rates(p.conditional for p in s.positions),
           "tokens_per_cycle": round(s.tokens_per_cycle, 4),
           "host_syncs_per_cycle": s.host_syncs_per_cycle,
           "mean_depth": round(sum(c.depth for c in cycles) / len(cycles), 3) if cycles else 0}
    spec = [c for c in cycles if c.depth > 0]
    if spec:
        tot = sum(c.t_total for c in spec) or 1.0
        out["time_share"] = {
            phase: round(sum(getattr(c, f"t_{phase}") for c in spec) / tot, 4)
            for phase in ("draft", "verify", "accept", "commit", "sync")}
    return out


def sampling_cost(*, vocab: int = 248_320, rows: int = 4, params: SamplingParams,
                  repeats: int = 20, seed: int = 0) -> dict:
    """Milliseconds per verified row to build the target distribution and draw from it, on
    random logits of ``vocab`` tokens: the dense path (``sampling.build_probs`` + ``sample``,
    what every row cost before ``engine.sampling.candidates``) against the compact one, median of
    ``repeats``, both in this process."""
    from engine.sampling import candidates, exact as sampling

    logits = mx.random.normal((rows, vocab), key=mx.random.key(seed)) * 3
    key = mx.random.key(seed + 1)
    paths = {"dense": lambda: sampling.sample(sampling.build_probs(logits, params), key)}
    if candidates.applies(params, vocab):
        paths["compact"] = lambda: candidates.sample(candidates.build(logits, params), key)
    out = {}
    for name, fn in paths.items():
        mx.eval(fn())
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mx.eval(fn())
            times.append(time.perf_counter() - t0)
        out[name] = round(1000 * statistics.median(times) / rows, 3)
    return {"vocab": vocab, "rows": rows, "params": params.__dict__, "ms_per_row": out}
