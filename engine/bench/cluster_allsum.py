"""Latency of one ``all_sum`` of a decode step's activation, between the ranks of a cluster.

Run under mlx.launch with a hostfile of two 127.0.0.1 hosts for loopback:
``mlx.launch --hostfile hosts.json --backend ring --python PY -- -m engine.bench.cluster_allsum``;
rank 0 prints one JSON object:
for each (rows, hidden, dtype) the median and 10th/90th percentile microseconds of an
``all_sum`` evaluated alone (``mx.eval`` each time: what one collective costs a forward that
waits on it), over ``--repeats`` rounds after a warm-up.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

SHAPES = [(1, 192, "float32"), (1, 4096, "bfloat16"), (4, 4096, "bfloat16"),
          (8, 4096, "bfloat16")]


def measure(rows: int, hidden: int, dtype: str, repeats: int) -> dict:
    a = mx.ones((1, rows, hidden), dtype=getattr(mx, dtype))
    mx.eval(a)
    for _ in range(20):
        mx.eval(mx.distributed.all_sum(a))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(mx.distributed.all_sum(a))
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return {"rows": rows, "hidden": hidden, "dtype": dtype,
            "bytes": rows * hidden * a.itemsize, "median_us": round(statistics.median(times), 1),
            "p10_us": round(times[len(times) // 10], 1),
            "p90_us": round(times[9 * len(times) // 10], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args()
    g = mx.distributed.init(strict=True)
    out = [measure(r, h, d, args.repeats) for r, h, d in SHAPES]
    if g.rank() == 0:
        print(json.dumps({"ranks": g.size(), "all_sum": out}))


if __name__ == "__main__":
    main()
