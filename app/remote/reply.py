"""One chat reply streamed from an OpenAI-compatible server (no Qt).

``stream_reply`` posts ``/v1/chat/completions`` with ``stream: true`` and turns the server's
chunks into what the chat gets from the local engine: text deltas (``reasoning_content``
wrapped in ``<think>…</think>`` as the local models write it; streamed ``tool_calls`` written
back as ``<tool_call>`` JSON blocks at the end, which the tool loop parses as it parses a local
reply), then one ``ReplySummary``. An MTP Chat server's final chunk carries ``mtp`` stats
(``engine.server.common.mtp_stats``): the summary is built from them (``summary_from_mtp``).
Any other server gives tok/s measured here (``measured_summary``), no speculation figures.

Cancelling the task closes the HTTP stream at once (the server then stops decoding).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from app.remote.connections import Connection, auth_headers, explain, http_problem
from engine.metrics.summary import PositionCounts, ReplySummary

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0  # a long prompt's prefill sends nothing until the first token
FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


@dataclass
class ReplyState:
    """What one reply has streamed so far."""

    t_start: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    chunks: int = 0
    thinking: bool = False
    calls: dict[int, dict] = field(default_factory=dict)
    finish: str | None = None
    mtp: dict | None = None
    usage: dict | None = None


def request_body(model: str, req, conn: Connection) -> dict:
    """The chat-completions body of an ``app.worker.GenerationRequest``."""
    s = req.sampling
    body = {"model": model, "messages": [wire_message(m) for m in req.messages],
            "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": req.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop_strings:
        body["stop"] = list(req.stop_strings)
    if req.tools:
        body["tools"] = list(req.tools)
    if conn.kind == "mtp":  # the extensions only MTP Chat's server takes
        body["mtp"] = {"depth": req.depth}
        if s.top_k:
            body["top_k"] = s.top_k
        if s.min_p:
            body["min_p"] = s.min_p
        if req.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": req.enable_thinking}
    return body


def wire_message(m: dict) -> dict:
    """A chat-template message as the OpenAI API takes it (arguments as a JSON string,
    no reasoning field)."""
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                               if isinstance(c["function"]["arguments"], str)
                               else json.dumps(c["function"]["arguments"])}}
            for c in m["tool_calls"]]
    return out


def chunk_text(obj: dict, st: ReplyState) -> str:
    """The text one chunk adds to the reply (think markers included); records the rest."""
    if obj.get("mtp"):
        st.mtp = obj["mtp"]
    if obj.get("usage"):
        st.usage = obj["usage"]
    out = ""
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        think = delta.get("reasoning_content") or delta.get("reasoning")
        if think:
            if not st.thinking:
                st.thinking, out = True, out + "<think>\n"
            out += think
        if delta.get("content"):
            if st.thinking:
                st.thinking, out = False, out + "\n</think>\n\n"
            out += delta["content"]
        for tc in delta.get("tool_calls") or ():
            call = st.calls.setdefault(int(tc.get("index", 0)), {"name": "", "arguments": ""})
            fn = tc.get("function") or {}
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            st.finish = choice["finish_reason"]
    return out


def calls_text(st: ReplyState) -> str:
    """The streamed tool calls as Qwen3 JSON blocks (what ``parse_tool_calls`` reads)."""
    out = "\n</think>\n\n" if st.thinking and st.calls else ""
    for _i, c in sorted(st.calls.items()):
        try:
            args = json.loads(c["arguments"] or "{}")
        except ValueError:
            args = {}
        out += "<tool_call>\n" + json.dumps({"name": c["name"], "arguments": args}) + \
            "\n</tool_call>\n"
    return out


def summary_from_mtp(m: dict, finish: str) -> ReplySummary:
    """An MTP Chat server's ``mtp`` stats as the ``ReplySummary`` the app shows: every figure
    is the server's. By position it sends the counts (``drafted_by_position`` ...); a server
    that sends only the rates gets positions of 10 000 drafts each with the accepted drafts
    its rate implies, so the rates shown are still the server's (to 1e-4)."""
    tokens = int(m.get("completion_tokens") or 0)
    decode = max(0, tokens - 1)
    tps = float(m.get("tokens_per_s") or 0.0)
    cycles, drafted = int(m.get("cycles") or 0), int(m.get("drafted") or 0)
    rates = [r for r in m.get("acceptance_by_position") or [] if r is not None]
    counts = [m.get(k) for k in ("drafted_by_position", "reached_by_position",
                                 "accepted_by_position")]
    if all(isinstance(c, list) and len(c) == len(rates) for c in counts):
        positions = tuple(PositionCounts(i, int(d), int(r), int(a))
                          for i, (d, r, a) in enumerate(zip(*counts), 1))
    else:
        positions = tuple(PositionCounts(i, 10_000, 10_000, round(rate * 10_000))
                          for i, rate in enumerate(rates, 1))
    return ReplySummary(
        tokens=tokens, prompt_tokens=int(m.get("prompt_tokens") or 0),
        reused_tokens=int(m.get("reused_prompt_tokens") or 0),
        ttft_s=float(m.get("ttft_s") or 0.0), decode_tokens=decode,
        decode_s=decode / tps if tps else 0.0, cycles=cycles,
        speculative_cycles=cycles if drafted else 0, drafted=drafted,
        accepted=int(m.get("accepted") or 0), positions=positions,
        depth_min=1 if rates else 0, depth_max=len(rates), host_syncs=0,
        finish_reason=finish, batch_max=int(m.get("batch_max") or 1))


def measured_summary(st: ReplyState, finish: str, t_end: float) -> ReplySummary:
    """A plain server's reply: tokens from its usage (else one per chunk), timed here."""
    usage = st.usage or {}
    tokens = int(usage.get("completion_tokens") or st.chunks)
    t_first = st.t_first or t_end
    return ReplySummary(
        tokens=tokens, prompt_tokens=int(usage.get("prompt_tokens") or 0), reused_tokens=0,
        ttft_s=t_first - st.t_start, decode_tokens=max(0, tokens - 1),
        decode_s=max(0.0, t_end - t_first), cycles=0, speculative_cycles=0, drafted=0,
        accepted=0, positions=(), depth_min=0, depth_max=0, host_syncs=0,
        finish_reason=finish)


async def stream_reply(client: httpx.AsyncClient, conn: Connection, model: str, req,
                       on_text: Callable[[str], None],
                       st: ReplyState | None = None) -> ReplySummary:
    """Stream one reply: ``on_text`` for each piece of text; the summary at the end, or a
    ``RemoteError``-style one-line ``ReplyFailed``. ``st`` (the caller's, to read after a
    cancel) records what streamed."""
    st = st if st is not None else ReplyState()
    url = f"{conn.base_url}/chat/completions"
    try:
        async with client.stream("POST", url, json=request_body(model, req, conn),
                                 headers=auth_headers(conn.api_key)) as r:
            if r.status_code != 200:
                raise ReplyFailed(http_problem(r.status_code, await r.aread(), conn.host,
                                               had_key=bool(conn.api_key)), st)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                text = chunk_text(parse_chunk(data, conn.host, st), st)
                if text:
                    st.chunks += 1
                    st.t_first = st.t_first or time.perf_counter()
                    on_text(text)
    except httpx.HTTPError as exc:
        raise ReplyFailed(explain(exc, conn.base_url, timeout=READ_TIMEOUT_S), st) from None
    if st.finish is None:
        raise ReplyFailed(f"The connection to {conn.host} ended before the reply did.", st)
    if st.calls:
        on_text(calls_text(st))
    finish = FINISH.get(st.finish, "stop")
    return summary_from_mtp(st.mtp, finish) if st.mtp and "cycles" in st.mtp else \
        measured_summary(st, finish, time.perf_counter())


def parse_chunk(data: str, host: str, st: ReplyState) -> dict:
    try:
        obj = json.loads(data)
    except ValueError:
        raise ReplyFailed(f"{host} sent a chunk that is not JSON: not an OpenAI-compatible "
                          "stream.", st) from None
    if isinstance(obj, dict) and obj.get("error"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise ReplyFailed(f"{host}: {str(msg).splitlines()[0][:200]}", st)
    if not isinstance(obj, dict):
        raise ReplyFailed(f"{host} sent an unexpected chunk: not an OpenAI-compatible stream.",
                          st)
    return obj


class ReplyFailed(Exception):
    """A reply that could not finish: its one-line message (the text so far is the
    caller's)."""

    def __init__(self, message: str, state: ReplyState) -> None:
        super().__init__(message)
        self.state = state


def new_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
