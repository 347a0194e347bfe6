"""``catalog``: the curated MTP-capable models with a verdict for this machine."""
from __future__ import annotations

import json

HELP = "list the curated MTP-capable models with memory/disk verdicts for this machine"


def add_arguments(p) -> None:
    p.add_argument("--models-dir", default=None, help="store folder whose disk is checked")


def run(args) -> int:
    from engine.hub.catalog import catalog_for_machine

    cat = catalog_for_machine(store_root=args.models_dir)
    if args.json:
        print(json.dumps(cat, indent=2))
        return 0
    m = cat["machine"]
    bw = m.get("bandwidth_bytes_per_s")
    print(f"{m['name']}: memory {m['total_memory_bytes'] / 2**30:.1f} GiB, "
          + (f"measured bandwidth {bw / 1e9:.1f} GB/s, " if bw else "")
          + f"free disk {m['free_disk_bytes'] / 1e9:.1f} GB at {m['store']}\n")
    w = max([24] + [len(e["repo_id"]) for e in cat["models"]])  # whole names: -Instruct / -Thinking
    print(f"{'MODEL':{w}} {'VERDICT':18} {'BEST':5} {'DOWNLOAD':>9} {'MEMORY':>8}  COMMAND")
    for e in cat["models"]:
        best = next((o for o in e["options"] if o["quantization"] == e["best_quantization"]), {})
        print(f"{e['repo_id']:{w}} {e['verdict']:18} {e['best_quantization'] or '-':5} "
              f"{best.get('download_bytes', 0) / 1e9:7.1f}GB {best.get('memory_bytes', 0) / 2**30:6.1f}G"
              f"  {e['pull_command']}")
        for g in e.get("graft") or []:
            est = "" if g["head_bytes_measured"] else " (estimated)"
            print(f"  or {g['conversion_repo']} + its MTP head{est}: "
                  f"{g['download_bytes'] / 1e9:.1f} GB download "
                  f"(head {g['head_bytes'] / 1e9:.2f} GB), {g['verdict']}: {g['command']}")
    print("\nSizes are estimates; `python -m engine inspect REPO` reads the exact ones.")
    return 0
