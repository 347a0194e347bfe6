"""Paired A/B decode benchmark of one git revision against the working tree, in ONE process.

``python -m engine.bench.ab --before REV [--model PATH] [--replies N] [--max-tokens N]
[--dtype float32] [--streams 8]``

1. ``git archive REV engine`` goes to a temp folder as the package ``engine_before``, every
   reference to ``engine`` in it rewritten (``from engine...``, ``import engine...``, dotted
   module strings such as ``"engine.server.guard"``), so both versions import side by side
   without sharing a module object (checked statically on the copy and again, at run time, by
   walking ``sys.modules``). Both use the installed mlx and mlx-lm.
2. The same weights are loaded once per side (float32 by default: greedy tokens must match).
3. Three paired measurements on the model's held-out prompts (``engine.bench.side_by_side``'s source):
   depth 0 and depth 3 single-stream (tok/s from the first event to the last), and
   ``--streams`` streams at depth 3 decoded together (aggregate tok/s: every stream's tokens
   over the wall time from the decoder's creation to its last event, prefill included). Each
   pair runs before/after back to back, the order flipped every other pair; every
   configuration is warmed up on both sides first.
4. Every pair's token ids must be identical (exit 1 and the first differing position if not).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "engine_before"
DEFAULT_BLAS_THREADS = "1"  # README: faster on a 2-core machine with the demo model


class AbError(Exception):
    """A setup problem (bad revision, a leak between the two packages, a missing API)."""


# -- 1. the revision as its own package ---------------------------------------------------------
_FROM = re.compile(r"^(\s*from\s+)engine(?=[\s.])", re.MULTILINE)
_IMPORT = re.compile(r"^(\s*import\s+)engine((?:\.\w+)*)(\s+as\s+\w+)?(?=[\s,;]|$)", re.MULTILINE)
_STRING = re.compile(r"""(?<=["'])engine(?=\.[A-Za-z_])""")
_DOTTED = re.compile(r"engine(\.\w+)+")


def rewrite(source: str, name: str = BEFORE) -> str:
    """``source`` with its references to the ``engine`` package pointed at ``name``.
    ``import engine`` keeps the local name ``engine`` (bound to ``name``)."""
    def plain_import(m: re.Match) -> str:
        prefix, dotted, alias = m.group(1), m.group(2), m.group(3)
        if alias:
            return f"{prefix}{name}{dotted}{alias}"
        if not dotted:
            return f"{prefix}{name} as engine"
        return f"{prefix}{name}{dotted}; import {name} as engine"

    source = _FROM.sub(lambda m: m.group(1) + name, source)
    source = _IMPORT.sub(plain_import, source)
    return _STRING.sub(name, source)


def engine_references(pkg: Path) -> list[str]:
    """``path:line what`` for each import of ``engine``/``engine.*`` (absolute) and each string
    that is a dotted ``engine.x`` module path left in the package folder ``pkg``."""
    found = []
    for py in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(py.read_text("utf-8"), str(py))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and _DOTTED.fullmatch(node.value):
                names = [node.value]
            found += [f"{py.relative_to(pkg.parent)}:{node.lineno} {n}" for n in names
                      if n == "engine" or n.startswith("engine.")]
    return found


def materialise(rev: str, dest: Path, *, repo: Path = ROOT, name: str = BEFORE) -> Path:
    """``git archive rev engine`` into ``dest`` as the package ``dest/name``, rewritten
    (:func:`rewrite`) and checked (:func:`engine_references`); ``dest/resources`` links to the
    checkout's ``resources/`` (demo model, prompts). Returns the package folder."""
    got = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "engine"],
                         capture_output=True, check=False)
    if got.returncode:
        raise AbError(f"git archive {rev} engine failed: "
                      f"{got.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(got.stdout)) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    pkg = dest / name
    (dest / "engine").rename(pkg)
    for py in pkg.rglob("*.py"):
        text = py.read_text("utf-8")
        if (new := rewrite(text, name)) != text:
            py.write_text(new, "utf-8")
    left = engine_references(pkg)
    if left:
        raise AbError("the copy still refers to the engine package:\n  " + "\n  ".join(left))
    if (repo / "resources").is_dir() and not (dest / "resources").exists():
        (dest / "resources").symlink_to(repo / "resources", target_is_directory=True)
    return pkg


def import_before(dest: Path, name: str = BEFORE) -> types.ModuleType:
    """Import the materialised package from ``dest`` (put first on ``sys.path``)."""
    if name in sys.modules:
        raise AbError(f"{name} is already imported")
    sys.path.insert(0, str(dest))
    importlib.invalidate_caches()
    mod = importlib.import_module(name)
    if not _inside(mod.__file__, dest):
        raise AbError(f"{name} was imported from {mod.__file__}, not from {dest}")
    return mod


def _inside(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


def _owner(value) -> str | None:
    try:
        return value.__name__ if isinstance(value, types.ModuleType) else \
            getattr(value, "__module__", None)
    except Exception:  # noqa: BLE001 - an exotic object: not ours either way
        return None


def isolation_problems(dest: Path, name: str = BEFORE) -> list[str]:
    """What ``sys.modules`` shows leaking between ``engine`` and ``name``: a ``name`` module
    from outside ``dest`` or holding an ``engine.*`` module, class or function; an ``engine``
    module loaded from ``dest``."""
    out = []
    for mname, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if mname == name or mname.startswith(name + "."):
            if path and not _inside(path, dest):
                out.append(f"{mname} was loaded from {path}, outside {dest}")
            for attr, value in list(vars(mod).items()):
                owner = _owner(value)
                if isinstance(owner, str) and (owner == "engine" or owner.startswith("engine.")):
                    out.append(f"{mname}.{attr} comes from {owner}")
        elif (mname == "engine" or mname.startswith("engine.")) and _inside(path, dest):
            out.append(f"{mname} was loaded from the temp copy ({path})")
    return out


# -- 2./3. the two sides and one measurement --------------------------------------------------
@dataclass
class Side:
    name: str                     # "before" or "after"
    mod: types.ModuleType         # engine_before or engine
    model: object
    streams: Callable             # (side, prompts, max_tokens, depth) -> list[list[int]]

    def greedy(self):
        return self.mod.SamplingParams(temperature=0.0)

    def fresh(self) -> str:
        """Every reply prefills: no prompt cache in memory or on disk, on the model (before
        the decoder rewrite) or on its carryover (``engine.core.carryover``, after it).
        Returns how (or that nothing was found to reset)."""
        model, how = self.model, []
        if hasattr(model, "disk_cache"):
            model.disk_cache = None
        if hasattr(model, "reset_prompt_cache"):
            model.reset_prompt_cache()
            how.append("Model.reset_prompt_cache()")
        try:
            carry = importlib.import_module(f"{self.mod.__name__}.core.carryover")
        except ModuleNotFoundError:
            return " + ".join(how) or "NOTHING (no prompt cache reset found)"
        carryover = carry.carryover_of(model)
        carryover.disk_cache = None
        carryover.reset_prompt_cache()
        return " + ".join(how + ["core.carryover.carryover_of(model).reset_prompt_cache()"])


def _drain(dec, side: Side, prompts, max_tokens: int, depth) -> list[list[int]]:
    """``dec.add`` each prompt (greedy, stream i seeded i), ``dec.run()`` to the end: each
    stream's tokens, in the order added."""
    handles = [dec.add(p, max_tokens=max_tokens, depth=depth, sampling=side.greedy(), seed=i)
               for i, p in enumerate(prompts)]
    out: dict[str, list[int]] = {h.id: [] for h in handles}
    for st, ev in dec.run():
        out[st.id].extend(ev.token_ids)
    return [out[h.id] for h in handles]


def before_streams(side: Side, prompts, max_tokens: int, depth) -> list[list[int]]:
    """REV's batch API: ``engine_before.batching.BatchDecoder`` (before the decoder rewrite),
    else ``model.decoder(max_streams=)``."""
    name = f"{side.mod.__name__}.batching"
    try:
        dec = importlib.import_module(name).BatchDecoder(side.model, max_streams=len(prompts))
    except ModuleNotFoundError as exc:
        if exc.name != name or not callable(getattr(side.model, "decoder", None)):
            raise AbError(f"REV has neither {name}.BatchDecoder nor Model.decoder("
                          "max_streams=); adjust before_streams() in engine/bench/ab.py") \
                from exc
        dec = side.model.decoder(max_streams=len(prompts))
    return _drain(dec, side, prompts, max_tokens, depth)


def after_streams(side: Side, prompts, max_tokens: int, depth) -> list[list[int]]:
    """The working tree's batch API (being redesigned: adjust here): ``model.decoder(
    max_streams=)`` if the model has it, else ``engine.decoding.decoder.BatchDecoder``; both used as
    ``add(...)`` then ``run()`` yielding ``(stream, event)``."""
    model = side.model
    if callable(getattr(model, "decoder", None)):
        dec = model.decoder(max_streams=len(prompts))
    else:
        try:
            from engine.decoding.decoder import BatchDecoder
        except ImportError as exc:
            raise AbError("the working tree has neither Model.decoder(max_streams=) nor "
                          f"engine.decoding.decoder.BatchDecoder ({exc}); adjust after_streams() in "
                          "engine/bench/ab.py") from exc
        dec = BatchDecoder(model, max_streams=len(prompts))
    return _drain(dec, side, prompts, max_tokens, depth)


def single(side: Side, ids: list[int], max_tokens: int, depth) -> tuple[list[list[int]], float]:
    """One reply: (its tokens as one stream, tok/s from the first event — prefill done — to
    the last, the first event's tokens not counted)."""
    side.fresh()
    toks: list[int] = []
    t0 = t1 = None
    n0 = 0
    for ev in side.model.generate(ids, max_tokens=max_tokens, depth=depth,
                                  sampling=side.greedy(), seed=0):
        t1 = time.perf_counter()
        if t0 is None:
            t0, n0 = t1, len(ev.token_ids)
        toks.extend(ev.token_ids)
    dt = (t1 - t0) if t0 is not None else 0.0
    return [toks], ((len(toks) - n0) / dt if dt > 0 else 0.0)


def batched(side: Side, prompts: list[list[int]], max_tokens: int, depth
            ) -> tuple[list[list[int]], float]:
    """The streams decoded together: (each stream's tokens, all tokens / wall seconds from
    the decoder's creation to its last event, prefill included)."""
    side.fresh()
    t0 = time.perf_counter()
    toks = side.streams(side, prompts, max_tokens, depth)
    dt = time.perf_counter() - t0
    return toks, (sum(map(len, toks)) / dt if dt > 0 else 0.0)


# -- 3./4. paired runs ---------------------------------------------------------------------------
@dataclass
class Config:
    label: str
    run: Callable                 # (side, pair index) -> (token lists, tok/s)
    ratios: list[float] = field(default_factory=list)
    tps: dict[str, list[float]] = field(default_factory=lambda: {"before": [], "after": []})


def first_difference(a: list[list[int]], b: list[list[int]]) -> str | None:
    """Where the before (``a``) and after (``b``) token lists first differ, or None."""
    if len(a) != len(b):
        return f"{len(a)} streams before, {len(b)} after"
    for s, (x, y) in enumerate(zip(a, b)):
        if x != y:
            i = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            return (f"stream {s}: first difference at token {i} (before {x[i:i + 4]}, after "
                    f"{y[i:i + 4]}; {len(x)} vs {len(y)} tokens; preceded by "
                    f"{x[max(0, i - 4):i]})")
    return None


def run_pair(cfg: Config, sides: list[Side], i: int) -> None:
    """Pair ``i`` of ``cfg``: both sides back to back (order flipped on odd pairs); raises
    ``AssertionError`` on differing tokens."""
    got = {}
    for side in (sides if i % 2 == 0 else sides[::-1]):
        got[side.name] = cfg.run(side, i)
    (tb, rb), (ta, ra) = got["before"], got["after"]
    diff = first_difference(tb, ta)
    if diff:
        raise AssertionError(f"{cfg.label} pair {i + 1}: tokens differ, {diff}")
    cfg.tps["before"].append(rb)
    cfg.tps["after"].append(ra)
    cfg.ratios.append(ra / rb if rb else float("nan"))
    first = "before" if i % 2 == 0 else "after"
    print(f"  {cfg.label} pair {i + 1} ({first} first): before {rb:7.1f} tok/s, after "
          f"{ra:7.1f} tok/s, after/before {cfg.ratios[-1]:.3f}, "
          f"{sum(map(len, ta))} tokens identical", flush=True)


def make_configs(prompts: list[list[int]], args) -> list[Config]:
    m, n, k = args.max_tokens, len(prompts), args.streams

    def one(depth):
        return lambda side, i: single(side, prompts[i % (n - 1)], m, depth)

    def many(side, i):
        return batched(side, [prompts[(i * k + j) % (n - k)] for j in range(k)], m, 3)

    return [Config("d0 single", one(0)), Config("d3 single", one(3)),
            Config(f"d3 x{k} streams", many)]


def warm_up(sides: list[Side], prompts: list[list[int]], args) -> None:
    """One untimed reply per configuration per side (prompts the pairs do not use), tokens
    compared too."""
    m, k = args.max_tokens, args.streams
    for label, fn in (("d0 single", lambda s: single(s, prompts[-1], m, 0)),
                      ("d3 single", lambda s: single(s, prompts[-1], m, 3)),
                      (f"d3 x{k} streams", lambda s: batched(s, prompts[-k:], m, 3))):
        toks = [fn(side)[0] for side in sides]
        if diff := first_difference(toks[0], toks[1]):
            raise AssertionError(f"{label} warm-up: tokens differ, {diff}")
    print(f"warmed up both sides ({m} tokens per configuration)", flush=True)


def summarise(configs: list[Config]) -> None:
    print()
    for c in configs:
        r = c.ratios
        print(f"{c.label}: after/before per pair " + " ".join(f"{x:.3f}" for x in r))
        print(f"  median {statistics.median(r):.3f}x  min {min(r):.3f}x  max {max(r):.3f}x; "
              f"median tok/s before {statistics.median(c.tps['before']):.1f}, "
              f"after {statistics.median(c.tps['after']):.1f}")
    for c in configs:
        print(f"{c.label}: after/before = {statistics.median(c.ratios):.2f}x "
              f"(median of {len(c.ratios)} pairs)")


# -- the command -----------------------------------------------------------------------------
def set_blas_threads() -> str:
    """``OPENBLAS_NUM_THREADS`` as the README advises for the demo model on a small machine
    (1 unless already set). OpenBLAS was loaded when ``engine`` was imported, so the count is
    also applied through ``openblas_set_num_threads``. Returns what is in effect."""
    import ctypes

    from engine._blas import blas_info

    n = os.environ.setdefault("OPENBLAS_NUM_THREADS", DEFAULT_BLAS_THREADS)
    info = blas_info()
    if info.get("blas") != "openblas" or not info.get("path"):
        return f"{n} (BLAS: {info.get('blas')})"
    lib = ctypes.CDLL(info["path"], mode=ctypes.RTLD_GLOBAL)
    try:
        lib.openblas_set_num_threads(int(n))
        return f"{lib.openblas_get_num_threads()} (OpenBLAS {info['path']})"
    except (AttributeError, ValueError):
        return f"{n} (env only)"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.bench.ab", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="HEAD", help="git revision to compare against")
    p.add_argument("--model", default=None, help="model folder (default: the demo model)")
    p.add_argument("--replies", type=int, default=6, help="pairs per configuration")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--streams", type=int, default=8, help="streams decoded together")
    args = p.parse_args(argv)
    if args.replies < 1 or args.max_tokens < 1 or args.streams < 1:
        p.error("--replies, --max-tokens and --streams must be >= 1")
    return args


def load_sides(before_mod, path: str, dtype: str) -> list[Side]:
    import engine

    sides = []
    for name, mod, streams in (("before", before_mod, before_streams),
                               ("after", engine, after_streams)):
        t0 = time.perf_counter()
        try:
            model = mod.load(path, dtype=dtype)
        except (ImportError, AttributeError) as exc:  # e.g. a tree mid-rewrite
            raise AbError(f"{mod.__name__}.load() failed on the {name} side: "
                          f"{type(exc).__name__}: {exc}") from exc
        sides.append(Side(name, mod, model, streams))
        print(f"loaded {name} ({mod.__name__}: {Path(mod.__file__).parents[1]}) in "
              f"{time.perf_counter() - t0:.1f} s; before each reply: {sides[-1].fresh()}",
              flush=True)
    return sides


def held_out(sides: list[Side], need: int) -> list[list[int]]:
    """The model's held-out prompts as ``bench`` picks them (``load_prompt_sets``, REV's copy:
    the working tree's may be mid-rewrite), rendered by the before side; the same ids go to
    both sides."""
    before, after = sides
    bench = importlib.import_module(f"{before.mod.__name__}.bench")
    if not hasattr(bench, "load_prompt_sets"):  # bench/ became a package (engine/bench/)
        bench = importlib.import_module(f"{before.mod.__name__}.bench.side_by_side")
    texts = [t for ts in bench.load_prompt_sets(before.model, None).values() for t in ts]
    texts = [texts[i % len(texts)] for i in range(max(need, len(texts)))]
    ids = [before.model.chat_ids([{"role": "user", "content": t}]) for t in texts]
    if ids[0] != after.model.chat_ids([{"role": "user", "content": texts[0]}]):
        print("note: the two sides render the chat template differently; both get the "
              "before side's ids", flush=True)
    print(f"prompts: {len(set(texts))} held-out prompts of {after.model.info.path}", flush=True)
    return ids


def check_isolation(dest: Path) -> None:
    leaks = isolation_problems(dest)
    if leaks:
        raise AbError("the two packages share modules:\n  " + "\n  ".join(leaks))
    n = sum(1 for m in list(sys.modules) if m == BEFORE or m.startswith(BEFORE + "."))
    print(f"isolation: {n} {BEFORE} modules, all from {dest}, none holding an engine.* "
          "module, class or function; no engine module from the copy", flush=True)


def measure(dest: Path, args) -> int:
    before_mod = import_before(dest)
    import engine

    path = args.model or str(engine.default_model_path())
    sides = load_sides(before_mod, path, args.dtype)
    check_isolation(dest)
    prompts = held_out(sides, args.replies * args.streams + args.streams + 2)
    try:
        warm_up(sides, prompts, args)
        configs = make_configs(prompts, args)
        for cfg in configs:
            for i in range(args.replies):
                run_pair(cfg, sides, i)
    except AssertionError as exc:
        print(f"MISMATCH: {exc}", file=sys.stderr, flush=True)
        return 1
    check_isolation(dest)
    summarise(configs)
    print("tokens: identical in every pair")
    return 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1/5/15 min, {os.cpu_count()} CPUs)"


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["MTPCHAT_PROMPT_DISK_CACHE"] = "0"  # every reply prefills; nothing written
    print(f"load average at start: {_load()}", flush=True)
    print(f"OPENBLAS_NUM_THREADS: {set_blas_threads()}", flush=True)
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                         capture_output=True, text=True, check=False).stdout.strip()
    print(f"before: {args.before} ({sha or '?'}); after: the working tree {ROOT}; "
          f"{args.replies} pairs x {args.max_tokens} tokens, {args.dtype}, greedy", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="ab-before-") as tmp:
            materialise(args.before, Path(tmp))
            print(f"materialised {args.before}:engine as {BEFORE} in {tmp}", flush=True)
            rc = measure(Path(tmp), args)
    except AbError as exc:
        print(f"error: {exc}", file=sys.stderr)
        rc = 2
    print(f"load average at end: {_load()}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
