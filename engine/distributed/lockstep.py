"""Every rank runs the same decoder in lock step; rank 0 decides.

Each rank holds its shard of the trunk, the whole MTP head and a ``BatchDecoder`` of its own.
The trunk's forwards are collective (each layer's parts summed, or the hidden passed on), so
every rank must run the same forwards on the same tokens, step by step:

- **The schedule** (``LeaderDecoder`` on rank 0, ``follow`` on the others): at the start of
  each step rank 0 sends one small message (``Cluster.send_json``): the requests it admitted
  since the last step (prompt ids, budget, depth, sampling, seed, stop strings, draft mode,
  the grammar of a structured-output request), the ids cancelled since, and when the
  scheduler made a new decoder. Rank 0 acts on its cancel flags only through this message
  (each stream's decoder sees a private flag that rank 0 sets when it sends the message), so
  a request cancelled mid-step is cancelled at the same step everywhere. An idle cluster
  sends nothing: the other ranks wait in the next message's collective.
- **One decision** (``Decisions``, the decoder's ``share``): what depends on sampling is taken
  from rank 0 — a stream's first token, each cycle's drafts before the verify forward (one
  lazy ``all_sum`` in the verify's graph: no host round trip), and each cycle's results
  (accepted length, the token after them and the drafts, every row in one ``all_sum`` of a
  few int32s). Every rank then commits the same accepted length: its attention caches trimmed
  and its own Gated DeltaNet heads' states taken at the same step. Nothing else a rank
  computes can change what it feeds next, so the ranks never diverge, whatever rounding their
  hardware does.
- Plain rows decode through the speculative cycle at depth 0 (its token is part of the
  cycle's decision) instead of the pipelined plain loop, which queues the next forward on a
  token before reading it. ``depth="auto"`` becomes ``CLUSTER_AUTO_DEPTH``: the auto
  controller times cycles, and times differ between ranks.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import asdict

import mlx.core as mx

from engine.decoding.decoder import BatchDecoder
from engine.decoding.drafters import Proposal
from engine.decoding.plan import RowResult
from engine.errors import ClusterError, GenerationError
from engine.types import SamplingParams

CLUSTER_AUTO_DEPTH = 3
FOLLOWER_DECODERS = 4  # rank 0 steps at most two at a time (a request batch, the warm-up)
_DECODER_KEYS = itertools.count(1)
_LL_TOKENIZERS: dict[int, object] = {}  # a rank's one model's llguidance tokenizer


class Decisions:
    """The decoder's ``share`` on a rank of ``cluster``: rank 0's decisions everywhere."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster

    def first_token(self, x0: int) -> int:
        return self.cluster.share_ints([x0])[0]

    def drafts(self, inputs: mx.array) -> mx.array:
        """The verify's tokens, rank 0's drafts. Tensor parallel: lazy, inside the verify's
        graph (every rank embeds them). Pipeline parallel: read here, because rank 0's
        verify graph does not depend on them (it receives the hidden of its first layer),
        so MLX could run its receive before this sum while the last rank waits in the sum."""
        shared = self.cluster.share(inputs)
        if self.cluster.mode == "pipeline":
            mx.eval(shared)
        return shared

    def results(self, results: list[RowResult]) -> list[RowResult]:
        width = 3 + max((len(r.drafted) for r in results), default=0)
        flat: list[int] = []
        for r in results:
            row = [r.accepted, r.extra, len(r.drafted), *r.drafted]
            flat += row + [0] * (width - len(row))
        got = self.cluster.share_ints(flat)
        out = []
        for b in range(len(results)):
            n, extra, k, *rest = got[b * width:(b + 1) * width]
            out.append(RowResult(n, extra, rest[:k]))
        return out


class LeaderDecoder:
    """Rank 0's decoder: a ``BatchDecoder`` whose every step first sends the schedule. The
    same protocol as ``BatchDecoder`` (``add``, ``admit_step``, ``cycle_step``, ``step``,
    ``busy``, ``room``), so the scheduler and the server run on it unchanged."""

    def __init__(self, cluster, model, *, max_streams: int, carryover=None,
                 use_mtp: bool = True) -> None:
        self.cluster = cluster
        self.model = model
        self.inner = BatchDecoder(model, carryover=carryover, max_streams=max_streams,
                                  use_mtp=use_mtp, share=Decisions(cluster))
        # Rank 0 may step more than one decoder in turn (the scheduler's batch and the
        # background warm-up, engine.core.warmup): every message names its decoder, and each
        # follower keeps one decoder per key.
        self.key = next(_DECODER_KEYS)
        self._new: dict | None = {"max_streams": max_streams, "use_mtp": use_mtp}
        self._adds: list[dict] = []
        self._flags: dict[str, tuple[threading.Event | None, threading.Event]] = {}
        self._budgets: dict[str, int] = {}  # each running reply's budget, as last sent

    busy = property(lambda self: self.inner.busy)
    room = property(lambda self: self.inner.room)
    waiting = property(lambda self: self.inner.waiting)
    active = property(lambda self: self.inner.active)
    carryover = property(lambda self: self.inner.carryover)

    def add(self, prompt_ids, *, depth="auto", cancel: threading.Event | None = None,
            constraint=None, drafter=None, **kw):
        if drafter is not None:
            raise GenerationError("a model split across machines drafts with its MTP head "
                                  "only")
        if depth == "auto":
            depth = CLUSTER_AUTO_DEPTH if self.inner.batch.use_mtp else 0
        private = threading.Event()
        st = self.inner.add(prompt_ids, depth=depth, cancel=private, constraint=constraint,
                            **kw)
        params = kw.get("sampling") or SamplingParams()
        self._adds.append({
            "id": st.id, "prompt": [int(t) for t in prompt_ids], "depth": depth,
            "max_tokens": kw.get("max_tokens", 256), "sampling": asdict(params),
            "seed": kw.get("seed"), "stop": list(kw.get("stop_strings", ())),
            "draft_mode": kw.get("draft_mode", "filtered"),
            "grammar": getattr(constraint, "grammar", None)})
        self._flags[st.id] = (cancel, private)
        return st

    def _message(self) -> dict:
        cancel = [sid for sid, (outside, private) in self._flags.items()
                  if outside is not None and outside.is_set() and not private.is_set()]
        for sid in cancel:
            self._flags[sid][1].set()
        msg = {"dec": self.key, "add": self._adds, "cancel": cancel}
        cut = self._lowered_budgets()
        if cut:
            msg["budget"] = cut
        if self._new is not None:
            msg["new"], self._new = self._new, None
        self._adds = []
        return msg

    def _lowered_budgets(self) -> dict[str, int]:
        """Reply budgets lowered here since the last step (the scheduler's memory cut,
        ``engine.core.memory``), so every rank's copy of the reply ends at the same length."""
        out = {}
        for st in self.inner.active:
            b = st.reply.budget
            if self._budgets.setdefault(st.id, b) != b:
                self._budgets[st.id] = out[st.id] = b
        return out

    def admit_step(self):
        with self.cluster.watch("a step"):
            self.cluster.send_json(self._message())
            return self._forget(self.inner.admit_step())

    def cycle_step(self):
        with self.cluster.watch("a cycle"):
            return self._forget(self.inner.cycle_step())

    def step(self):
        return self.admit_step() + self.cycle_step()

    def close(self):
        with self.cluster.watch("closing"):
            self.cluster.send_json({"dec": self.key, "add": [], "cancel": [], "close": True})
            return self._forget(self.inner.close())

    def _forget(self, events):
        for st, ev in events:
            if ev.finish_reason is not None:
                self._flags.pop(st.id, None)
                self._budgets.pop(st.id, None)
        return events


def stop_followers(cluster) -> None:
    """Rank 0, when it is done: the other ranks leave ``follow``."""
    with cluster.watch("stopping"):
        cluster.send_json({"stop": True})


class FollowerDrafter:
    """A follower's drafts when only rank 0 keeps the MTP head (``--mtp-head rank0``,
    ``generate`` only): zeros of the right length (its verify runs on rank 0's drafts,
    ``Decisions.drafts``, its results are rank 0's, ``Decisions.results``, so what it
    proposes never matters). Not for serving: a follower without the head keeps prompt-cache
    snapshots that rank 0 would not resume from (their MTP cache is not in step), so the two
    could resume a conversation from different points and run different forwards."""

    def draft(self, request) -> Proposal:
        return Proposal(tokens=mx.zeros((request.k,), dtype=mx.int32), q=None)

    def undo(self, proposal: Proposal) -> None:
        pass


def follow(cluster, model, *, head_here: bool = True) -> None:
    """A rank other than 0: run rank 0's schedule until it says stop. ``head_here`` (the
    default): this rank keeps and runs its copy of the MTP head, so its decoder is the same
    program as rank 0's; False: ``FollowerDrafter`` (measuring only)."""
    decs: OrderedDict[int, tuple[BatchDecoder, dict[str, threading.Event]]] = OrderedDict()
    while True:
        msg = cluster.send_json(None)  # idle: waits for rank 0's next step
        if msg.get("stop"):
            return
        with cluster.watch("a step"):
            key = msg.get("dec", 0)
            if "new" in msg:
                new = msg["new"]
                decs[key] = (BatchDecoder(model, max_streams=new["max_streams"],
                                          use_mtp=new["use_mtp"] and head_here,
                                          share=Decisions(cluster)), {})
                while len(decs) > FOLLOWER_DECODERS:  # one rank 0 dropped without closing
                    decs.popitem(last=False)
            if key not in decs:
                raise ClusterError("rank 0 sent a step for a decoder this rank does not have")
            decs.move_to_end(key)
            dec, flags = decs[key]
            for a in msg["add"]:
                flags[a["id"]] = threading.Event()
                dec.add(a["prompt"], max_tokens=a["max_tokens"], depth=a["depth"],
                        sampling=SamplingParams(**a["sampling"]), seed=a["seed"],
                        cancel=flags[a["id"]], stop_strings=tuple(a["stop"]),
                        draft_mode=a["draft_mode"], id=a["id"],
                        drafter=None if head_here or not a["depth"] else FollowerDrafter(),
                        constraint=_constraint(model, a["grammar"]))
            for sid in msg["cancel"]:
                flags[sid].set()
            for st in dec.active:
                st.reply.budget = msg.get("budget", {}).get(st.id, st.reply.budget)
            if msg.get("close"):
                dec.close()
                del decs[key]
                continue
            for st, ev in dec.admit_step() + dec.cycle_step():
                if ev.finish_reason is not None:
                    flags.pop(st.id, None)


def _constraint(model, grammar: str | None):
    if grammar is None:
        return None
    from engine.sampling.grammar import Constraint, ll_tokenizer

    info = model.info
    eos = int(info.eos_token_ids[0])
    lt = _LL_TOKENIZERS.get(id(model))
    if lt is None:
        lt = _LL_TOKENIZERS[id(model)] = ll_tokenizer(model.tokenizer, info.vocab_size, eos)
    return Constraint.build(lt, grammar, vocab_size=info.vocab_size, eos=eos)
