"""``python -m engine VERB`` / ``mtpchat-engine VERB``.

Each verb lives in ``engine/commands/<verb>.py`` with ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; they are imported only when used so ``info`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

VERBS: dict[str, str] = {
    "info": "engine.commands.info",
    "generate": "engine.commands.generate",
    "bench": "engine.commands.bench",
    "tune": "engine.commands.tune",
    "inspect": "engine.commands.inspect",
    "convert": "engine.commands.convert",
    "pull": "engine.commands.pull",
    "list": "engine.commands.list_models",
    "rm": "engine.commands.rm",
    "catalog": "engine.commands.catalog",
    "train-demo": "engine.commands.train_demo",
    "serve": "engine.commands.serve",
}


def _available_verbs() -> dict[str, object]:
    mods = {}
    for verb, modname in VERBS.items():
        try:
            mods[verb] = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:  # verb not implemented yet
                continue
            raise
    return mods


def build_parser(mods: dict[str, object]) -> argparse.ArgumentParser:
    from engine import __version__

    parser = argparse.ArgumentParser(
        prog="mtpchat-engine", description="MTP Chat engine: MTP speculative decoding on MLX")
    parser.add_argument("--version", action="version", version=f"mtpchat-engine {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, mod in mods.items():
        p = sub.add_parser(verb, help=getattr(mod, "HELP", ""), description=getattr(mod, "HELP", ""))
        p.add_argument("--json", action="store_true", help="machine-readable output")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.errors import EngineError

    mods = _available_verbs()
    args = build_parser(mods).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args._run(args) or 0)
    except EngineError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
