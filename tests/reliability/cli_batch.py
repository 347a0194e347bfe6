"""Run many ``python -m engine`` command lines in ONE child process (start-up is the cost).

Reads a JSON list of ``{"id": str, "argv": [str, ...]}`` on stdin; prints one JSON line per
case: ``{"id", "rc", "stdout", "stderr", "seconds"}``. Each case goes through
``engine.cli.main`` exactly as ``python -m engine`` does, with its own captured streams; an
exception escaping ``main`` is recorded as its traceback (rc -1), which the tests reject. A
native crash or a hang ends the whole batch: the parent then fails every case it did not get.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback


def run_case(argv: list[str]) -> dict:
    from engine.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # noqa: BLE001 - recorded, the test fails on it
            rc = -1
            traceback.print_exc()
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "seconds": round(time.monotonic() - t0, 3)}


def main() -> None:
    import logging

    cases = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    for case in cases:
        logging.getLogger().handlers.clear()  # each main() configures logging afresh
        result = {"id": case["id"], **run_case(case["argv"])}
        real_stdout.write(json.dumps(result) + "\n")
        real_stdout.flush()


if __name__ == "__main__":
    main()
