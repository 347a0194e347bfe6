"""A rank of a cluster: join it, check the model is the same everywhere, load this rank's
shard, then rank 0 runs the command (``generate``, ``serve``) on a ``LeaderDecoder`` while the
other ranks ``follow`` it.

Order on every rank: ``mx.distributed.init`` (``Cluster.join``), the model's family
(unsupported: one line), the fingerprint of config, tokenizer and safetensors headers
gathered and compared (different folders: one line on every rank, before any weight is read),
then the load, with mlx-lm's ``shard``/``pipeline`` applied to the built modules before their
weights are read, so each rank reads only its part. The forwards run the device branch
"metal" (mlx-lm's own uncompiled layers, which ``shard`` rewires; on a Mac that is the branch
anyway): every collective is then one counted call (``Cluster.rounds``).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time

from engine.distributed.cluster import Cluster
from engine.distributed.family import fingerprint, sharder
from engine.distributed.lockstep import LeaderDecoder, follow, stop_followers

log = logging.getLogger(__name__)


def start(args) -> tuple[Cluster, object]:
    """Join the cluster and load this rank's shard of ``args.model``."""
    cluster = join(args)
    return cluster, load_shard(cluster, args)


def join(args) -> Cluster:
    """``mx.distributed.init`` through ``Cluster.join``, with the command's options."""
    return Cluster.join(mode=args.split or "tensor", timeout_s=args.step_timeout,
                        backend=args.backend or "any")


def load_shard(cluster: Cluster, args):
    """Check the model is the same on every rank, then load this rank's shard of it."""
    from engine import default_model_path, load
    from engine.hub.store import resolve_model
    from engine.models import device
    from engine.models.checkpoint import read_checkpoint

    device.set_branch("metal")
    folder = resolve_model(args.model or default_model_path())
    ckpt = read_checkpoint(folder)
    shard = sharder(ckpt.config.family)
    cluster.check_same(fingerprint(folder, list(ckpt.shards)))

    def prepare(built, ck) -> None:
        shard(built.trunk, cluster.group, cluster.mode, ck.config.text)

    model = load(folder, dtype=args.dtype, prepare=prepare)
    cluster.barrier("loaded")  # rank 0 serves once every rank holds its shard
    if cluster.rank == 0:
        model.decoder_factory = functools.partial(_leader, cluster)
    log.info("rank %d of %d: %s shard of %s loaded", cluster.rank, cluster.size,
             cluster.mode, folder.name)
    return model


def _leader(cluster, model, *, max_streams: int, carryover=None, use_mtp: bool = True):
    return LeaderDecoder(cluster, model, max_streams=max_streams, carryover=carryover,
                         use_mtp=use_mtp)


def run_follower(cluster, model, args=None) -> int:
    """A rank other than 0, until rank 0 says stop (0) or the cluster breaks (exit 3). With
    ``--mtp-head rank0`` (``generate`` only) this rank drops its MTP head and drafts nothing."""
    cluster.on_stall = _exit_on_stall(cluster)
    head_here = getattr(args, "mtp_head", "every") == "every"
    if not head_here:
        model.mtp = None  # rank 0 drafts for every rank: this copy is never used
    try:
        follow(cluster, model, head_here=head_here)
    except Exception as exc:  # noqa: BLE001 - a broken cluster: say it in one line, leave
        print(f"error: rank {cluster.rank}: {' '.join(str(exc).split())}", file=sys.stderr,
              flush=True)
        _exit(3)
    _exit(0)
    return 0


def finish(cluster, code: int) -> int:
    """Rank 0, done: the other ranks leave; rounds counted go to the log."""
    try:
        stop_followers(cluster)
    except Exception:  # noqa: BLE001 - they may be gone already
        log.debug("could not stop the other ranks", exc_info=True)
    log.info("collectives: %s", cluster.rounds())
    return code


def _exit_on_stall(cluster, before=None):
    def stalled(what: str, elapsed: float) -> None:
        err = cluster.stall_error(what, elapsed)
        if before is not None:
            before(err)
        print(f"error: rank {cluster.rank}: {err}", file=sys.stderr, flush=True)
        _exit(3)
    return stalled


def exit_on_stall(cluster, before=None):
    """``cluster.on_stall`` for rank 0: ``before(error)`` (fail the requests), then exit."""
    return _exit_on_stall(cluster, before)


def exit_when_broken(cluster, grace_s: float = 1.0) -> None:
    """Rank 0 serving: once a collective failed (another rank died), the requests it held
    end with that error (the scheduler's), and the process exits ``grace_s`` later: a
    cluster with a rank gone cannot run another forward."""
    def broken(err) -> None:
        print(f"error: rank 0: {err}", file=sys.stderr, flush=True)
        threading.Timer(grace_s, _exit, args=(3,)).start()
    cluster.on_broken = broken


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.2)  # let a server's threads hand their last error out
    os._exit(code)


class RoundCounter:
    """The collectives of one reply's decoding (after its first token: the prompt's prefill
    left out), per generated token and per cycle, as rank 0 counted them."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.start: tuple[dict, dict] | None = None
        self.tokens = 0
        self.cycles = 0

    def _now(self) -> tuple[dict, dict]:
        return dict(self.cluster.counts), dict(self.cluster.control)

    def saw(self, ev) -> None:
        if self.start is None:
            if ev.token_ids:
                self.start = self._now()
            return
        self.tokens += len(ev.token_ids)
        self.cycles += ev.stats is not None

    def report(self) -> dict:
        base = {"rank": self.cluster.rank, "size": self.cluster.size,
                "mode": self.cluster.mode}
        if self.start is None:
            return base
        counts, control = self._now()
        by_kind = {k: v - self.start[0].get(k, 0) for k, v in counts.items()
                   if v - self.start[0].get(k, 0)}
        ctrl = {k: v - self.start[1].get(k, 0) for k, v in control.items()
                if v - self.start[1].get(k, 0)}
        total = sum(by_kind.values())
        return {**base, "decode_tokens": self.tokens, "decode_cycles": self.cycles,
                "collectives": total, "collectives_by_kind": by_kind,
                "control_collectives": ctrl,
                "collectives_per_token": round(total / max(self.tokens, 1), 3),
                "collectives_per_cycle": round(total / max(self.cycles, 1), 3)}
