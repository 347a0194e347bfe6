"""``convert SRC DST [--bits 4|8] [--group-size 64]``: raw HF -> MLX layout, MTP head kept."""
from __future__ import annotations

import json
import sys

HELP = "convert a raw Hugging Face Qwen3.5/3.6 checkpoint to MLX layout (optionally 4/8-bit), keeping the MTP head"


def add_arguments(p) -> None:
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--bits", type=int, choices=(4, 8), default=None)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    p.add_argument("--vision-bits", type=int, choices=(4, 8), default=None,
                   help="quantize the vision encoder too (default: kept as published)")


def run(args) -> int:
    from engine.models.convert import convert
    from engine.models.model import load

    def progress(frac: float, msg: str) -> None:
        if not args.json:
            print(f"[{frac * 100:5.1f}%] {msg}", file=sys.stderr)

    out = convert(args.src, args.dst, bits=args.bits, group_size=args.group_size,
                  dtype=args.dtype, progress=progress, vision_bits=args.vision_bits)
    info = load(out).info
    result = {"dst": str(out), "bits": args.bits, "has_mtp": info.has_mtp,
              "bytes": info.bytes_on_disk, "layout": info.layout}
    print(json.dumps(result) if args.json else
          f"wrote {out} ({info.bytes_on_disk / 2**20:.1f} MiB, MTP kept: {info.has_mtp})")
    return 0
