"""``python -m engine.bench.cold_start``: what a fresh server costs its first users.

Each round starts fresh ``engine serve`` processes (``--port 0``) in alternating order, with
the background warm-up on (``engine.core.warmup``) and off (``MTP_WARMUP=0``), and measures
through HTTP (``/v1/chat/completions``, SSE, greedy):

1. Bursts: ``--streams`` requests sent at once right after the server says it listens (the
   *first* burst), then the same requests one at a time, then the burst twice more (*warm*).
   Aggregate tok/s = all tokens / the burst's wall time. Ratios: first burst / warm burst
   (goal >= 0.9) and first burst / one at a time (goal >= 2).
   ``settled``: a third server with the warm-up on whose first burst waits until ``/health``
   says the warm-up finished (what a server started a few seconds before its users sees).
   Every phase sends the same questions, so every phase decodes the same greedy replies (the
   demo's acceptance differs from one question to the next, even with a tag in front: phases
   of different questions compared their replies as much as the server's warmth), and before
   each phase but the first ``flush`` sends as many other requests, which push the phase's
   questions out of the prompt cache (it keeps one conversation per stream of the largest
   batch it has run; prompts this short never reach the disk cache): every phase prefills as
   much as the first. The token counts of the phases are printed; they must be equal.
2. Replies: a server's first ``--depth`` reply right after it listens against the same
   question asked twice more, each after a ``flush`` (decode tok/s: tokens after the first
   over the time from the first to the last; goal: the first >= 0.9 x the warm ones).

Every server gets a new empty ``MTPCHAT_HOME`` (``--keep-home``: the environment's), so each
is a first start on the machine: before, the ``off`` server read the warm-up figures the ``on``
server of the same round had saved, and its first burst looked better for it.

Prints medians over ``--rounds`` and the per-round figures. Fresh processes load the model
each time (seconds each): keep ``--rounds`` small on a loaded machine, where every figure is
noisy; the interleaving (on/off in alternating order) is what makes the ratios comparable.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ("Write a Python function that reverses a list, with a docstring.",
             "Explain what os.path.join does, with an example.",
             "Write a Python class for a stack with push and pop.",
             "How do I read a JSON file in Python? Show code.",
             "Write a function that counts words in a string.",
             "Explain list comprehensions with two examples.",
             "Write a Python function that checks for a palindrome.",
             "How do I sort a dict by value in Python?")


def start_server(model: str | None, warmup: bool, extra: list[str] = (),
                 home: str | None = None) -> tuple:
    """(process, url) of a fresh ``engine serve``, returned once it listens; ``home``: its
    ``MTPCHAT_HOME`` (default: the environment's)."""
    cmd = [sys.executable, "-m", "engine", "serve", "--json", "--port", "0", *extra]
    if model:
        cmd += ["--model", model]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MTP_WARMUP="1" if warmup else "0")
    if home is not None:
        env["MTPCHAT_HOME"] = home
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise SystemExit("the server did not start")
    started = json.loads(line)
    if "url" not in started:  # its one-line refusal (it has said why on stderr too)
        proc.wait(30)
        raise SystemExit(f"the server did not start: {started.get('message', line.strip())}")
    return proc, started["url"]


def stop_server(proc) -> None:
    proc.send_signal(2)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def clients(n: int) -> list:
    """``n`` HTTP clients, made before a phase's clock starts: making one costs ~20 ms of TLS
    set-up in this process (on the cores the server uses), which a measured phase must not
    count, and a real client keeps its connection."""
    import httpx

    return [httpx.Client(timeout=300) for _ in range(n)]


def stream_chat(client, url: str, question: str, tokens: int, depth
                ) -> tuple[float, float, int, float]:
    """(send time, first token time, tokens, last token time) of one streamed greedy reply."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "mtp": {"depth": depth}}
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            n = (obj.get("mtp") or {}).get("completion_tokens", n)
            delta = ((obj.get("choices") or [{}])[0].get("delta") or {})
            if delta.get("content") or delta.get("reasoning_content"):
                now = time.perf_counter()
                first = first or now
                last = now
    return t0, first, n, last


def burst(url: str, questions: list[str], tokens: int, depth) -> tuple[float, int]:
    """(aggregate tok/s, tokens) of ``questions`` sent at once."""
    out: list = [None] * len(questions)
    made = clients(len(questions))

    def one(i: int) -> None:
        out[i] = stream_chat(made[i], url, questions[i], tokens, depth)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(questions))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in made:
        c.close()
    n = sum(r[2] for r in out)
    return n / (max(r[3] for r in out) - t0), n


def sequential(url: str, questions: list[str], tokens: int, depth) -> tuple[float, int]:
    """(tok/s, tokens) of ``questions`` sent one at a time."""
    made = clients(len(questions))
    t0 = time.perf_counter()
    n = sum(stream_chat(c, url, q, tokens, depth)[2] for c, q in zip(made, questions))
    rate = n / (time.perf_counter() - t0)
    for c in made:
        c.close()
    return rate, n


def decode_rate(url: str, question: str, tokens: int, depth) -> tuple[float, int]:
    """(decode tok/s, tokens) of one reply."""
    client = clients(1)[0]
    with client:
        _, first, n, last = stream_chat(client, url, question, tokens, depth)
    return ((n - 1) / (last - first) if last > first and n > 1 else 0.0), n


def flush(url: str, n: int) -> None:
    """``n`` other one-token requests at once: the prompt cache keeps one conversation per
    stream of the largest batch the server has run, so these push out what came before."""
    burst(url, tagged("flush", n), 1, 0)


def wait_warm(url: str, timeout: float = 300.0) -> float:
    """Seconds until ``/health`` reports the warm-up finished."""
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        warm = httpx.get(url + "/health", timeout=10).json().get("warmup")
        if not warm or warm.get("finished"):
            break
        time.sleep(0.2)
    return time.perf_counter() - t0


def tagged(tag: str, n: int) -> list[str]:
    """``n`` questions that start with ``tag``: new to the server's prompt cache, so every
    phase prefills as much as the first burst does."""
    return [f"({tag}) {QUESTIONS[i % len(QUESTIONS)]}" for i in range(n)]


def asked(n: int) -> list[str]:
    """The ``n`` questions every phase asks."""
    return [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]


def _home(args) -> str | None:
    """A new empty ``MTPCHAT_HOME`` for one server (``--keep-home``: the environment's): a
    server must not start from the warm-up figures (``warmup.json``) or prompt cache an
    earlier server of the run left, or ``off`` would measure the ``on`` server's warm-up."""
    return None if args.keep_home else tempfile.mkdtemp(prefix="mtpchat-cold-")


def burst_round(model, mode: str, args) -> dict:
    n = args.streams
    home = _home(args)
    proc, url = start_server(model, mode != "off", ["--max-streams", str(n)], home)
    try:
        waited = wait_warm(url) if mode == "settled" else 0.0
        qs, counts, warms = asked(n), [], []
        first, k = burst(url, qs, args.tokens, args.burst_depth)
        counts.append(k)
        flush(url, n)
        seq, k = sequential(url, qs, args.tokens, args.burst_depth)
        counts.append(k)
        for _ in range(2):
            flush(url, n)
            rate, k = burst(url, qs, args.tokens, args.burst_depth)
            warms.append(rate)
            counts.append(k)
        warm = statistics.median(warms)
    finally:
        stop_server(proc)
        if home:
            shutil.rmtree(home, ignore_errors=True)
    return {"mode": mode, "first": first, "sequential": seq, "warm": warm, "waited_s": waited,
            "first/warm": first / warm, "first/sequential": first / seq, "tokens": counts}


def reply_round(model, mode: str, args) -> dict:
    home = _home(args)
    proc, url = start_server(model, mode != "off", ["--max-streams", str(args.streams)], home)
    try:
        q = asked(1)[0]
        first, k = decode_rate(url, q, args.tokens, args.depth)
        counts, warms = [k], []
        for _ in range(2):
            flush(url, 1)
            rate, k = decode_rate(url, q, args.tokens, args.depth)
            warms.append(rate)
            counts.append(k)
        warm = statistics.median(warms)
    finally:
        stop_server(proc)
        if home:
            shutil.rmtree(home, ignore_errors=True)
    return {"mode": mode, "first": first, "warm": warm, "first/warm": first / warm,
            "tokens": counts}


def _print(title: str, rows: list[dict], keys: tuple[str, ...]) -> None:
    print(title)
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        med = {k: statistics.median(r[k] for r in mine) for k in keys}
        print(f"  warm-up {mode:8s} median of {len(mine)}: " +
              ", ".join(f"{k} {med[k]:.2f}" for k in keys))
        for r in mine:
            print("      " + ", ".join(f"{k} {r[k]:.2f}" for k in keys))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.cold_start",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--depth", type=int, default=3, help="the replies' fixed depth")
    p.add_argument("--burst-depth", default="auto", help="the bursts' depth (auto or 0..6)")
    p.add_argument("--skip-replies", action="store_true")
    p.add_argument("--skip-bursts", action="store_true")
    p.add_argument("--keep-home", action="store_true",
                   help="every server uses the environment's MTPCHAT_HOME (its saved warm-up "
                        "figures and prompt cache) instead of a new empty one")
    args = p.parse_args(argv)
    if args.burst_depth != "auto":
        args.burst_depth = int(args.burst_depth)
    bursts, replies = [], []
    for r in range(args.rounds):
        modes = ("on", "off", "settled") if r % 2 == 0 else ("off", "on", "settled")
        for mode in modes:
            if not args.skip_bursts:
                bursts.append(burst_round(args.model, mode, args))
                print(f"round {r + 1} burst {mode}: " + json.dumps(
                    {k: round(v, 2) if isinstance(v, float) else v
                     for k, v in bursts[-1].items()}), flush=True)
            if not args.skip_replies and mode != "settled":
                replies.append(reply_round(args.model, mode, args))
                print(f"round {r + 1} reply {mode}: " + json.dumps(
                    {k: round(v, 2) if isinstance(v, float) else v
                     for k, v in replies[-1].items()}), flush=True)
    if bursts:
        _print(f"{args.streams}-stream bursts, {args.tokens} tokens each, depth "
               f"{args.burst_depth} (aggregate tok/s; goals: first/warm >= 0.9, "
               "first/sequential >= 2):", bursts,
               ("first", "warm", "sequential", "first/warm", "first/sequential", "waited_s"))
    if replies:
        _print(f"first depth-{args.depth} reply of a fresh server vs its next ones (decode "
               "tok/s; goal first/warm >= 0.9):", replies, ("first", "warm", "first/warm"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
