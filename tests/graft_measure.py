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


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/graft-measure"))
