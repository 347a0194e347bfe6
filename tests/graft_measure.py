"""Measure grafting on the fake Hub for docs/graft.md: full-repo download vs graft download,
acceptance, and the folders to bench (before: the headless conversion; after: the grafted one).

    PYTHONPATH=$PWD python -m tests.graft_measure OUT_DIR

Builds the raw sources (the demo, tiny random dense and MoE), their ``mlx_lm.convert`` 4-bit
conversions in a fake LM Studio folder, grafts each from the fake Hub (counting the bytes it
served) and prints one JSON line per model; the demo is also converted by this engine's
``convert --bits 4`` (head kept) for the acceptance it should match.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ["MTPCHAT_HOME"] = str(out / "home")
    os.environ["LMSTUDIO_MODELS_DIR"] = str(out / "lms")
    os.environ["HF_HUB_CACHE"] = str(out / "hf")
    os.environ["MTPLX_MODEL_DIR"] = str(out / "mtplx")
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = False
    from tests.fakehub import FakeHub
    from tests.graftrepos import (CARD, DEMO_REPO, DENSE_REPO, MOE_REPO, conversion, fake_repos,
                                  raw_sources)

    srcs = raw_sources(out / "src")
    repos = fake_repos(srcs)
    names = {DEMO_REPO: "mtp-demo", DENSE_REPO: "tiny-dense", MOE_REPO: "tiny-moe"}
    with FakeHub(repos) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        from engine.hub.graft import graft
        from engine.hub.graft_head import measure_acceptance
        from engine.hub.store import Store

        todo = [(repo, short, 4) for repo, short in names.items()] + [(DEMO_REPO, "mtp-demo",
                                                                          None)]
        for repo, short, bits in todo:
            tag = f"{bits}bit" if bits else "float"
            conv = conversion(srcs[repo], out / "lms" / "mlx-community" / f"{short}-{tag}",
                              bits=bits)
            (conv / "README.md").write_text(CARD.format(repo=repo))
            hub.reset_counts()
            res = graft(conv, store=Store(out / "store"),
                        min_acceptance=0.1 if repo == DEMO_REPO else 0.0)
            full = sum(len(b) for b in repos[repo].files.values())
            row = {"model": f"{short}-{tag}", "source": repo, "full_repo_bytes": full,
                   "graft_bytes": sum(hub.served_for(repo).values()),
                   "head_bytes": res.head_bytes, "acceptance": res.acceptance,
                   "conversion": str(conv), "grafted": res.path}
            if repo == DEMO_REPO and bits:
                from engine.models.convert import convert

                own = out / "own-demo-4bit"
                if not own.exists():
                    convert(srcs[repo], own, bits=4)
                row["engine_convert_acceptance"] = round(measure_acceptance(own)[0], 4)
            print(json.dumps(row), flush=True)




def paired_speed(plain: Path, grafted: Path, *, depths=(1, 2, 3), rounds: int = 9,
                 max_tokens: int = 64) -> dict:
    """Decode tok/s of the headless conversion (depth 0) and the grafted model (depth 0 and
    each depth), loaded in one process and measured round by round in a rotating order, so
    the load of a shared machine hits every cell alike; medians and per-round ratios."""
    import statistics

    import engine
    from engine.hub.graft_head import CALIBRATION
    from engine.types import SamplingParams

    models = {"plain": engine.load(plain), "grafted": engine.load(grafted)}
    cells = [("plain", 0), ("grafted", 0)] + [("grafted", d) for d in depths]
    prompts = {k: [m.chat_ids([{"role": "user", "content": p}], enable_thinking=False)
                   for p in CALIBRATION] for k, m in models.items()}

    def run(name: str, depth: int) -> float:
        m, n, t = models[name], 0, 0.0
        for ids in prompts[name]:
            t0 = None
            for e in m.generate(ids, max_tokens=max_tokens, depth=depth,
                                sampling=SamplingParams(temperature=0.0)):
                if t0 is None:
                    t0 = time.perf_counter()  # from the first token: decode only
                    continue
                n += len(e.token_ids)
            t += time.perf_counter() - t0
        return n / t

    for c in cells:  # warm up
        run(*c)
    speeds: dict = {c: [] for c in cells}
    for r in range(rounds):
        order = cells[r % len(cells):] + cells[:r % len(cells)]
        for c in order:
            speeds[c].append(run(*c))
    ratio = {f"{n}@{d}": statistics.median(s / p for s, p in zip(speeds[(n, d)],
                                                                 speeds[("plain", 0)]))
             for n, d in cells}
    return {"tok_s": {f"{n}@{d}": round(statistics.median(v), 1) for (n, d), v in speeds.items()},
            "vs_plain": {k: round(v, 3) for k, v in ratio.items()}, "rounds": rounds}


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--speed":  # --speed PLAIN GRAFTED
        print(json.dumps(paired_speed(Path(sys.argv[2]), Path(sys.argv[3]))), flush=True)
    else:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/graft-measure"))
