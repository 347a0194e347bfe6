"""``pull REPO``: download a model into the store (resumable), optionally convert it."""
from __future__ import annotations

import json
import sys
import threading
import time

HELP = "download a model from the Hugging Face Hub (resumes; verifies; optional --convert)"


def add_arguments(p) -> None:
    p.add_argument("repo", help="org/name or a huggingface.co URL")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--convert", action="store_true",
                   help="convert the raw checkpoint to MLX after download (keeps the MTP head)")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4, help="bits for --convert")
    p.add_argument("--group-size", type=int, default=64, help="quantization group size")
    p.add_argument("--keep-raw", action="store_true",
                   help="with --convert: keep the raw download too (needs raw + converted disk); "
                        "by default each raw shard is converted as it arrives and deleted")
    p.add_argument("--token", default=None, help="Hugging Face token (default: HF_TOKEN, the "
                   "app's saved token, then `hf auth login`'s)")
    p.add_argument("--models-dir", default=None, help="store folder (default: the app's)")
    p.add_argument("--stall-after", type=float, default=30.0, help="seconds without bytes "
                   "before reporting 'stalled'")
    p.add_argument("--timeout", type=float, default=60.0, help="read timeout in seconds")
    p.add_argument("--retries", type=int, default=5, help="retries per file without progress")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"


def _printer(as_json: bool):
    last = [0.0]

    def show(p) -> None:
        now = time.monotonic()
        final = p.phase in ("done", "failed", "cancelled")
        if not final and now - last[0] < 0.5:
            return
        last[0] = now
        if as_json:
            from dataclasses import asdict

            print(json.dumps({"event": "progress", **asdict(p)}), flush=True)
            return
        eta = f", ETA {p.eta_s:.0f} s" if p.eta_s is not None and p.phase == "downloading" else ""
        stalled = " — STALLED" if p.stalled else ""
        what = f" {p.message}" if p.phase == "converting" and p.message else ""
        line = (f"\r{p.phase}{what}: {_fmt_bytes(p.bytes_done)} / {_fmt_bytes(p.bytes_total)} "
                f"({100 * p.fraction:.0f}%), {_fmt_bytes(p.speed_bps)}/s{eta}, "
                f"file {min(p.files_done + 1, p.files_total)}/{p.files_total}{stalled}")
        print(line.ljust(100), end="\n" if final else "", file=sys.stderr, flush=True)
    return show


def run(args) -> int:
    from engine.core.threadexit import release_thread_streams
    from engine.hub.client import parse_repo_ref
    from engine.hub.pull import pull
    from engine.hub.store import Store

    repo_id, url_rev = parse_repo_ref(args.repo)
    revision = args.revision or url_rev or "main"
    cancel = threading.Event()
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = pull(
                repo_id, revision=revision, convert_bits=args.bits if args.convert else None,
                group_size=args.group_size, keep_raw=args.keep_raw,
                store=Store(args.models_dir), token=args.token,
                progress=_printer(args.json), cancel=cancel, stall_after_s=args.stall_after,
                read_timeout_s=args.timeout, max_retries=args.retries)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = exc
        finally:
            release_thread_streams()

    t = threading.Thread(target=work, name="pull", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    except KeyboardInterrupt:
        cancel.set()
        t.join()
    if "error" in box:
        raise box["error"]
    res = box["result"]
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"event": "result", **asdict(res)}), flush=True)
    elif res.up_to_date:
        print(f"{res.name} is already installed (up to date) in {res.path}; nothing downloaded")
    elif res.status == "installed":
        print(f"installed {res.name} in {res.path} ({_fmt_bytes(res.bytes_fetched)} downloaded"
              f"{', ' + _fmt_bytes(res.resumed_bytes) + ' resumed' if res.resumed_bytes else ''}"
              f", {res.seconds:.1f} s)")
    else:
        print(f"cancelled; run the same command again to resume ({res.name})")
    return 0 if res.status == "installed" else 130
