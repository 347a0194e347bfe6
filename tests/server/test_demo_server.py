"""The real server process serving the demo model, driven by the official ``openai`` and
``anthropic`` clients: outputs equal in-process greedy generation, usage equals token counts,
stop sequences, depth 0 == auto, 8 concurrent clients, disconnects, bad requests, the prompt
cache across turns, and a SIGINT drain (last: it stops the module's server)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from engine.types import SamplingParams
from tests.server.conftest import ROOT

pytestmark = pytest.mark.timeout(120)

Q = "What does os.path.join do?"


def greedy(model, ids, *, max_tokens, depth="auto", stop=()):
    text, tokens, finish = "", [], None
    for ev in model.generate(ids, max_tokens=max_tokens, depth=depth, stop_strings=tuple(stop),
                             sampling=SamplingParams(temperature=0.0)):
        text += ev.text
        tokens += ev.token_ids
        finish = ev.finish_reason or finish
    return text, tokens, finish


@pytest.fixture(scope="module")
def oai(demo_server):
    import openai

    with openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0) as client:  # closed at teardown: no socket left to the GC
        yield client


@pytest.fixture(scope="module")
def anth(demo_server):
    import anthropic

    with anthropic.Anthropic(base_url=demo_server.url, api_key="x", max_retries=0) as client:
        yield client


def _chat(oai, content=Q, **kw):
    kw.setdefault("max_tokens", 48)
    return oai.chat.completions.create(
        model="mtp-demo-qwen3_5", temperature=0, messages=[{"role": "user", "content": content}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, **kw.pop("extra", {})},
        **kw)


def test_models_list_loaded_first(oai):
    ids = [m.id for m in oai.models.list().data]
    assert ids[0] == "mtp-demo-qwen3_5"


def test_chat_greedy_equals_in_process_and_usage_counts(oai, reference):
    ids = reference.chat_ids([{"role": "user", "content": Q}], enable_thinking=False)
    text, tokens, finish = greedy(reference, ids, max_tokens=48)
    r = _chat(oai)
    assert r.choices[0].message.content == text.lstrip("\n")
    assert r.choices[0].finish_reason == {"stop": "stop", "length": "length"}[finish]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(tokens))
    assert r.model_extra["mtp"]["tokens_per_cycle"] > 0


def test_chat_stream_equals_non_stream_with_usage(oai):
    full = _chat(oai).choices[0].message.content
    chunks = list(_chat(oai, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert "acceptance_by_position" in chunks[-2].model_extra["mtp"]


def test_completions_equal_in_process(oai, reference):
    prompt = "def hello(name):"
    text, tokens, _ = greedy(reference, reference.tokenizer.encode(prompt, add_special_tokens=False),
                             max_tokens=32)
    r = oai.completions.create(model="mtp-demo-qwen3_5", prompt=prompt, max_tokens=32, temperature=0)
    assert r.choices[0].text == text and r.usage.completion_tokens == len(tokens)
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model="mtp-demo-qwen3_5", prompt=prompt, max_tokens=32, temperature=0, stream=True)
        if c.choices)
    assert streamed == text


def test_depth_zero_and_auto_and_two_give_identical_greedy_text(oai):
    texts = {d: _chat(oai, max_tokens=64, extra={"mtp": {"depth": d}}).choices[0].message.content
             for d in (0, "auto", 2)}
    assert texts[0] == texts["auto"] == texts[2]


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag"],
          "properties": {"ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tag": {"type": "string", "maxLength": 12}}}


def _valid(doc: dict) -> bool:
    return (set(doc) == {"ok", "n", "tag"} and isinstance(doc["ok"], bool)
            and isinstance(doc["n"], int) and 0 <= doc["n"] <= 999 and len(doc["tag"]) <= 12)


def test_structured_output_validates_and_speculation_does_not_change_it(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
    texts = {}
    for d in (0, 2):
        r = _chat(oai, max_tokens=96, response_format=fmt, extra={"mtp": {"depth": d}})
        texts[d] = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop" and _valid(json.loads(texts[d])), texts[d]
    assert texts[0] == texts[2]
    for seed in range(3):  # sampled, speculating: still valid every time
        r = oai.chat.completions.create(
            model="mtp-demo-qwen3_5", temperature=0.9, seed=seed, max_tokens=96,
            messages=[{"role": "user", "content": Q}], response_format=fmt,
            extra_body={"mtp": {"depth": 2}})
        assert _valid(json.loads(r.choices[0].message.content)), r.choices[0].message.content
    obj = _chat(oai, max_tokens=96, response_format={"type": "json_object"}).choices[0]
    assert obj.message.content.startswith("{")  # unconstrained, this reply is prose
    if obj.finish_reason == "stop":  # (the tiny model may run out of tokens inside a string)
        assert isinstance(json.loads(obj.message.content), dict)


def test_stop_sequences(oai, anth, reference):
    ids = reference.chat_ids([{"role": "user", "content": Q}], enable_thinking=False)
    text, _, _ = greedy(reference, ids, max_tokens=48)
    stop = text.lstrip("\n")[10:14]
    r = _chat(oai, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text.lstrip("\n")[:10]
    m = anth.messages.create(model="claude-local", max_tokens=48, extra_body={"temperature": 0},
                             stop_sequences=[stop], thinking={"type": "disabled"},
                             messages=[{"role": "user", "content": Q}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text.lstrip("\n")[:10]


def test_messages_non_stream_and_stream(anth, reference):
    ids = reference.chat_ids([{"role": "user", "content": Q}], enable_thinking=False)
    text, tokens, _ = greedy(reference, ids, max_tokens=40)
    kw = dict(model="claude-local", max_tokens=40, extra_body={"temperature": 0},
              thinking={"type": "disabled"},
              messages=[{"role": "user", "content": Q}])
    m = anth.messages.create(**kw)
    assert m.content[0].text == text.lstrip("\n")
    assert (m.usage.input_tokens, m.usage.output_tokens) == (len(ids), len(tokens))
    with anth.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == m.content[0].text
    assert final.usage.output_tokens == len(tokens)


def test_eight_concurrent_clients_all_correct(demo_server, reference):
    prompts = [f"What does {m} do?" for m in
               ("json.dumps", "os.path.join", "re.sub", "math.floor", "time.sleep",
                "random.choice", "shutil.copy", "glob.glob")]
    want = []
    for p in prompts:
        ids = reference.chat_ids([{"role": "user", "content": p}], enable_thinking=False)
        want.append(greedy(reference, ids, max_tokens=24)[0].lstrip("\n"))
    got: dict[int, str] = {}
    batched: list[int] = []

    def ask(i):
        r = httpx.post(demo_server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": prompts[i]}], "max_tokens": 24,
            "temperature": 0, "enable_thinking": False, "stream": i % 2 == 1})
        if i % 2:
            lines = [json.loads(x[6:]) for x in r.text.splitlines()
                     if x.startswith("data: {")]
            got[i] = "".join(c["choices"][0]["delta"].get("content") or ""
                             for c in lines if c["choices"])
        else:
            got[i] = r.json()["choices"][0]["message"]["content"]
            batched.append(r.json()["mtp"]["batch_max"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert [got.get(i) for i in range(8)] == want
    assert max(batched) >= 2, batched  # the requests were decoded together (engine.decoding)


def test_client_disconnect_frees_the_engine(demo_server, oai):
    with httpx.stream("POST", demo_server.url + "/v1/completions", timeout=60, json={
            "prompt": "Once upon a time", "max_tokens": 4000, "stream": True,
            "temperature": 0.8, "mtp": {"depth": 0}}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
    t0 = time.perf_counter()
    r = _chat(oai, max_tokens=8)
    assert time.perf_counter() - t0 < 3.0  # 4000 tokens would take ~15 s
    assert r.model_extra["mtp"]["queued_s"] < 1.0


def test_second_turn_reuses_the_prompt_cache(oai, reference):
    first = [{"role": "user", "content": Q}]
    p1 = reference.chat_ids(first)
    r1 = oai.chat.completions.create(model="mtp-demo-qwen3_5", temperature=0, max_tokens=40,
                                     messages=first)
    turn2 = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And json.dumps?"}]
    r2 = oai.chat.completions.create(model="mtp-demo-qwen3_5", temperature=0, max_tokens=8,
                                     messages=turn2)
    assert r2.model_extra["mtp"]["reused_prompt_tokens"] >= len(p1)
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(p1)


def test_bad_requests_are_4xx_and_the_server_stays_up(demo_server, oai):
    import openai

    url = demo_server.url
    assert httpx.post(url + "/v1/chat/completions", content=b"{oops",
                      headers={"content-type": "application/json"}).status_code == 400
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="mtp-demo-qwen3_5", top_p=3,
                                    messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as err:  # longer than the 8192-token context
        oai.completions.create(model="mtp-demo-qwen3_5", prompt=[5] * 9000, max_tokens=4)
    assert "context" in str(err.value)
    r = httpx.post(url + "/v1/messages", json={"model": "claude-x", "max_tokens": 5,
                                               "messages": "nope"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert _chat(oai, max_tokens=4).choices[0].message.content


def test_non_loopback_bind_without_key_is_refused(tmp_path):
    p = subprocess.run([sys.executable, "-m", "engine", "serve", "--host", "0.0.0.0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT), "MTPCHAT_HOME": str(tmp_path),
                            "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "--api-key" in p.stderr


def test_zz_sigint_drains_streams_then_exits_zero(demo_server):
    """Last in the module: it stops the shared server."""
    lines: list[str] = []

    def read():
        with httpx.stream("POST", demo_server.url + "/v1/completions", timeout=60, json={
                "prompt": "Once upon a time", "max_tokens": 4000, "stream": True,
                "temperature": 0.8}) as r:
            for line in r.iter_lines():
                lines.append(line)

    t = threading.Thread(target=read)
    t.start()
    while len(lines) < 4:
        time.sleep(0.01)
    rc = demo_server.stop()
    time.sleep(0.2)
    assert rc == 0, "".join(demo_server.stderr)[-3000:]
    t.join(10)
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    if "error" in events[-1]:  # cancelled by the drain after 1 s: said so, not "stop"
        assert events[-1]["error"]["code"] == "cancelled" and "data: [DONE]" not in lines
    else:  # or it ended on its own before that
        assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
        assert events[-1]["mtp"]["finish_reason"] == "stop"
