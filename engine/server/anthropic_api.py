"""Anthropic-compatible routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Contract (SERVER.md; otherwise what the official ``anthropic`` client expects):
- Parameters: ``system`` (string or text blocks), ``messages`` (text, ``thinking``,
  ``tool_use`` and ``tool_result`` blocks), ``max_tokens`` (required), ``stop_sequences``,
  ``temperature`` (0..1, default 1), ``top_p``, ``top_k``, ``stream``, ``tools`` /
  ``tool_choice`` (``auto``, ``none``, ``any`` and ``tool`` force a call through a grammar;
  ``disable_parallel_tool_use``), ``thinking`` (``{"type": "enabled"|"disabled"|"adaptive"}``;
  absent or adaptive: the template's default; ``budget_tokens`` is not enforced),
  structured output (``output_config.format``, which the current SDK's ``messages.parse``
  sends, or the older top-level ``output_format``), and the ``mtp`` extension. A field that
  would change the reply but is not supported (``REFUSED``: server tools, ``container``,
  ``mcp_servers``, a ``context_management`` edit other than ``clear_thinking_20251015``,
  which is applied, an ``output_config.effort`` other than the default) is a 400; fields
  that do not change the reply (metadata, service_tier, ...) are ignored.
- Any model name starting with ``claude-`` maps to the loaded model (Claude Code sends its own).
- Streams: ``message_start`` (empty content, input usage), then per block
  ``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
  ``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (``stop_reason``:
  ``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``; output usage; the ``mtp``
  stats) and ``message_stop``.
- Text must be text: ``system``, text blocks and ``tool_result`` content that are not strings
  (or text blocks) are a 400 naming the field; an image is a 400 wherever it is, a
  ``tool_result`` included. A reply that does not finish (the grammar failed, the server
  cancelled it on a drain) is an error (a stream: ``event: error``), never ``end_turn``.
"""
from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse

from engine.server import sse
from engine.server.common import (
    Backend, Generation, mtp_headers, mtp_stats, new_id, refuse_fields)
from engine.server.constraints import ToolUse, constraint_of
from engine.server.errors import bad_request
from engine.server.images import anthropic_block
from engine.server.openai_api import gen_request, read_json
from engine.server.reply_parts import ReplyParser, collect
from engine.server.templates import chat_prompt_ids, decode_ids, prompt_opens_think
from engine.server.toolcalls import ToolArgs, ToolEnd, ToolStart, schemas_of

# Fields that would change the reply but are not supported: any value but these is a 400.
# Others (metadata, service_tier, cache_control, speed, ...) leave the reply as it is.
REFUSED = {"container": (None,), "mcp_servers": (None, [])}
CONFIG_REFUSED = {"effort": (None, "high")}  # output_config.effort: "high" is the default


# ---------------------------------------------------------------------- request -> template

def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of blocks", "messages")
    for b in content:
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{where}: each content block needs a type", "messages")
    return content


def _text(block: dict, where: str, key: str = "text") -> str:
    value = block.get(key, "")
    if not isinstance(value, str):
        raise bad_request(f"{where}: {key} must be a string, not {type(value).__name__}",
                          "messages" if where.startswith("messages") else "system")
    return value


def _result_text(content, where: str) -> str:
    """``system`` or a ``tool_result``'s content: a string or a list of text blocks."""
    param = "messages" if where.startswith("messages") else "system"
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text blocks, not "
                          f"{type(content).__name__}", param)
    parts = []
    for i, b in enumerate(content):
        kind = b.get("type", "text") if isinstance(b, dict) else type(b).__name__
        if kind != "text":
            raise bad_request(f"{where}[{i}]: {kind!r} blocks are not supported (text only)",
                              param)
        parts.append(_text(b, f"{where}[{i}]"))
    return "".join(parts)


def _user(blocks: list[dict], where: str) -> list[dict]:
    """A user turn's blocks: tool results, then one user message of its text and images
    (``image`` blocks become placeholders decoded by ``engine.server.images``)."""
    out, text, parts = [], [], []
    for j, b in enumerate(blocks):
        kind = b["type"]
        if kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                        "content": _result_text(b.get("content"), f"{where}.content[{j}].content")})
        elif kind == "text":
            text.append(_text(b, where))
            parts.append({"type": "text", "text": text[-1]})
        elif kind == "image":
            parts.append(anthropic_block(b, f"{where}.content[{j}]"))
        else:
            raise bad_request(f"{where}: {kind!r} blocks are not supported (text and image "
                              "only)", "messages")
    if len(parts) != len(text):
        out.append({"role": "user", "content": parts})
    elif text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(blocks: list[dict], where: str) -> dict:
    msg: dict = {"role": "assistant", "content": ""}
    calls = []
    for b in blocks:
        kind = b["type"]
        if kind == "text":
            msg["content"] += _text(b, where)
        elif kind == "thinking":
            msg["reasoning_content"] = msg.get("reasoning_content", "") + _text(b, where, "thinking")
        elif kind == "tool_use":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise bad_request(f"{where}: a tool_use block needs a name (string) and an "
                                  "input (object)", "messages")
            calls.append({"id": b.get("id"), "type": "function",
                          "function": {"name": b.get("name"), "arguments": b.get("input") or {}}})
        elif kind != "redacted_thinking":  # (never written by this server: nothing to replay)
            raise bad_request(f"{where}: {kind!r} blocks are not supported (text, thinking "
                              "and tool_use only)", "messages")
    if calls:
        msg["tool_calls"] = calls
    return msg


def template_messages(body: dict) -> list[dict]:
    out: list[dict] = []
    system = body.get("system")
    text = _result_text(system, "system")
    if system:
        out.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}: role must be user or assistant", "messages")
        blocks = _blocks(m.get("content"), where)
        out.extend(_user(blocks, where) if role == "user" else [_assistant(blocks, where)])
    keep = thinking_turns_kept(body)
    if keep is not None:
        thought = [m for m in out if m.get("reasoning_content")]
        for m in thought[:max(0, len(thought) - keep)]:
            del m["reasoning_content"]
    return out


def thinking_turns_kept(body: dict) -> int | None:
    """``context_management``: the ``clear_thinking_20251015`` edit (Claude Code sends it) is
    applied — the thinking of all but the last ``keep`` assistant turns is left out of the
    prompt (None: keep all); any other edit (clearing tool uses, compaction) is a 400."""
    cm = body.get("context_management")
    if cm is None:
        return None
    edits = cm.get("edits") if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        raise bad_request("context_management must be {edits: [...]}", "context_management")
    kept = None
    for i, e in enumerate(edits):
        kind = e.get("type") if isinstance(e, dict) else None
        if kind != "clear_thinking_20251015":
            raise bad_request(f"context_management.edits[{i}]: {kind!r} is not supported by "
                              "this server (clear_thinking_20251015 only)", "context_management")
        keep = e.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all":
            continue
        value = keep.get("value") if isinstance(keep, dict) else None
        if not isinstance(keep, dict) or keep.get("type") != "thinking_turns" or \
                isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad_request(f"context_management.edits[{i}].keep must be \"all\" or "
                              "{type: thinking_turns, value: N}", "context_management")
        kept = value if kept is None else min(kept, value)
    return kept


def tools_of(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise bad_request("tools must be a list of {name, description, input_schema}", "tools")
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise bad_request(f"tools[{i}]: {t['type']!r} tools are not supported (client "
                              "tools with an input_schema only)", "tools")
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description", ""),
        "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
        for t in tools]


def tool_use_of(body: dict) -> ToolUse:
    """``tools`` and ``tool_choice`` (``auto``, ``none``, ``any``, ``tool`` with a name;
    ``disable_parallel_tool_use``) as a ``ToolUse``."""
    tools, choice = tools_of(body), body.get("tool_choice")
    if choice is None:
        return ToolUse(tools)
    kind = choice.get("type") if isinstance(choice, dict) else None
    one = choice.get("disable_parallel_tool_use") if isinstance(choice, dict) else None
    if kind not in ("auto", "none", "any", "tool") or not isinstance(one, (bool, type(None))):
        raise bad_request("tool_choice must be {type: auto|none|any|tool, "
                          "disable_parallel_tool_use?: bool}", "tool_choice")
    max_calls = 1 if one else None
    if kind in ("none", "auto"):
        return ToolUse.chosen(tools, kind, max_calls=max_calls)
    name = choice.get("name") if kind == "tool" else None
    if tools is not None and kind == "tool" and not isinstance(name, str):
        raise bad_request("tool_choice {type: tool} needs the tool's name", "tool_choice")
    return ToolUse.chosen(tools, "forced", name=name, max_calls=max_calls)


def thinking_flag(body: dict) -> bool | None:
    """``thinking``: enabled (its budget_tokens is not enforced: the reply is bounded by
    max_tokens), disabled, or adaptive / absent (the template's default)."""
    t = body.get("thinking")
    if t is None:
        return None
    kind = t.get("type") if isinstance(t, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad_request("thinking must be {type: enabled|disabled|adaptive}", "thinking")
    return {"enabled": True, "disabled": False}.get(kind)


async def _prepare(backend: Backend, body: dict, *, thinking_off: bool = False):
    messages = await backend.decode_images(template_messages(body), "messages")
    tools = tool_use_of(body).tools
    thinking = False if thinking_off else thinking_flag(body)

    def render(m):
        ids = chat_prompt_ids(m, messages, tools=tools, enable_thinking=thinking)
        return ids, prompt_opens_think(m, ids)

    ids, opened = await backend.tokenize(render)
    return ids, opened, tools


# ---------------------------------------------------------------------- routes

async def count_tokens(request: Request) -> JSONResponse:
    backend: Backend = request.app.state.backend
    body = await read_json(request)
    backend.resolve_model(body.get("model"))
    ids, _, _ = await _prepare(backend, body)
    return JSONResponse({"input_tokens": len(ids)})


def _format_of(body: dict) -> tuple[dict, str]:
    """Where the request's structured output is: ``output_config.format`` (the current SDK's
    ``messages.parse``) or the older top-level ``output_format``; as (body, key) for
    ``constraint_of``."""
    config = body.get("output_config")
    if config is None:
        return body, "output_format"
    if not isinstance(config, dict):
        raise bad_request("output_config must be an object", "output_config")
    refuse_fields(config, CONFIG_REFUSED, prefix="output_config.")
    if config.get("format") is None:
        return body, "output_format"
    return {"output_config.format": config["format"]}, "output_config.format"


async def messages(request: Request):
    backend: Backend = request.app.state.backend
    body = await read_json(request)
    model = backend.resolve_model(body.get("model"))
    if body.get("max_tokens") is None:
        raise bad_request("max_tokens: field required", "max_tokens")
    template_messages(body)  # a malformed request is a 400 before any schema compiles
    refuse_fields(body, REFUSED)
    thinking_flag(body)
    use, where = tool_use_of(body), _format_of(body)
    # a forced call's grammar wins over the output format: the reply is the call
    fmt = await use.constraint(backend, "tool_choice") or await constraint_of(backend, *where)
    ids, opened, tools = await _prepare(backend, body, thinking_off=fmt is not None)
    req = replace(gen_request(backend, body, ids, stop_key="stop_sequences", max_temperature=1.0),
                  response_format=fmt)
    parser = ReplyParser(opened_think=opened, id_prefix="toolu_", max_calls=use.max_calls,
                         schemas=schemas_of(tools) if tools is not None else None)
    gen = Generation(backend, req)
    await gen.start(request)
    meta = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": model}
    if body.get("stream"):
        return sse.stream(gen, _stream(backend, gen, parser, meta), error=sse.anthropic_error)
    return await _once(request, backend, gen, parser, meta)


async def _stop_reason(backend: Backend, gen: Generation, token_ids: list[int], text: str,
                       has_calls: bool) -> tuple[str, str | None]:
    if has_calls:
        return "tool_use", None
    reason = gen.summary.finish_reason if gen.summary else None
    if reason == "length":
        return "max_tokens", None
    stops = gen.req.stop_strings
    if reason != "stop" or not stops or not token_ids or \
            token_ids[-1] in backend.info.eos_token_ids:
        return "end_turn", None
    full = await backend.tokenize(lambda m: decode_ids(m, token_ids))
    tail = full[max(0, len(text) - max(map(len, stops))):]
    hits = sorted((tail.find(s), i) for i, s in enumerate(stops) if tail.find(s) >= 0)
    return "stop_sequence", stops[hits[0][1]] if hits else stops[0]


def _usage(gen: Generation) -> dict:
    s = gen.summary
    return {"input_tokens": len(gen.req.prompt_ids), "output_tokens": s.tokens if s else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


async def _once(request: Request, backend: Backend, gen: Generation, parser: ReplyParser,
                meta: dict) -> JSONResponse:
    ids: list[int] = []
    text = ""
    async for ev in gen.events(request):
        ids.extend(ev.token_ids)
        text += ev.text
    got = collect(parser, text)
    content: list[dict] = []
    if got.reasoning:
        content.append({"type": "thinking", "thinking": got.reasoning, "signature": ""})
    if got.content or not got.calls:
        content.append({"type": "text", "text": got.content})
    content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in got.calls]
    reason, seq = await _stop_reason(backend, gen, ids, text, bool(got.calls))
    stats = mtp_stats(gen.summary, gen.req.depth, gen.queued_s)
    out = {**meta, "content": content, "stop_reason": reason, "stop_sequence": seq,
           "usage": _usage(gen), "mtp": stats}
    return JSONResponse(out, headers=mtp_headers(stats))


class _Blocks:
    """Reply parts -> Anthropic content-block events (one block open at a time)."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def _start(self, kind: str, block: dict) -> list[str]:
        out = self.close()
        self.index += 1
        self.open = kind
        return out + [sse.event("content_block_start", {
            "type": "content_block_start", "index": self.index, "content_block": block})]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [sse.event("content_block_stop", {"type": "content_block_stop",
                                                 "index": self.index})]

    def _delta(self, delta: dict) -> str:
        return sse.event("content_block_delta", {"type": "content_block_delta",
                                                 "index": self.index, "delta": delta})

    def part(self, part) -> list[str]:
        if isinstance(part, ToolStart):
            return self._start("tool_use", {"type": "tool_use", "id": part.id,
                                            "name": part.name, "input": {}})
        if isinstance(part, ToolArgs):
            return [self._delta({"type": "input_json_delta", "partial_json": part.fragment})]
        if isinstance(part, ToolEnd):
            return self.close()
        channel, text = part
        kind = "thinking" if channel == "reasoning" else "text"
        out = []
        if self.open != kind:
            block = ({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                     else {"type": "text", "text": ""})
            out = self._start(kind, block)
        key = "thinking" if kind == "thinking" else "text"
        return out + [self._delta({"type": f"{key}_delta", key: text})]


async def _stream(backend: Backend, gen: Generation, parser: ReplyParser, meta: dict):
    usage = {"input_tokens": len(gen.req.prompt_ids), "output_tokens": 1,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    yield sse.event("message_start", {"type": "message_start", "message": {
        **meta, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}})
    blocks, ids, text = _Blocks(), [], ""
    async for ev in gen.events():
        ids.extend(ev.token_ids)
        text += ev.text
        for part in parser.feed(ev.text) if ev.text else ():
            for chunk in blocks.part(part):
                yield chunk
    for part in parser.flush():
        for chunk in blocks.part(part):
            yield chunk
    if blocks.index < 0:  # an empty reply still has one (empty) text block
        for chunk in blocks.part(("content", "")):
            yield chunk
    for chunk in blocks.close():
        yield chunk
    reason, seq = await _stop_reason(backend, gen, ids, text, bool(parser.calls))
    yield sse.event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
        "usage": {"output_tokens": gen.summary.tokens if gen.summary else len(ids)},
        "mtp": mtp_stats(gen.summary, gen.req.depth, gen.queued_s)})
    yield sse.event("message_stop", {"type": "message_stop"})
