"""``info``: engine and MLX versions, compute device, BLAS, memory."""
from __future__ import annotations

import json

HELP = "show versions, the device MLX computes on, the BLAS in use and memory"


def add_arguments(p) -> None:
    p.add_argument("--bench", action="store_true",
                   help="time 1-, 8- and 32-row 4096x4096 float32 products (BLAS check)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def run(args) -> int:
    from engine.sysinfo import matmul_bench, system_info

    info = system_info()
    if args.bench:
        info["matmul_bench"] = matmul_bench()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"MTP Chat engine {info['engine_version']}")
    print(f"  mlx {info['mlx_version']}, mlx-lm {info['mlx_lm_version']}")
    print(f"  device: {info['device']} (Metal available: {info['metal_available']}; "
          f"layers: the {info['device_branch']} branch)")
    print(f"  BLAS:   {info['blas']}" + (f" ({info['blas_path']})" if info["blas_path"] else "")
          + (f", {info['blas_core']} kernels" if info["blas_core"] else ""))
    print(f"  weight products in blocks for the small-matrix kernel: "
          f"{'on' if info['block_products'] else 'off'} (MTPCHAT_BLOCK_PRODUCTS)")
    print(f"  weights column-major for the packed products: "
          f"{'on' if info['column_weights'] else 'off'} (MTPCHAT_COLUMN_WEIGHTS)")
    print(f"  memory: {_gib(info['available_bytes'])} available of {_gib(info['total_bytes'])}")
    if "matmul_bench" in info:
        b = info["matmul_bench"]
        rows = ", ".join(f"{r} rows {ms} ms" for r, ms in b["ms_by_rows"].items())
        print(f"  {b['size']}x{b['size']} product: {rows} (32/1 ratio {b['ratio_last_to_first']})")
    return 0
