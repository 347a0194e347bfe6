"""``list``: the models in the store, the built-in demo, and models found elsewhere on disk."""
from __future__ import annotations

import json
import time

HELP = ("list installed models, incomplete downloads, the built-in demo model and models "
        "already on this machine (Hugging Face cache, LM Studio, MTPLX)")


def add_arguments(p) -> None:
    p.add_argument("--models-dir", default=None, help="store folder (default: the app's)")
    p.add_argument("--no-scan", action="store_true",
                   help="only the store: skip the Hugging Face cache, LM Studio and MTPLX")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _quant(q: dict | None) -> str:
    return f"{q.get('bits')}-bit" if q else "-"


def _line(r) -> str:
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_used)) if r.last_used else "-"
    mtp = "-" if r.has_mtp is None else ("yes" if r.has_mtp else "no")
    depth = "-" if r.tuned_depth is None else str(r.tuned_depth)
    return (f"{r.name[:40]:40} {r.status:11} {r.location_label[:18]:18} "
            f"{_size(r.size_bytes):>10} {r.family or '-':12} {_quant(r.quantization):6} "
            f"{mtp:4} {depth:5} {used}")


def run(args) -> int:
    from engine.hub.store import Store

    store = Store(args.models_dir)
    rows = store.list()
    if not args.no_scan:
        from engine.hub.local_models import external_rows

        rows += external_rows(store)
    from engine.hub.local_models import with_offers

    rows = with_offers(rows, store=store)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return 0
    print(f"{'NAME':40} {'STATUS':11} {'WHERE':18} {'SIZE':>10} {'FAMILY':12} {'QUANT':6} "
          f"{'MTP':4} {'DEPTH':5} LAST USED")
    for r in rows:
        print(_line(r))
        if r.external:
            print(f"  @ {r.path} (used in place; `rm` never deletes it)")
        if r.problem:
            print(f"  ! {r.problem}")
        if r.mtp_offer:
            print(f"  + {r.mtp_offer['line']}: python -m engine graft {r.name}")
    return 0
