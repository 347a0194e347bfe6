"""``python -m engine.bench.agent_session``: a coding-agent session replayed through two servers.

Each turn resends the whole conversation so far (system prompt, the user's task, then per turn
the assistant's reply with a tool call, the tool's result — a file listing or a source file —
and a follow-up user message) to ``/v1/chat/completions`` (SSE, greedy), first to this engine's
``engine serve`` and then to mlx-lm's own ``mlx_lm.server`` (which keeps a prompt cache) on the
same weights, alternating which goes first each turn. Per turn it prints the prompt size,
time to first token and decode tok/s (tokens after the first over the time from the first to
the last) of each, and their ratios (goals: TTFT <= 1.2x mlx-lm's, decode >= 1.5x). The
first turn starts once this engine's background warm-up has finished (``/health``).

The assistant turns are fixed text (not the model's replies), so both servers see the same
conversation and the prompt grows the same way: ``--turns`` turns, each tool result about
``--result-words`` words, ``--reply-tokens`` tokens generated per turn.
``--depth`` fixes this engine's depth (default auto), ``--plain`` also runs every turn at
depth 0 on a second ``engine serve`` of its own and prints the speed-up (each turn there is
a first request too, with the turn's new part to prefill: in process, on turns 3-16, the
second of two requests for the same prompt decoded ~3 % faster than the first whichever depth
went first, so a rerun from the compared turn's prompt cache made ``auto`` look slower than
depth 0 than it is), ``--context``
runs on a copy of the model whose config allows that many positions (the demo's says 8192),
``--repeats N`` sends each turn N times to every server (TTFT from the first, decode tok/s the
median: one 32-token reply varies by up to ±25 % on a shared 2-core machine).
``--content docs`` replays the demo's own kind of session instead (``doc_conversation``:
``python_doc`` calls and results, each turn a held-out name; the demo answers those right only
up to ~2k tokens, docs/benchmarks.md).
Example: ``python -m engine.bench.agent_session --turns 30 --result-words 700 --context 40000
--depth 3 --plain`` (~32k tokens at the last turn on the demo).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from engine.bench.cold_start import ROOT, start_server, stop_server, wait_warm

SYSTEM = ("You are a coding agent. Use the tools read_file and list_dir to inspect the "
          "repository, then answer. Keep answers short.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Runs a peer's module as ``python -m`` would, after loading the BLAS this engine loads: on
# Linux a bare ``python -m mlx_lm.server`` multiplies with MLX's reference BLAS, several times
# slower than the OpenBLAS this engine runs on (a fair table gives both the same products).
PEER_LAUNCH = ("import runpy, sys; from engine import _blas; _blas.ensure_fast_blas(); "
               "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', "
               "alter_sys=True)")


def peer_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` on this engine's BLAS."""
    return [sys.executable, "-c", PEER_LAUNCH, module, *args]


def start_mlx_lm(model: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(peer_command("mlx_lm.server", "--model", model, "--port", str(port),
                                         "--host", "127.0.0.1"), cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"mlx_lm.server exited (status {proc.returncode}) before it "
                             "listened: is mlx-lm installed, and does it load this model?")
        try:
            httpx.get(url + "/v1/models", timeout=2)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("mlx_lm.server did not start within 300 s")


def tool_result(turn: int, words: int) -> str:
    lines = [f"# file src/module_{turn}.py"]
    n = 0
    while n < words:
        lines.append(f"def helper_{turn}_{n}(x):\n    return x * {n % 7} + {turn}")
        n += 8
    return "\n".join(lines)


def conversation(turns: int, words: int) -> list[list[dict]]:
    """The messages each turn sends (the turn's prompt ends with a user or tool message)."""
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Find where the helpers are defined and summarise them."}]
    out = [list(msgs)]
    for t in range(1, turns):
        msgs.append({"role": "assistant", "content": f"I will read src/module_{t}.py.\n"
                     f"<tool_call>\n{{\"name\": \"read_file\", \"arguments\": "
                     f"{{\"path\": \"src/module_{t}.py\"}}}}\n</tool_call>"})
        msgs.append({"role": "user", "content": "<tool_response>\n" + tool_result(t, words) +
                     "\n</tool_response>"})
        out.append(list(msgs))
    return out


def doc_conversation(turns: int, words: int, model_dir: str) -> list[list[dict]]:
    """The demo's own kind of agent session (``--content docs``): under the ``# Tools`` system
    turn the app writes for ``python_doc``, each turn asks about one of the model folder's
    held-out names (``heldout_tools.json``: in no training chat), with the call and the
    tool's real result, and the model answers from it; before that question the turn carries
    about ``words`` words of earlier complete exchanges (question, call, result, answer) over
    other standard-library names, the way an agent's context fills with tool results. The
    assistant turns are the trained answer form (fixed text), as in ``conversation``."""
    from engine.training import tool_chats

    path = Path(model_dir) / "heldout_tools.json"
    held = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    if not held:
        raise SystemExit(f"--content docs needs a train-demo folder: {model_dir} has no "
                         "held-out tool questions (heldout_tools.json)")
    skip = {h["name"] for h in held}
    pool = sorted((i for i in tool_chats.collect_tool_items() if i.name not in skip),
                  key=lambda i: i.name)

    msgs = [{"role": "system", "content": tool_chats.tools_system()}]
    out, k = [], 0
    for t in range(turns):
        if t:
            msgs.append({"role": "assistant", "content": held[(t - 1) % len(held)]["answer"]})
            added = 0
            while added < words:
                item = pool[k % len(pool)]
                k += 1
                msgs += tool_chats.exchange(item.name, f"What does `{item.name}` do?",
                                            item.result, item.answer)
                added += len(item.result.split()) + len(item.answer.split()) + 4
        h = held[t % len(held)]
        msgs += tool_chats.exchange(h["name"], h["prompt"], h["result"], h["answer"])[:-1]
        out.append(list(msgs))
    return out


def turn(url: str, messages: list[dict], tokens: int, model: str | None, depth=None,
         ) -> tuple[float, float, int, float]:
    """(ttft_s, decode tok/s, prompt tokens or 0, tokens per cycle or 0) of one streamed
    greedy turn (the completion tokens from the final ``usage``/``mtp`` stats where the
    server sends them). ``depth``: this engine's ``mtp.depth`` (None: the server's default)."""
    import httpx

    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if depth is not None:
        body["mtp"] = {"depth": depth}
    c = httpx.Client(timeout=600)  # made before the clock starts: ~20 ms of TLS set-up
    t0 = time.perf_counter()
    first = last = 0.0
    n, prompt, done, per_cycle = 0, 0, 0, 0.0
    with c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            usage = obj.get("usage") or obj.get("mtp") or {}
            prompt = usage.get("prompt_tokens") or prompt
            done = usage.get("completion_tokens") or done
            per_cycle = (obj.get("mtp") or {}).get("tokens_per_cycle") or per_cycle
            delta = ((obj.get("choices") or [{}])[0].get("delta") or {})
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1  # chunks (this engine sends a cycle's tokens in one)
    n = done or n  # tokens, where the server says
    rate = (n - 1) / (last - first) if n > 1 and last > first else 0.0
    return (first - t0 if first else 0.0), rate, prompt, per_cycle


def with_context(model: str, context: int, into: Path) -> str:
    """A copy of ``model``'s folder whose config allows ``context`` positions (a model
    trained on short chats, like the demo, still runs at any length: the speed is what is
    measured, not the answers)."""
    import shutil

    src = Path(model)
    into.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, into / f.name)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    for part in (cfg, cfg.get("text_config") or {}):
        if "max_position_embeddings" in part:
            part["max_position_embeddings"] = max(part["max_position_embeddings"], context)
    (into / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    tok_cfg = into / "tokenizer_config.json"
    if tok_cfg.exists():
        t = json.loads(tok_cfg.read_text(encoding="utf-8"))
        if isinstance(t.get("model_max_length"), int):
            t["model_max_length"] = max(t["model_max_length"], context)
            tok_cfg.write_text(json.dumps(t, indent=1), encoding="utf-8")
    return str(into)


def _servers(model: str, args) -> tuple[tuple, tuple, tuple]:
    """(process, url) of this engine's server, of its depth-0 one (``--plain``) and of
    mlx-lm's ((None, None) where not run), started one after the other, each engine server
    warm before the next starts.

    The engine's warm-up compiles in the background after it loads: no turn is measured while
    it runs. Its work on the other core does not only slow this engine's first turns: on a VM
    whose idle cores sleep, it made mlx-lm's first turns faster (its second turn, 1,063
    tokens, at 1.6-1.8x its third), which read as this engine losing turn 2. Two warm-ups at
    once time each other's cycles, and the costs they hand the depth controllers (and save
    for the next process) are then wrong."""
    ours = start_server(model, True)
    wait_warm(ours[1])
    plain = (None, None)
    if args.plain:
        plain = start_server(model, True)
        wait_warm(plain[1])
    theirs = (None, None) if args.skip_mlx_lm else start_mlx_lm(model)
    return ours, plain, theirs


def _turn_line(t: int, msgs: list[dict], args, depth, model: str, url: str,
               their_url: str | None, plain_url: str | None) -> str:
    """Turn ``t`` on every server, ``--repeats`` times (the order of this engine and mlx-lm
    flipped each time, depth 0's server after them): TTFT of the first request (the others
    resume from the prompt cache), decode tok/s the median over the repeats."""
    order = [(url, None, depth)] + ([] if their_url is None else [(their_url, model, None)])
    after = [] if plain_url is None else [(plain_url, None, 0)]
    runs: dict[str, list] = {}
    for r in range(args.repeats):
        for u, m, d in (order if (t + r) % 2 else order[::-1]) + after:
            runs.setdefault(u, []).append(turn(u, msgs, args.reply_tokens, m, d))

    def first_and_rate(u):
        got = runs.get(u)
        if not got:
            return 0.0, 0.0, 0, 0.0
        return got[0][0], statistics.median(x[1] for x in got), got[0][2], \
            statistics.median(x[3] for x in got)
    a_ttft, a_rate, n, per_cycle = first_and_rate(url)
    b_ttft, b_rate, _, _ = first_and_rate(their_url)
    line = (f"{t:4d} {n:7d}   {a_ttft * 1e3:11.0f} {b_ttft * 1e3:7.0f} "
            f"{a_ttft / b_ttft if b_ttft else 0:6.2f}   {a_rate:13.1f} {b_rate:7.1f} "
            f"{a_rate / b_rate if b_rate else 0:6.2f}  {per_cycle:7.2f}")
    if plain_url is not None:
        plain = first_and_rate(plain_url)[1]
        line += f"   {plain:7.1f}  {a_rate / plain if plain else 0:8.2f}"
    return line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.agent_session",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--result-words", type=int, default=120)
    p.add_argument("--reply-tokens", type=int, default=32)
    p.add_argument("--content", choices=("code", "docs"), default="code",
                   help="code: source files as tool results (out of the demo's domain); "
                        "docs: python_doc results and answers copied from them, the demo's "
                        "own tool use, each turn a held-out name (--result-words per turn)")
    p.add_argument("--depth", default="auto",
                   help="this engine's depth for the compared turn (auto or 0..6)")
    p.add_argument("--plain", action="store_true",
                   help="also run each turn at depth 0 on a second engine server (its own "
                        "prompt cache: a first request, as the compared turn) and print the "
                        "speed-up")
    p.add_argument("--context", type=int, default=0,
                   help="run on a copy of the model allowing this many positions")
    p.add_argument("--skip-mlx-lm", action="store_true")
    p.add_argument("--repeats", type=int, default=1,
                   help="requests per turn on each server: TTFT is the first's, decode tok/s "
                        "the median (a turn's single 32-token reply varies by +-25 %% here)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, not {args.repeats}")
    import tempfile

    import engine

    depth = args.depth if args.depth == "auto" else int(args.depth)
    model = args.model or str(engine.default_model_path())
    tmp = tempfile.TemporaryDirectory(prefix="agent-session-")
    if args.context:
        model = with_context(model, args.context, Path(tmp.name) / "model")
    chats = (doc_conversation(args.turns, args.result_words, model)  # refused before servers
             if args.content == "docs" else conversation(args.turns, args.result_words))
    (ours, url), (plain_server, plain_url), (theirs, their_url) = _servers(model, args)
    print(f"engine depth {depth}; TTFT ms and decode tok/s per turn; ratios engine / mlx-lm"
          + ("; speed-up: engine / its own depth 0" if args.plain else ""), flush=True)
    print("turn  prompt   TTFT engine  mlx-lm  ratio   decode engine  mlx-lm  ratio  tok/cyc"
          + ("   depth 0  speed-up" if args.plain else ""), flush=True)
    try:
        for t, msgs in enumerate(chats, 1):
            print(_turn_line(t, msgs, args, depth, model, url, their_url, plain_url), flush=True)
    finally:
        stop_server(ours)
        if plain_server is not None:
            stop_server(plain_server)
        if theirs is not None:
            theirs.terminate()
            theirs.wait(30)
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
