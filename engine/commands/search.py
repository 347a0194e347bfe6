"""``search QUERY``: find Qwen3.5/3.6 models on the Hub, with MTP, size and this machine's verdict."""
from __future__ import annotations

import json

HELP = ("search the Hugging Face Hub for models this engine runs (MTP head, quantization, size, "
        "gated/licence, downloads, likes and a verdict for this machine)")


def add_arguments(p) -> None:
    p.add_argument("query", help="words to search for, e.g. 'Qwen3.5 4B'")
    p.add_argument("--limit", type=int, default=10, help="results per page (1-100)")
    p.add_argument("--page", type=int, default=1, help="which page of results (1 = first)")
    p.add_argument("--no-check", action="store_true",
                   help="list only; skip reading each repo's safetensors headers")
    p.add_argument("--token", default=None, help="Hugging Face token (gated repos)")


def _size(n: int | None) -> str:
    return "?" if not n else (f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB")


def _row(r) -> str:
    mtp = {True: "yes", False: "no", None: "?"}[r.has_mtp]
    quant = f"{r.quantization.get('bits')}-bit" if r.quantization else "-"
    gated = "gated" if r.gated else (r.license or "-")
    return (f"{r.repo_id[:44]:44} {mtp:4} {quant:6} {_size(r.download_bytes or r.size_bytes):>9} "
            f"{gated[:12]:12} {r.downloads:>9} {r.likes:>6}  {r.verdict or '-'}")


def run(args) -> int:
    from engine.errors import HubError
    from engine.hub.search import HubSearch, check_all

    if args.page < 1:
        raise HubError(f"--page must be 1 or more, not {args.page}")
    s = HubSearch(args.query, page_size=args.limit, token=args.token)
    page: list = []
    for _ in range(args.page):
        page = s.next_page()
    if not args.no_check:
        page = check_all(page, token=args.token)
    if args.json:
        print(json.dumps({"query": args.query, "page": args.page, "more": s.more,
                          "results": [r.to_dict() for r in page]}, indent=2))
        return 0
    if not page:
        print(f"No Qwen3.5/3.6 models match {args.query!r}" + (" on this page." if args.page > 1
                                                              else "."))
        return 0
    print(f"{'REPO':44} {'MTP':4} {'QUANT':6} {'SIZE':>9} {'GATED/LIC':12} {'DOWNLOADS':>9} "
          f"{'LIKES':>6}  VERDICT")
    for r in page:
        print(_row(r))
        if r.note:
            print(f"  ! {r.note}")
    if s.more:
        print(f"\nmore: python -m engine search {args.query!r} --page {args.page + 1}")
    return 0
