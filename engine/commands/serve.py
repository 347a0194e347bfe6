"""``serve``: the local OpenAI- and Anthropic-compatible server (see ``engine.server``).

Loads the model on the scheduler's worker thread, prints one line ``Serving MODEL on URL``
to stdout once it listens (``--json``: one JSON object with ``url`` and ``model``), and runs
until SIGINT/SIGTERM, which drains (in-flight replies get ``--drain-seconds`` to finish, then
are cancelled and end with their final event) and exits 0. A non-loopback ``--host`` without
``--api-key`` exits 2 before anything loads. ``--max-body-mb``, ``--allow-origin`` (and
``MTPCHAT_ORIGINS``) and ``--max-connections`` set the perimeter (``engine.server.guard``,
``engine.server.connections``).
"""
from __future__ import annotations

import argparse
import json
import sys

HELP = "serve the model over OpenAI- and Anthropic-compatible HTTP APIs"


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0..65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {text!r}")
    return port


def _default_streams() -> int:
    from engine.decoding.decoder import DEFAULT_STREAMS

    return DEFAULT_STREAMS


def _budget(text: str) -> int:
    """An argparse type: ``--memory-budget`` in bytes (engine.core.memory.parse_budget)."""
    from engine.core.memory import parse_budget

    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _streams(text: str) -> int:
    """An argparse type: how many streams a batch holds, 1..64."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--max-streams is a number from 1 to 64, not {text!r}")
    return n


def _positive(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, not {text!r}")
    return value


def image_policy(args):
    """The server's ``ImagePolicy`` from --allow-remote-images and the image limits."""
    from engine.server.images import ImagePolicy
    from engine.vision.image_io import ImageLimits

    return ImagePolicy(limits=ImageLimits(max_bytes=int(args.max_image_mb * (1 << 20)),
                                          max_pixels=int(args.max_image_pixels),
                                          max_images=int(args.max_images)),
                       allow_remote=bool(args.allow_remote_images))


def add_arguments(p) -> None:
    from engine.commands.generate import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                   "any non-loopback address needs --api-key)")
    p.add_argument("--port", type=_port, default=8080, help="port (0 picks a free one)")
    p.add_argument("--api-key", default=None, help="require this key (Authorization: Bearer "
                   "KEY, or x-api-key: KEY) on every request")
    p.add_argument("--depth", default="auto", help="default drafts per cycle, 0..6 or auto "
                   "(requests may override it with \"mtp\": {\"depth\": ...})")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait; past "
                   "that the server answers 429 (default 16)")
    p.add_argument("--max-streams", type=_streams, default=None, help="requests decoded "
                   "together in one batch (1 = one at a time; default %d)" % _default_streams())
    p.add_argument("--memory-budget", type=_budget, default=None, help="memory the process "
                   "may use, e.g. 8GB: requests that would pass it wait, are cut short or "
                   "refused (default: MLX's recommended working set on a Mac, else 70%% of "
                   "the RAM)")
    p.add_argument("--drain-seconds", type=float, default=10.0, help="on Ctrl+C, how long "
                   "in-flight replies may run before they are cancelled (default 10)")
    p.add_argument("--max-body-mb", type=_positive, default=32.0, help="largest request body "
                   "in MiB; larger ones get 413 without being read (default 32)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call the server from a browser (CORS), "
                   "e.g. http://localhost:3000; repeatable; '*' allows every page. Also read "
                   "from MTPCHAT_ORIGINS (comma-separated). Default: none")
    p.add_argument("--allow-remote-images", action="store_true", help="fetch http(s) image "
                   "URLs in requests (default: refused with a 400; images come inline as "
                   "data: URLs or base64, so no web page can make the server fetch a URL)")
    p.add_argument("--max-image-mb", type=_positive, default=20.0, help="largest image in "
                   "MiB (default 20)")
    p.add_argument("--max-image-pixels", type=_positive, default=40e6, help="most pixels in "
                   "one image, width x height (default 40000000)")
    p.add_argument("--max-images", type=_positive, default=8, help="most images in one "
                   "request (default 8)")
    p.add_argument("--max-connections", type=int, default=512, help="open connections at "
                   "most (idle ones are closed first; lowered to fit the file-descriptor "
                   "limit; default 512)")
    from engine.distributed.launch import add_arguments as add_cluster_arguments

    add_cluster_arguments(p)


def _resolve_model(name: str | None) -> str:
    from pathlib import Path

    from engine import default_model_path
    from engine.errors import ModelLoadError

    if not name:
        return str(default_model_path())
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    from engine.hub.store import Store

    row = Store().get(name)
    if row is None:
        raise ModelLoadError(f"No model folder or installed model named {name!r} "
                             "(see `python -m engine list`; Hub repos: `python -m engine pull`).")
    return str(row.path)


def run(args) -> int:
    import os

    from engine.commands.generate import parse_depth
    from engine.core.scheduler import Scheduler
    from engine.server.guard import ORIGINS_ENV, Perimeter, parse_origins
    from engine.server.runner import Server, is_loopback

    if not is_loopback(args.host) and not args.api_key:
        print(f"error: refusing to serve on {args.host} without --api-key: anyone who can "
              "reach that address could use the model. Pass --api-key KEY, or bind 127.0.0.1.",
              file=sys.stderr)
        return 2
    if args.max_queue < 0:
        print("error: --max-queue must be >= 0", file=sys.stderr)
        return 2
    if args.max_connections < 1:
        print("error: --max-connections must be >= 1", file=sys.stderr)
        return 2
    perimeter = Perimeter(max_body_bytes=int(args.max_body_mb * (1 << 20)),
                          allow_origins=parse_origins([*args.allow_origin,
                                                       os.environ.get(ORIGINS_ENV, "")]))
    depth = parse_depth(args.depth)
    cluster = None
    if args.hostfile:
        from engine.distributed import node

        cluster = _cluster(args)
        if isinstance(cluster, int):  # the launcher, or a rank other than 0: done
            return cluster
    path = args.model if cluster is not None else _resolve_model(args.model)

    def load():
        if cluster is not None:
            return node.load_shard(cluster, args)
        from engine import load as load_model

        return load_model(path, dtype=args.dtype)

    streams = args.max_streams or _default_streams()
    scheduler = Scheduler(loader=lambda: loaded_and_frozen(load), max_queue=args.max_queue,
                          max_streams=streams, memory_budget=args.memory_budget).start()
    if cluster is not None:  # a rank gone: every request ends with the reason, then exit
        cluster.on_stall = node.exit_on_stall(cluster, scheduler.abort)
        node.exit_when_broken(cluster)
    server = Server(scheduler, host=args.host, port=args.port, api_key=args.api_key,
                    default_depth=depth, drain_s=args.drain_seconds, perimeter=perimeter,
                    images=image_policy(args),
                    max_connections=args.max_connections)
    _announce_when_started(server, args.json)
    server.serve()
    scheduler.stop(timeout=5)
    if cluster is not None:
        node.finish(cluster, 0)
    print("server stopped", file=sys.stderr)
    _exit_now(0)
    return 0


def loaded_and_frozen(load):
    """``load()``, then everything allocated so far (modules, the tokenizer, the model's
    Python objects) moved out of the cyclic GC's reach, as the app does after it starts: a
    full collection over a loaded server's heap takes ~100 ms, a stall in every stream it
    lands in. The server loads one model for its whole life, so nothing frozen was due to
    be freed."""
    import gc

    model = load()
    gc.collect()
    gc.freeze()
    return model


def _cluster(args):
    """``--hostfile``: the launcher runs mlx.launch and returns its exit code; a rank other
    than 0 follows rank 0 and returns its exit code; rank 0 returns its ``Cluster``."""
    from engine.distributed import launch, node
    from engine.errors import ClusterError

    if args.mtp_head != "every":
        raise ClusterError("serve keeps the MTP head on every rank (--mtp-head rank0 is for "
                           "measuring with generate)")
    if not launch.in_cluster():
        return launch.run_launcher(args.argv, args)
    cluster = node.join(args)
    if cluster.rank != 0:
        return node.run_follower(cluster, node.load_shard(cluster, args), args)
    return cluster


def _exit_now(code: int) -> None:
    """Leave without running native static destructors. After some request mixes (seen after
    the concurrent-clients test) one of the native libraries loaded here (MLX, torch via
    transformers, tokenizers) aborts in its teardown ("terminate called without an active
    exception", exit -6) although every thread we started has been joined; the drain above
    already finished every reply, so nothing is lost by skipping that teardown."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _announce_when_started(server, as_json: bool) -> None:
    """Print the listening line from a helper thread once uvicorn has bound the socket."""
    import threading
    import time

    def announce() -> None:
        while not server.started:
            time.sleep(0.01)
        name = server.backend.model_id
        line = json.dumps({"url": server.url, "model": name}) if as_json else \
            f"Serving {name} on {server.url} (OpenAI: {server.url}/v1, Anthropic: {server.url})"
        print(line, flush=True)

    threading.Thread(target=announce, name="announce", daemon=True).start()
