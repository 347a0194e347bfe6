"""Recorded workloads for ``engine.bench.adaptive_sim``: what real replies did, cycle by cycle.

The simulator's synthetic replies draw each cycle's acceptance afresh from one table per
reply. Real replies are not like that: on the demo model an out-of-domain reply's second and
third cycles accept about 1 and 1.8 drafts of 4, its later ones about 3.3, so a controller
that judges the reply by its first cycles runs too shallow for the rest. ``record`` decodes
prompt classes at the deepest depth and keeps, per reply, the drafts each cycle accepted and
the reply's length, plus each depth's median cycle time relative to depth 0's (from runs at
every fixed depth); ``workloads`` turns a saved recording into ``Workload``s whose replies
replay those cycles (``Reply.trace``). ``resources/adaptive/demo_traces.json`` holds the demo
model's, at temperature 0 and 0.7 / top-p 0.95 (``record_file`` wrote it).
"""
from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from engine.bench.adaptive_sim import Workload
from engine.core.carryover import carryover_of
from engine.resources import resources_dir

log = logging.getLogger(__name__)


def default_path() -> Path:
    return resources_dir() / "adaptive" / "demo_traces.json"


def record(model, prompts: dict[str, list[str]], sampling, *, depth: int = 4,
           seeds: int = 2, max_tokens: int = 96) -> dict:
    """Decode every prompt of every class ``seeds`` times (once when greedy) at each fixed
    depth 0..``depth``;
    returns {"classes": {class: [[accepted per cycle at ``depth``], reply tokens]...},
    "cost": [median cycle seconds at d / at depth 0 for d in 0..depth]}."""
    classes, times = {}, {d: [] for d in range(depth + 1)}
    seeds = 1 if sampling.greedy else seeds  # greedy replies do not depend on the seed
    for cls, texts in prompts.items():
        ids = [model.chat_ids([{"role": "user", "content": t}]) for t in texts]
        classes[cls] = []
        for seed in range(seeds):
            for i, prompt in enumerate(ids):
                for d in range(depth + 1):
                    carryover_of(model).reset_prompt_cache()
                    cycles, tokens = [], 0
                    for ev in model.generate(prompt, max_tokens=max_tokens, depth=d,
                                             sampling=sampling, seed=100 * seed + i):
                        tokens += len(ev.token_ids)
                        if ev.stats is not None and len(ev.stats.drafted) == d:
                            cycles.append(ev.stats.accepted)
                            times[d].append(ev.stats.t_total)
                    if d == depth and cycles:
                        classes[cls].append([cycles, tokens])
    base = statistics.median(times[0])
    return {"classes": classes,
            "cost": [round(statistics.median(times[d]) / base, 3) for d in range(depth + 1)]}


def conditional(traces: list) -> tuple[float, ...]:
    """Acceptance of draft position i given position i was reached, over ``traces``."""
    depth = max(max(c) for c, _ in traces)
    reached, accepted = [0] * depth, [0] * depth
    for cycles, _ in traces:
        for a in cycles:
            for i in range(min(a + 1, depth)):
                reached[i] += 1
                accepted[i] += i < a
    return tuple(round(accepted[i] / reached[i], 3) if reached[i] else 0.0
                 for i in range(depth))


def workloads(path: Path | None = None) -> list[Workload]:
    """The recorded workloads in ``path`` (the demo model's by default); none when the file
    is missing or unreadable (logged: the simulator runs its synthetic workloads alone)."""
    path = path or default_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        out = []
        for name, rec in data["workloads"].items():
            recorded = {cls: tuple((tuple(int(a) for a in c), int(n)) for c, n in traces)
                        for cls, traces in rec["classes"].items()}
            out.append(Workload(name, {c: conditional(t) for c, t in rec["classes"].items()},
                                cost=tuple(float(c) for c in rec["cost"]), recorded=recorded))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:
        log.warning("ignoring the recorded workloads in %s: %s", path, exc)
        return []


def record_file(path: Path, model, prompts: dict[str, list[str]]) -> None:
    """Record the demo workloads (temperature 0, and 0.7 with top-p 0.95) into ``path``."""
    from engine.types import SamplingParams

    runs = {"recorded-demo-T0": SamplingParams(temperature=0.0),
            "recorded-demo-T0.7": SamplingParams(temperature=0.7, top_p=0.95)}
    data = {"how": "engine.bench.adaptive_traces.record_file on bench's mixed prompt sets "
                   "(python -m engine.bench.adaptive_traces)",
            "workloads": {name: record(model, prompts, p) for name, p in runs.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


if __name__ == "__main__":  # re-record the demo model's workloads (a few minutes)
    import engine
    from engine.bench.side_by_side import mixed_prompt_sets

    m = engine.load(engine.default_model_path())
    carryover_of(m).disk_cache = None
    sets = mixed_prompt_sets(m, None)
    record_file(default_path(), m, {k: sets[k] for k in ("in-domain", "out-of-domain")})
    print(default_path())
