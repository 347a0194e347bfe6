"""A model split across two ranks on 127.0.0.1 (ring backend, CPU), served by
``engine serve --hostfile``: its replies equal the single-process engine's token for token
(greedy at depths 0-3, seeded sampling, four streams batched), structured output stays valid,
and a rank that dies mid-reply ends the reply with a clear error within 10 s.

The default run: tensor parallel on the tiny dense model and pipeline parallel on the demo
model; ``-m slow`` runs every model (demo, tiny dense, tiny MoE) in both splits."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import pytest

from tests.engine.distributed.cluster import ClusterServer, completion, reference
from tests.tinymodels import build_tiny_model

pytestmark = pytest.mark.timeout(400)

PROMPTS = [[5, 17, 42, 99, 3], [200, 31, 7], [11, 12, 13, 14, 15, 16, 17, 18], [64, 9]]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine import default_model_path

    root = tmp_path_factory.mktemp("cluster-models")
    return {"demo": default_model_path(),
            "dense": build_tiny_model(root / "dense", seed=3),
            "moe": build_tiny_model(root / "moe", moe=True, seed=4)}


def _loaded(path):
    import engine

    return engine.load(path)


def check_cluster(tmp_path, path, split: str, *, depths=(0, 1, 2, 3), full: bool = True,
                  kill: bool = False, freeze: bool = False):
    """Every check of the issue on one (model, split): greedy depths, seeded sampling, four
    batched streams, structured output; then, with ``kill``, a rank killed mid-reply, with
    ``freeze``, a rank that stops answering (SIGSTOP: no socket closes, as an unplugged
    host)."""
    model = _loaded(path)
    # a generous watchdog, unless the freeze check needs its error within 10 s: on a loaded
    # 2-core machine a healthy step has taken over 6 s (the watchdog's own thread was late)
    srv = ClusterServer(tmp_path, path, split=split, step_timeout=5.0 if freeze else 30.0)
    try:
        _check_chat_turns(srv, model)
        for depth in depths:
            for ids in PROMPTS[:2]:
                got = srv.post("/v1/completions", completion(ids, depth=depth))
                assert "choices" in got, (got, srv.text()[-1500:])
                assert got["choices"][0]["text"] == reference(model, ids, depth=depth), \
                    (split, depth, ids)
        if full:
            _check_sampled(srv, model, split)
            _check_batched(srv, model)
            _check_structured(srv)
        if kill:
            _check_kill(srv)
        if freeze:
            _check_frozen(srv)
    finally:
        srv.close()


def _check_sampled(srv, model, split: str) -> None:
    for depth in (0, 3):
        body = completion(PROMPTS[0], depth=depth, temperature=0.9, seed=7, top_p=1.0)
        got = srv.post("/v1/completions", body)
        want = reference(model, PROMPTS[0], depth=depth, temperature=0.9, seed=7)
        assert got["choices"][0]["text"] == want, ("seeded", split, depth)


def _check_batched(srv, model) -> None:
    """Four streams at once (depths 0-3, one of them seeded sampling) decode together and
    each equals its own single-process reply."""
    bodies = [completion(ids, depth=d, max_tokens=20) for d, ids in enumerate(PROMPTS)]
    bodies[2].update(temperature=0.8, seed=11, top_p=1.0)
    out: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, srv.post("/v1/completions", bodies[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    batched = max(r["mtp"].get("batch_max", 1) for r in out.values())
    for i, ids in enumerate(PROMPTS):
        want = reference(model, ids, depth=i, max_tokens=20,
                         temperature=0.8 if i == 2 else 0.0, seed=11 if i == 2 else None)
        assert out[i]["choices"][0]["text"] == want, ("batched", i)
    assert batched > 1, "the four requests never shared a batch"


def _check_chat_turns(srv, model) -> None:
    """Two turns of a chat (the second resumes the first's prompt-cache checkpoint, before
    the template's generation prompt), as the background warm-up interleaves its own
    decoder's steps with the requests': each reply equals the single-process one. Both hung
    a pipeline cluster once (its ranks ran different forwards: the warm-up's steps went to
    the followers' request decoder, and the checkpoint's prefix forward was never evaluated
    on the rank it had to send from)."""
    msgs = [{"role": "user", "content": "What does os.path.join do?"}]
    for turn in range(2):
        body = {"messages": msgs, "max_tokens": 24, "temperature": 0, "mtp": {"depth": 3},
                "chat_template_kwargs": {"enable_thinking": False}}
        got = srv.post("/v1/chat/completions", body)
        assert "choices" in got, (turn, got, srv.text()[-1500:])
        ids = model.chat_ids(msgs, enable_thinking=False, add_generation_prompt=True)
        want = reference(model, list(ids), depth=0)
        text = got["choices"][0]["message"]["content"]
        assert text.strip() == want.strip(), (turn, text, want)
        msgs = msgs + [{"role": "assistant", "content": text},
                       {"role": "user", "content": "And os.path.split?"}]


def _check_structured(srv) -> None:
    got = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r",
                                                                   "schema": SCHEMA}}})
    doc = json.loads(got["choices"][0]["message"]["content"])
    assert set(doc) == {"ok"} and isinstance(doc["ok"], bool)


def test_tensor_parallel_tiny_dense_is_exact_and_survives_a_killed_rank(tmp_path, models):
    """The default run's representative: every check, then a rank killed mid-reply (the
    tiny random model writes long replies)."""
    check_cluster(tmp_path, models["dense"], "tensor", depths=(0, 2, 3), kill=True)


def test_pipeline_parallel_demo_greedy_depths(tmp_path, models):
    check_cluster(tmp_path, models["demo"], "pipeline", depths=(0, 1, 3), full=False,
                  freeze=True)


@pytest.mark.slow
@pytest.mark.parametrize("split", ["tensor", "pipeline"])
@pytest.mark.parametrize("name", ["demo", "dense", "moe"])
def test_every_model_and_split_is_exact(tmp_path, models, name, split):
    check_cluster(tmp_path, models[name], split)


def _check_kill(srv) -> None:
    """A rank killed mid-reply: the client gets an error naming the cluster within 10 s,
    and the whole cluster exits (nothing hangs)."""
    events, ended = _stream(srv, {"prompt": PROMPTS[0], "max_tokens": 3000,
                                  "temperature": 0.8, "stream": True})
    deadline = time.monotonic() + 60
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(events) >= 3 and not ended.is_set(), srv.text()[-2000:]
    os.kill(srv.rank_pid(1), signal.SIGKILL)
    killed = time.monotonic()
    assert ended.wait(10), "the client got nothing within 10 s"
    assert time.monotonic() - killed < 10
    errors = [e for e in events if "error" in e]
    assert errors and "cluster" in errors[-1]["error"]["message"], events[-2:]
    srv.proc.wait(20)  # the launcher and rank 0 end


def _check_frozen(srv) -> None:
    """A rank that stops answering without closing its sockets: the request ends with the
    watchdog's error within 10 s (``--step-timeout`` 6 s) and rank 0 exits."""
    os.kill(srv.rank_pid(1), signal.SIGSTOP)
    t0 = time.monotonic()
    got = srv.post("/v1/completions", completion(PROMPTS[0], depth=2), timeout=30)
    assert time.monotonic() - t0 < 10
    assert got.get("status") == 503 and "no answer" in got["error"]["message"], got
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            srv.rank_pid(0)
        except AssertionError:
            return
        time.sleep(0.2)
    raise AssertionError("rank 0 did not exit")


def _stream(srv, body):
    """Read an SSE completion on a thread: (its parsed events so far, set when it ends)."""
    events: list[dict] = []
    ended = threading.Event()

    def read():
        req = urllib.request.Request(
            f"http://127.0.0.1:{srv.port}/v1/completions",
            data=json.dumps({"model": srv.model_id, **body}).encode(),
            headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        events.append(json.loads(line[6:]))
        except OSError as exc:
            events.append({"error": {"message": f"connection: {exc}"}})
        finally:
            ended.set()
    threading.Thread(target=read, daemon=True).start()
    return events, ended
