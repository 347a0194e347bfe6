"""``Cluster``: this process's place in a model split across machines, on MLX's own
``mx.distributed`` (the ring backend over TCP, JACCL over Thunderbolt RDMA, MPI), started by
``mlx.launch``. Nothing here opens a socket: every byte between ranks is an MLX collective.

- ``Cluster.join()``: ``mx.distributed.init`` (strict: a process not started by ``mlx.launch``
  gets a one-line ``ClusterError``), then every collective MLX and mlx-lm issue is counted
  (``counts``: by kind; ``control``: this package's own), so the rounds per generated token
  are measured in the run, not estimated.
- Control messages from rank 0 (``broadcast_bytes``, ``share``, ``share_ints``) are
  ``all_sum``s in which the other ranks contribute zeros: exact for integers, no new
  transport. A message fits one collective of ``HEADER`` bytes; a longer one (a new
  request's prompt) takes a second.
- ``check_same(fingerprint)``: every rank's model fingerprint gathered, compared on every rank
  before anything is served; a mismatch names the ranks.
- The watchdog: ``watch(what)`` around every step; a step that takes longer than
  ``timeout_s`` (a rank that stopped answering without closing its sockets: an unplugged
  cable, a frozen machine) calls ``on_stall`` from the watchdog thread. A rank that dies
  closes its sockets: the collective raises at once (``ClusterError`` from ``fail``).

``MTPCHAT_TRACE_COLLECTIVES=1`` prints every collective as it is built, with its caller
(finding where two ranks' sequences part).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx

from engine.errors import ClusterError

log = logging.getLogger(__name__)

HEADER = 256            # bytes of the per-step control message that fit one collective
COUNTED = ("all_sum", "all_gather", "send", "recv", "recv_like", "all_max", "all_min")
DEFAULT_TIMEOUT_S = 8.0  # a step longer than this: the other ranks are presumed gone


class Cluster:
    """See the module docstring. ``mode``: "tensor" or "pipeline"."""

    def __init__(self, group, *, mode: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        self.mode = mode
        self.timeout_s = timeout_s
        self.counts: Counter[str] = Counter()
        self.control: Counter[str] = Counter()
        self.on_stall: Callable[[str, float], None] | None = None
        self.on_broken: Callable[[BaseException], None] | None = None
        self._watching: tuple[str, float] | None = None
        self._stalled = False
        self._watchdog: threading.Thread | None = None

    # -- joining ----------------------------------------------------------------------------
    @classmethod
    def join(cls, *, mode: str, timeout_s: float = DEFAULT_TIMEOUT_S,
             backend: str = "any") -> "Cluster":
        try:
            group = mx.distributed.init(strict=True, backend=backend)
        except Exception as exc:  # noqa: BLE001 - MLX raises RuntimeError/ValueError
            raise ClusterError(f"this process is not part of a cluster ({exc}); start it with "
                               "--hostfile, which runs it through mlx.launch") from exc
        if group.size() < 2:
            raise ClusterError("the cluster has one rank: list at least two hosts in the "
                               "hostfile")
        cluster = cls(group, mode=mode, timeout_s=timeout_s)
        cluster.count_collectives()
        return cluster

    def count_collectives(self) -> None:
        """Count every call of MLX's collectives from now on (mlx-lm's sharded layers call
        them through ``mx.distributed``; the engine runs its forwards uncompiled in a
        cluster, so each call is one collective of the run)."""
        dist = mx.distributed
        for name in COUNTED:
            fn = getattr(dist, name, None)
            if fn is None or getattr(fn, "_mtpchat_counted", False):
                continue
            setattr(dist, name, _counted(fn, name, self.counts))

    # -- control messages from rank 0 -------------------------------------------------------
    def share(self, a: mx.array) -> mx.array:
        """Rank 0's ``a`` on every rank (lazy): one ``all_sum``, the others adding zeros."""
        self.control["share"] += 1
        return mx.distributed.all_sum(a if self.rank == 0 else mx.zeros_like(a),
                                      group=self.group)

    def share_ints(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` (the others pass as many zeros), read on the host."""
        return self.share(mx.array(values, dtype=mx.int32)).tolist()

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's ``data`` on every rank (the others pass None): one collective of
        ``HEADER`` bytes, a second one only for what does not fit."""
        head = bytearray(HEADER)
        if self.rank == 0:
            head[:4] = len(data).to_bytes(4, "little")
            head[4:4 + min(len(data), HEADER - 4)] = data[:HEADER - 4]
        got = bytes(self._bytes_round(bytes(head), "message"))
        n = int.from_bytes(got[:4], "little")
        body = got[4:4 + min(n, HEADER - 4)]
        if n > HEADER - 4:
            rest = data[HEADER - 4:] if self.rank == 0 else bytes(n - (HEADER - 4))
            body += bytes(self._bytes_round(rest, "message_rest"))
        return body

    def _bytes_round(self, data: bytes, kind: str) -> bytes:
        self.control[kind] += 1
        a = mx.array(list(data) if self.rank == 0 else [0] * len(data), dtype=mx.uint8)
        return bytes(mx.distributed.all_sum(a, group=self.group).tolist())

    def send_json(self, msg: dict | None) -> dict:
        """Rank 0 sends ``msg``; every rank returns it."""
        raw = json.dumps(msg, separators=(",", ":")).encode() if self.rank == 0 else None
        return json.loads(self.broadcast_bytes(raw))

    # -- checks before serving ----------------------------------------------------------------
    def check_same(self, fingerprint: bytes, what: str = "model") -> None:
        """Every rank's 32-byte ``fingerprint`` gathered; ``ClusterError`` on every rank
        unless they are all equal."""
        a = mx.array(list(fingerprint[:32].ljust(32, b"\0")), dtype=mx.uint8)
        rows = mx.distributed.all_gather(a[None], group=self.group).tolist()
        self.control["fingerprint"] += 1
        differ = [r for r, row in enumerate(rows) if row != rows[0]]
        if differ:
            ranks = ", ".join(str(r) for r in differ)
            raise ClusterError(
                f"the {what} folder differs between ranks (rank {ranks} against rank 0: "
                "config.json, safetensors headers or tokenizer); copy the same model folder "
                "to the same path on every host")

    def barrier(self, what: str) -> None:
        """Wait (without the watchdog: loading a shard takes what it takes) until every rank
        is here."""
        self.control[what] += 1
        mx.eval(mx.distributed.all_sum(mx.array([1], dtype=mx.int32), group=self.group))

    # -- the watchdog ---------------------------------------------------------------------------
    @contextmanager
    def watch(self, what: str) -> Iterator[None]:
        """Run the body under the watchdog; a collective that raises becomes a
        ``ClusterError`` naming the cluster."""
        self._start_watchdog()
        self._watching = (what, time.monotonic())
        try:
            yield
        except RuntimeError as exc:
            err = self.fail(exc)
            if self.on_broken is not None:
                self.on_broken(err)
            raise err from exc
        finally:
            self._watching = None

    def fail(self, exc: BaseException) -> ClusterError:
        text = " ".join(str(exc).split())
        return ClusterError(f"the cluster stopped: another rank is gone ({text}); restart it")

    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch_loop, name="mtp-watchdog",
                                              daemon=True)
            self._watchdog.start()

    def _watch_loop(self) -> None:
        while not self._stalled:
            time.sleep(0.2)
            cur = self._watching
            if cur is None:
                continue
            elapsed = time.monotonic() - cur[1]
            if elapsed > self.timeout_s:
                self._stalled = True
                log.error("rank %d: %s has waited %.1f s for the other ranks", self.rank,
                          cur[0], elapsed)
                if self.on_stall is not None:
                    self.on_stall(cur[0], elapsed)

    def stall_error(self, what: str, elapsed: float) -> ClusterError:
        return ClusterError(f"the cluster stopped: no answer from the other ranks for "
                            f"{elapsed:.0f} s during {what} (a host unreachable or frozen)")

    # -- figures ---------------------------------------------------------------------------------
    def rounds(self) -> dict:
        """The collectives counted so far: by kind, and this package's own among them."""
        return {"total": sum(self.counts.values()), "by_kind": dict(self.counts),
                "control": dict(self.control)}


def _counted(fn, name: str, counts: Counter):
    import os
    import traceback

    trace = os.environ.get("MTPCHAT_TRACE_COLLECTIVES") == "1"

    def counted(*args, **kwargs):
        counts[name] += 1
        if trace:
            where = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack(limit=6)[:-1]]
            print(f"[{os.environ.get('MLX_RANK')}] {name} #{counts[name]} "
                  f"{getattr(args[0], 'shape', '')} {' < '.join(reversed(where))}", flush=True)
        return fn(*args, **kwargs)
    counted._mtpchat_counted = True
    counted.__doc__ = fn.__doc__
    return counted
