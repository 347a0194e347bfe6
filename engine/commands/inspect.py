"""``inspect PATH_OR_REPO``: supported? MTP head present? size? fits this machine?"""
from __future__ import annotations

import json
from pathlib import Path

HELP = "check a local model folder or a Hub repo before loading/downloading it"


def add_arguments(p) -> None:
    p.add_argument("target", help="a model folder, an installed model's name, org/name, or a "
                   "huggingface.co URL")
    p.add_argument("--revision", default=None, help="branch, tag or commit (repos only)")
    p.add_argument("--token", default=None, help="Hugging Face token for gated repos")


def _print(r: dict) -> None:
    yes = {True: "yes", False: "no", None: "?"}
    print(f"{r['source']}")
    print(f"  architecture: {r['architecture']} (family {r['family'] or 'unsupported'}, "
          f"layout {r['layout'] or '?'})")
    params = r["parameters"]
    if params:
        print(f"  parameters:   {params / 1e9:.2f} B{' (estimated)' if r['parameters_estimated'] else ''}")
    print(f"  weights:      {r['bytes'] / 1e9:.2f} GB"
          + (f", download {r['download_bytes'] / 1e9:.2f} GB" if r.get("download_bytes") else ""))
    q = r["quantization"]
    print(f"  quantization: {str(q.get('bits')) + '-bit' if q else 'none'}")
    print(f"  MTP head:     {yes[r['has_mtp']]} ({r['mtp_layers']} layer(s))")
    m = r["machine"]
    print(f"  memory:       {r['memory_needed_bytes'] / 2**30:.1f} GiB needed of "
          f"{m['total_memory_bytes'] / 2**30:.1f} GiB — {m['verdict']}")
    print(f"  supported:    {yes[r['supported']]}; can speculate: {yes[r['can_speculate']]}")
    for why in r["reasons"]:
        print(f"  ! {why}")
    if r["fix"]:
        print(f"  fix: {r['fix']}")


def _local_folder(target: str) -> Path | None:
    """A path, or the name of an installed model; None for a Hub repo id or URL."""
    path = Path(target).expanduser()
    if path.exists():
        return path
    if "/" in target or ":" in target:
        return None
    from engine.errors import ModelLoadError
    from engine.hub.store import resolve_model

    try:
        return resolve_model(target)
    except ModelLoadError:
        return None


def run(args) -> int:
    from engine.hub.inspection import inspect_local, inspect_repo

    local = _local_folder(args.target)
    if local is not None:
        report = inspect_local(local, offer="online")
    else:
        from engine.hub.catalog import warning_for
        from engine.hub.client import parse_repo_ref

        repo_id, url_rev = parse_repo_ref(args.target)
        report = inspect_repo(repo_id, revision=args.revision or url_rev or "main",
                              token=args.token)
        warn = warning_for(repo_id)
        if warn and warn not in report["reasons"]:
            report["reasons"].append(warn)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0 if report["supported"] else 1
