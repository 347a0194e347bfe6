"""The lock-step protocol in one process, on a stand-in for the cluster that records rank 0's
messages and shares what rank 0 passes (a cluster of one): the leader's decoder decodes
exactly as the plain decoder does, every step sends one small message, and a request
cancelled between steps is cancelled through the message."""
from __future__ import annotations

import contextlib
import json
import threading

import mlx.core as mx

from engine.distributed.cluster import HEADER
from engine.distributed.lockstep import LeaderDecoder
from engine.types import SamplingParams


class OneRank:
    rank, size, mode = 0, 1, "tensor"

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.shared = 0

    def send_json(self, msg):
        self.sent.append(json.loads(json.dumps(msg)))
        return self.sent[-1]

    def share(self, a):
        self.shared += 1
        return a

    def share_ints(self, values):
        self.shared += 1
        return list(mx.array(values, dtype=mx.int32).tolist())

    def watch(self, what):
        return contextlib.nullcontext()


def _run(dec):
    out: dict[str, list[int]] = {}
    while dec.busy:
        for st, ev in dec.step():
            out.setdefault(st.id, []).extend(ev.token_ids)
    return out


def test_the_leaders_decoder_is_exact_and_sends_one_small_message_a_step(tiny_model):
    prompts = [[5, 17, 42, 99, 3], [200, 31, 7]]
    cluster = OneRank()
    dec = LeaderDecoder(cluster, tiny_model, max_streams=4)
    ids = [dec.add(p, max_tokens=20, depth=d).id for p, d in zip(prompts, (3, 0))]
    sampled = dec.add(prompts[0], max_tokens=16, depth=2, seed=5,
                      sampling=SamplingParams(temperature=0.9)).id
    got = _run(dec)
    for sid, p, d in zip(ids, prompts, (3, 0)):
        want = [t for ev in tiny_model.generate(p, max_tokens=20, depth=d) for t in ev.token_ids]
        assert got[sid] == want
    want = [t for ev in tiny_model.generate(prompts[0], max_tokens=16, depth=2, seed=5,
                                            sampling=SamplingParams(temperature=0.9))
            for t in ev.token_ids]
    assert got[sampled] == want
    first, rest = cluster.sent[0], cluster.sent[1:]
    assert first["new"] == {"max_streams": 4, "use_mtp": True}
    assert [a["id"] for a in first["add"]] == ids + [sampled]
    assert first["add"][2]["seed"] == 5 and first["add"][2]["sampling"]["temperature"] == 0.9
    assert rest and all(m == {"dec": first["dec"], "add": [], "cancel": []} for m in rest)
    assert all(len(json.dumps(m, separators=(",", ":"))) <= HEADER - 4 for m in rest)
    assert cluster.shared >= len(cluster.sent)  # first tokens, drafts, decisions


def test_auto_depth_is_fixed_and_a_cancel_goes_through_the_message(tiny_model):
    cluster = OneRank()
    dec = LeaderDecoder(cluster, tiny_model, max_streams=2)
    cancel = threading.Event()
    st = dec.add([5, 17, 42], max_tokens=200, cancel=cancel)
    assert cluster.sent == [] and st.depth == 3  # "auto": the controller times cycles
    events = dec.step() + dec.step()
    cancel.set()
    while dec.busy:
        events += dec.step()
    assert events[-1][1].finish_reason == "cancelled"
    assert [m["cancel"] for m in cluster.sent if m["cancel"]] == [[st.id]]


def test_a_budget_cut_on_rank_0_goes_through_the_message(tiny_model):
    """The scheduler's memory cut lowers a running reply's budget on rank 0 between steps;
    the next message carries it (once), so every rank's copy ends at the same length."""
    cluster = OneRank()
    dec = LeaderDecoder(cluster, tiny_model, max_streams=2)
    st = dec.add([5, 17, 42], max_tokens=200, depth=2)
    events = dec.step() + dec.step()
    cut_at = len(st.reply.generated) + 1
    st.reply.budget = cut_at
    while dec.busy:
        events += dec.step()
    assert events[-1][1].finish_reason == "length"
    assert sum(len(ev.token_ids) for _, ev in events) == cut_at
    assert [m["budget"] for m in cluster.sent if "budget" in m] == [{st.id: cut_at}]
