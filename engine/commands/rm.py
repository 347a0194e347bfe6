"""``rm NAME``: delete an installed model or an incomplete download from the store."""
from __future__ import annotations

import json
import sys

HELP = "delete a model (or an incomplete download) from the store"


def add_arguments(p) -> None:
    p.add_argument("name", help="a name from `list`, its path, or the repo id it was pulled from")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--models-dir", default=None, help="store folder (default: the app's)")


def run(args) -> int:
    from engine.errors import StoreError
    from engine.hub.store import Store

    store = Store(args.models_dir)
    row = store.find(args.name)
    if row is None:
        from engine.hub.local_models import find_external, refuse_delete

        outside = find_external(args.name, store)
        if outside is not None:
            raise refuse_delete(outside)
        raise StoreError(f"no model named {args.name!r} (see `python -m engine list`)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise StoreError("refusing to delete without confirmation: pass --yes")
        answer = input(f"Delete {row.name} ({row.size_bytes / 1e9:.2f} GB at {row.path})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return 1
    store.delete(row.name)
    if args.json:
        print(json.dumps({"deleted": row.name, "path": row.path, "bytes": row.size_bytes}))
    else:
        print(f"deleted {row.name}")
    return 0
