"""``list``: the models in the store (installed, incomplete, corrupt) and the built-in demo."""
from __future__ import annotations

import json
import time

HELP = "list installed models, incomplete downloads and the built-in demo model"


def add_arguments(p) -> None:
    p.add_argument("--models-dir", default=None, help="store folder (default: the app's)")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _quant(q: dict | None) -> str:
    return f"{q.get('bits')}-bit" if q else "-"


def run(args) -> int:
    from engine.store import Store

    rows = Store(args.models_dir).list()
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return 0
    print(f"{'NAME':40} {'STATUS':11} {'SIZE':>10} {'FAMILY':12} {'QUANT':6} {'MTP':4} "
          f"{'DEPTH':5} LAST USED")
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_used)) if r.last_used else "-"
        mtp = "-" if r.has_mtp is None else ("yes" if r.has_mtp else "no")
        depth = "-" if r.tuned_depth is None else str(r.tuned_depth)
        print(f"{r.name[:40]:40} {r.status:11} {_size(r.size_bytes):>10} {r.family or '-':12} "
              f"{_quant(r.quantization):6} {mtp:4} {depth:5} {used}")
        if r.problem:
            print(f"  ! {r.problem}")
    return 0
