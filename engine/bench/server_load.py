"""``python -m engine.bench.server_load``: what the server costs and what the prompt cache saves.

Prints (a benchmark, not a test; figures on a shared machine are noisy, so it reports medians):
1. One greedy stream through a real ``engine serve`` process (``/v1/completions``, SSE, read
   with httpx) against ``Model.generate`` in this process, same prompt and depth: decode
   tok/s as each consumer sees it (tokens after the first over the time from the first to the
   last), the ratio, and the time to first token each sees (the added TTFT is the server's
   HTTP + JSON + SSE + thread-hop cost).
   It also prints the overhead within each server request: the client's TTFT minus the
   engine's own prefill time for that request (the prefill itself varies run to run).
2. A second chat turn's TTFT through the server right after the first turn (the engine
   resumes the first turn's decode state: only the new suffix is prefilled) and after an
   unrelated request in between (the cache no longer holds that prefix: full prefill).

Options: ``--model PATH`` (default: the demo model), ``--tokens N``, ``--repeats R``,
``--depth auto|0..6``, ``--system-words W`` (size of turn 1's system prompt).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_client = None


def _start_server(model: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "engine", "serve", "--json", "--port", "0"]
    if model:
        cmd += ["--model", model]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise SystemExit("the server did not start")
    return proc, json.loads(line)["url"]


def _sse_stream(url: str, path: str, body: dict) -> tuple[float, list[float], dict]:
    """(ttft_s, arrival time of each text chunk, final mtp stats) as a client sees them."""
    import httpx

    global _client
    if _client is None:  # one keep-alive connection, as the official clients keep a pool
        _client = httpx.Client(timeout=120)
    t0 = time.perf_counter()
    times: list[float] = []
    stats: dict = {}
    with _client.stream("POST", url + path, json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            stats = obj.get("mtp", stats)
            ch = obj.get("choices") or [{}]
            text = ch[0].get("text") or (ch[0].get("delta") or {}).get("content") \
                or (ch[0].get("delta") or {}).get("reasoning_content")
            if text or (ch[0].get("delta") or {}).get("role"):
                times.append(time.perf_counter())
    return (times[0] - t0 if times else 0.0), times, stats


def _in_process(model, ids: list[int], tokens: int, depth) -> tuple[float, float, int]:
    from engine.types import SamplingParams

    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    for ev in model.generate(ids, max_tokens=tokens, depth=depth,
                             sampling=SamplingParams(temperature=0.0)):
        now = time.perf_counter()
        n += len(ev.token_ids)
        if ev.text:  # what a client can show, as the SSE client below counts it
            first = first or now
            last = now
    return first - t0, (n - 1) / (last - first) if last > first else 0.0, n


def _through_server(url: str, prompt: str, tokens: int, depth) -> tuple[float, float, int, float]:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "mtp": {"depth": depth}}
    ttft, times, stats = _sse_stream(url, "/v1/completions", body)
    n = stats.get("completion_tokens", len(times))
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return ttft, (n - 1) / span if span > 0 else 0.0, n, stats.get("ttft_s") or 0.0


PROMPTS = ("json.dumps", "The quick brown fox", "os.path.join", "re.sub", "shutil.copy",
           "collections.Counter", "itertools.chain", "math.floor")


def bench_stream(model, url: str, prompts: list[str], tokens: int, depth, repeats: int) -> dict:
    """Each repeat streams the next prompt both ways (new to both prompt caches: a full
    prefill each time, so the TTFTs compare like with like)."""
    def encode(p):
        return list(model.tokenizer.encode(p, add_special_tokens=False))

    _in_process(model, encode("warm up"), 8, depth)
    _through_server(url, "warm up", 8, depth)
    local, remote = [], []
    for i in range(repeats):
        p = prompts[i % len(prompts)] + (f" ({i})" if i >= len(prompts) else "")
        local.append(_in_process(model, encode(p), tokens, depth))
        remote.append(_through_server(url, p, tokens, depth))
    med = statistics.median
    out = {"tokens": sum(r[2] for r in local), "server_tokens": sum(r[2] for r in remote),
           "in_process_tok_s": med(r[1] for r in local), "server_tok_s": med(r[1] for r in remote),
           "in_process_ttft_ms": med(r[0] for r in local) * 1000,
           "server_ttft_ms": med(r[0] for r in remote) * 1000}
    out["ratio"] = out["server_tok_s"] / out["in_process_tok_s"]
    out["added_ttft_ms"] = out["server_ttft_ms"] - out["in_process_ttft_ms"]
    # The same request's client-side TTFT minus the engine's own prefill time: the server's
    # overhead without the run-to-run (and process-to-process) variation of the prefill.
    out["overhead_ms"] = med(r[0] - r[3] for r in remote) * 1000
    return out


def bench_second_turn(url: str, system_words: int, repeats: int) -> dict:
    system = " ".join(["The os module provides a portable way of using operating system "
                       "dependent functionality."] * max(1, system_words // 12))
    turn1 = [{"role": "system", "content": system},
             {"role": "user", "content": "What does os.path.join do?"}]
    chat = {"max_tokens": 32, "temperature": 0, "stream": True}
    warm, cold = [], []
    for i in range(repeats):
        reply = _reply_text(url, turn1)  # turn 1: the engine keeps its decode state
        turn2 = turn1 + [{"role": "assistant", "content": reply},
                         {"role": "user", "content": f"And json.dumps? ({i})"}]
        ttft_w, _, s_w = _sse_stream(url, "/v1/chat/completions", {**chat, "messages": turn2})
        _sse_stream(url, "/v1/completions", {"prompt": f"unrelated {i}", "max_tokens": 4,
                                             "stream": True})
        ttft_c, _, s_c = _sse_stream(url, "/v1/chat/completions", {**chat, "messages": turn2})
        warm.append((ttft_w, s_w.get("reused_prompt_tokens", 0), s_w.get("prompt_tokens", 0)))
        cold.append((ttft_c, s_c.get("reused_prompt_tokens", 0)))
    med = statistics.median
    return {"prompt_tokens": warm[0][2], "reused_tokens_warm": warm[0][1],
            "reused_tokens_cold": cold[0][1], "ttft_reuse_ms": med(w[0] for w in warm) * 1000,
            "ttft_no_reuse_ms": med(c[0] for c in cold) * 1000}


def _reply_text(url: str, messages: list[dict]) -> str:
    import httpx

    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": 32, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"] or ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.server_load", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--depth", default="auto")
    p.add_argument("--system-words", type=int, default=1200)
    p.add_argument("--prompt", action="append", default=None,
                   help="raw completion prompt (repeatable; default: a few the demo answers)")
    args = p.parse_args(argv)
    depth = args.depth if args.depth == "auto" else int(args.depth)

    import engine

    model = engine.load(args.model or engine.default_model_path())
    proc, url = _start_server(args.model)
    try:
        s = bench_stream(model, url, args.prompt or list(PROMPTS), args.tokens, depth,
                         args.repeats)
        print(f"one stream at a time, depth {depth}, {args.repeats} prompts ({s['tokens']} "
              f"tokens in all; server {s['server_tokens']}), medians:")
        print(f"  in-process {s['in_process_tok_s']:.1f} tok/s, through the server "
              f"{s['server_tok_s']:.1f} tok/s: ratio {s['ratio']:.3f} (goal >= 0.95)")
        print(f"  TTFT in-process {s['in_process_ttft_ms']:.1f} ms, through the server "
              f"{s['server_ttft_ms']:.1f} ms: added {s['added_ttft_ms']:.1f} ms (goal <= 15)")
        print(f"  server overhead in TTFT (client TTFT - the engine's prefill time, same "
              f"request): {s['overhead_ms']:.1f} ms")
        t = bench_second_turn(url, args.system_words, args.repeats)
        print(f"second chat turn ({t['prompt_tokens']} prompt tokens), median of {args.repeats}:")
        print(f"  with prompt-cache reuse ({t['reused_tokens_warm']} tokens reused): TTFT "
              f"{t['ttft_reuse_ms']:.1f} ms")
        print(f"  without (an unrelated request in between, {t['reused_tokens_cold']} reused): "
              f"TTFT {t['ttft_no_reuse_ms']:.1f} ms")
    finally:
        proc.send_signal(2)
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
