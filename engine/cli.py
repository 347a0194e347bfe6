"""``python -m engine VERB`` / ``mtpchat-engine VERB``.

Each verb lives in ``engine/commands/<verb>.py`` with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; those modules import their heavy dependencies inside ``run`` so ``info``
and ``--help`` stay fast.

Exit codes: 0 success; 1 a verb's own "no" (e.g. ``inspect`` of an unsupported model); 2 a
usage or input error — every :class:`EngineError`, every ``ValueError`` raised by validation
and every ``OSError`` comes out as ONE line on stderr (``error: ...``; also as a JSON object on
stdout with ``--json``), never a traceback (``-v`` logs it); 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from engine.commands import (bench, catalog, convert, generate, graft, info, inspect, list_models,
                             pull, rm, search, serve, train_demo, tune, verify)

log = logging.getLogger(__name__)

VERBS = {
    "info": info, "generate": generate, "bench": bench, "tune": tune, "inspect": inspect,
    "convert": convert, "pull": pull, "graft": graft, "list": list_models, "rm": rm,
    "catalog": catalog,
    "search": search,
    "train-demo": train_demo, "serve": serve,
    "verify": verify,
}
USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    from engine import __version__

    parser = argparse.ArgumentParser(
        prog="mtpchat-engine", description="MTP Chat engine: MTP speculative decoding on MLX")
    parser.add_argument("--version", action="version", version=f"mtpchat-engine {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, mod in VERBS.items():
        p = sub.add_parser(verb, help=mod.HELP, description=mod.HELP)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _bad_utf8(argv: list[str]) -> int | None:
    """Index of the first argument that is not valid UTF-8 (decoded with surrogateescape)."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return i
    return None


def fail(message: object, *, as_json: bool = False, kind: str = "error") -> int:
    """Report an error as one line (and as JSON on stdout with --json); return exit code 2."""
    line = " ".join(str(message).split()) or kind
    if as_json:
        print(json.dumps({"error": kind, "message": line}))
    print(f"error: {line}", file=sys.stderr)
    return USAGE_ERROR


# verbs that may run PyTorch: training, and the benchmarks' peers (mlx-vlm's processors)
_TORCH_VERBS = frozenset({"train-demo", "bench"})


def run() -> int:
    """The process entry (``python -m engine``, ``mtpchat-engine``): an installed torch stays
    out of every verb that runs MLX only (before the parser: building it imports mlx-lm).
    Not in :func:`main`, which tests call in a process that also runs torch references."""
    verb = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if verb not in _TORCH_VERBS:
        from engine.torchless import keep_torch_out

        keep_torch_out()
    return main()


def main(argv: list[str] | None = None) -> int:
    from engine.errors import EngineError

    argv = list(sys.argv[1:] if argv is None else argv)
    bad = _bad_utf8(argv)
    if bad is not None:
        return fail(f"argument {bad + 1} is not valid UTF-8 text")
    args = build_parser().parse_args(argv)
    args.argv = argv  # the verb's arguments as given (a cluster's launcher passes them on)
    from engine.loghandlers import QuietStreamHandler

    handler = QuietStreamHandler(sys.stderr)  # a full or closed stderr: one line, then quiet
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        handlers=[handler])
    as_json = getattr(args, "json", False)
    try:
        from engine.decoding.window import check_draft_settings

        check_draft_settings()  # a bad setting ends here in one line, not in a decoding thread
        return int(args._run(args) or 0)
    except (EngineError, ValueError, OSError) as exc:
        log.debug("%s failed", args.verb, exc_info=True)
        if isinstance(exc, BrokenPipeError):
            return 0
        return fail(exc, as_json=as_json, kind=type(exc).__name__)
    except RecursionError as exc:  # e.g. a pathological input nested too deeply
        return fail(f"input nested too deeply ({exc})", as_json=as_json, kind="RecursionError")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
