"""``graft MODEL``: add the MTP head to a headless conversion, downloading only the head."""
from __future__ import annotations

import json
import sys
import threading
import time

HELP = ("add the MTP head to an MLX conversion that has none (Qwen3.5/3.6, Qwen3-Next, GLM-4.x, "
        "DeepSeek-V3; mlx-community, "
        "LM Studio, the Hugging Face cache), downloading only the head from its source repo")


def add_arguments(p) -> None:
    p.add_argument("model", help="a model folder, an installed model's name, or org/name of a "
                   "model found on this machine")
    p.add_argument("--from", dest="source", default=None,
                   help="the repo the model was converted from (default: its model card's "
                        "base_model, else the official Qwen repo matching its config)")
    p.add_argument("--revision", default="main", help="the source's branch, tag or commit")
    p.add_argument("--bits", type=int, choices=(8, 16), default=8,
                   help="the head's precision (never below 8 bits; 16 keeps the source's)")
    p.add_argument("--min-acceptance", type=float, default=None,
                   help="refuse below this greedy acceptance on the calibration (default 0.10)")
    p.add_argument("--token", default=None, help="Hugging Face token (default: HF_TOKEN, the "
                   "app's saved token, then `hf auth login`'s)")
    p.add_argument("--models-dir", default=None, help="store folder (default: the app's)")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _printer(as_json: bool):
    last = [0.0]

    def show(p) -> None:
        now = time.monotonic()
        final = p.phase in ("done", "failed", "cancelled")
        if not final and now - last[0] < 0.3:
            return
        if p.phase == "failed" and not as_json:  # the CLI's "error: ..." line says it
            print("\r".ljust(100)[:120] + "\r" if last[0] else "", end="", file=sys.stderr)
            return
        last[0] = now
        if as_json:
            from dataclasses import asdict

            print(json.dumps({"event": "progress", **asdict(p)}), flush=True)
            return
        size = f" {_mb(p.bytes_done)} / {_mb(p.bytes_total)}" if p.bytes_total else ""
        print(f"\r{p.phase}: {p.message}{size}".ljust(100)[:120], end="\n" if final else "",
              file=sys.stderr, flush=True)
    return show


def _report(res) -> None:
    if res.status != "grafted":
        print("cancelled; run the same command again to resume (what was fetched is kept)")
        return
    where = "beside the model" if res.mode == "sidecar" else "as a new model in MTP Chat's store"
    print(f"grafted the MTP head from {res.source} onto {res.name} ({where}): {res.path}")
    print(f"  downloaded {_mb(res.bytes_downloaded)} (head {_mb(res.bytes_fetched)}"
          f"{', ' + _mb(res.resumed_bytes) + ' resumed' if res.resumed_bytes else ''}, headers "
          f"and checks {_mb(res.metadata_bytes + res.check_bytes)}) instead of "
          f"{_mb(res.repo_bytes)} for the whole source")
    print(f"  head at {res.bits} bits ({_mb(res.sidecar_bytes)}); acceptance {res.acceptance:.2f}"
          f" at depth 3 on the built-in calibration ({res.drafted} drafted tokens)")


def run(args) -> int:
    from engine.core.threadexit import release_thread_streams
    from engine.hub.graft import MIN_ACCEPTANCE, Grafter
    from engine.hub.store import Store

    cancel = threading.Event()
    box: dict = {}
    g = Grafter(args.model, source=args.source, revision=args.revision, bits=args.bits,
                token=args.token, store=Store(args.models_dir), progress=_printer(args.json),
                cancel=cancel, min_acceptance=MIN_ACCEPTANCE if args.min_acceptance is None
                else args.min_acceptance)

    def work() -> None:
        try:
            box["result"] = g.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = exc
        finally:
            release_thread_streams()

    t = threading.Thread(target=work, name="graft", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    except KeyboardInterrupt:  # cancel, then wait for the worker to stop and say so
        cancel.set()
        while "result" not in box and "error" not in box:  # (an interrupted join may lie)
            time.sleep(0.05)
    if "error" in box:
        raise box["error"]
    res = box["result"]
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"event": "result", **asdict(res),
                          "bytes_downloaded": res.bytes_downloaded}), flush=True)
    else:
        _report(res)
    return 0 if res.status == "grafted" else 130
