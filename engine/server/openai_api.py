"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions``.

Contract (SERVER.md; where it is silent, what the official ``openai`` client expects):
- Parameters: ``messages`` (system/developer/user/assistant/tool; string or text-part
  content), ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (default 1, like
  OpenAI), ``top_p``, ``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
  ``seed``, ``stop``, ``stream``, ``stream_options.include_usage``, ``tools`` /
  ``tool_choice`` (``required`` or a named function force a call through a grammar,
  ``engine.server.constraints``) / ``parallel_tool_calls`` (false: at most one call is
  reported), ``n`` (1 only), the ``mtp`` extension (``{"depth": "auto"|0..6}``) and a
  thinking switch (``chat_template_kwargs.enable_thinking`` or top-level ``enable_thinking``,
  or ``reasoning_effort``: ``"none"`` is off, another level on). A field that would change
  the reply but is not supported (``CHAT_REFUSED``, ``COMPLETIONS_REFUSED``: audio,
  logit_bias, verbosity, web search, legacy functions, best_of, echo, suffix) is a 400;
  fields that do not change the reply (metadata, store, user, ...) are ignored. ``response_format``
  ``json_object`` / ``json_schema`` constrains the reply with a token mask applied to every
  drawn token, drafts included (``engine.sampling.grammar``), so it stays exact under speculation;
  thinking is off for such a request (the grammar starts at the answer). The schema is
  compiled on a worker thread (never the event loop or the decoding thread), within
  ``COMPILE_S``; one that cannot be compiled, is over ``engine.sampling.grammar``'s size limits or
  admits no document is a 400; a grammar that fails mid-reply is a 400 (a stream: a final
  ``data: {"error": ...}`` chunk), never a ``stop``. ``logprobs`` / ``top_logprobs`` are a 400
  (not supported). The body is strict JSON: ``NaN`` / ``Infinity`` and nesting past the
  parser's recursion limit are a 400.
- Qwen's thinking goes to ``reasoning_content``; tool calls to ``tool_calls`` (streamed as
  deltas: first ``index``/``id``/``type``/``function.name``, then ``arguments`` fragments);
  ``finish_reason`` is ``tool_calls`` only when a call was parsed.
- Every response carries ``"mtp"`` speculation stats (non-streaming: also ``x-mtp-*``
  headers; streaming: in the chunk with the ``finish_reason``, and in the usage chunk).
- A reply the server cancels (a drain on SIGTERM) is not reported as finished: 503, or in a
  stream a final error chunk (``finish_reason`` has no value for "cut short": ``stop`` and
  ``length`` would both tell the client something false).
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse

from engine.core.scheduler import GenRequest
from engine.server import sse
from engine.server.common import (
    Backend, Generation, mtp_headers, mtp_stats, new_id, number, refuse_fields, sampling_from,
    seed_of, stop_strings)
from engine.server.constraints import ToolUse, constraint_of, max_calls_of, openai_tool_use
from engine.server.errors import ApiError, bad_request
from engine.server.images import openai_part
from engine.server.reply_parts import ReplyParser, collect
from engine.server.templates import chat_prompt_ids, prompt_opens_think, text_prompt_ids
from engine.server.toolcalls import ToolArgs, ToolStart, schemas_of

# "cancelled" never reaches these: ``Generation.events`` raises for it (see the docstring).
FINISH = {"stop": "stop", "length": "length", None: "stop"}
# Fields that would change the reply but are not supported: any value but these is a 400
# (``refuse_fields``). Fields not named anywhere here are ignored (metadata, store, user, ...).
CHAT_REFUSED = {"audio": (None,), "modalities": (None, ["text"]), "logit_bias": (None, {}),
                "verbosity": (None, "medium"), "web_search_options": (None,),
                "functions": (None, []), "function_call": (None, "none", "auto")}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
COMPLETIONS_REFUSED = {"best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
                       "logit_bias": (None, {})}


class _NonFinite(ValueError):
    def __init__(self, literal: str) -> None:
        super().__init__(f"{literal} is not valid JSON (numbers must be finite)")
        self.literal = literal


def _no_constant(literal: str):
    raise _NonFinite(literal)


def loads(text: str | bytes, what: str):
    """Strict JSON: ``NaN`` / ``Infinity`` raise ``_NonFinite``; too deep a nesting is a 400
    (``what`` says whose: "The request body is"), not a RecursionError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request(f"{what} nested too deeply") from None


def _key_before(raw: bytes, literal: str) -> str | None:
    """The key whose value is ``literal`` (only on the error path: one regex search)."""
    found = re.search(rb'"([^"\\]{1,64})"\s*:\s*' + re.escape(literal.encode()), raw)
    return found.group(1).decode("utf-8", "replace") if found else None


async def read_json(request: Request) -> dict:
    raw = await request.body()
    try:
        body = loads(raw or b"null", "The request body is")
    except _NonFinite as exc:
        key = _key_before(raw, exc.literal)
        raise bad_request(f"The request body is not valid JSON: {key or 'a number'} is "
                          f"{exc.literal} (numbers must be finite)", key) from None
    except ValueError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


# ---------------------------------------------------------------------- request -> template

def _text_content(content, where: str, images: bool = False):
    """A message's content as the template takes it: a string, or (``images``: a user turn
    with ``image_url`` parts) a list of text parts and image placeholders
    (``engine.server.images``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts, mixed = [], []
        for j, p in enumerate(content):
            if isinstance(p, dict) and p.get("type") in ("text", "input_text") and \
                    isinstance(p.get("text"), str):
                parts.append(p["text"])
                mixed.append({"type": "text", "text": p["text"]})
                continue
            img = openai_part(p, f"{where}.content[{j}]") if isinstance(p, dict) else None
            if img is not None and images:
                mixed.append(img)
                continue
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            only = "text and image_url" if images else "text only"
            raise bad_request(f"{where}: content parts of type {kind!r} are not supported "
                              f"({only})", "messages")
        return mixed if len(mixed) != len(parts) else "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", "messages")


def _tool_calls(calls, where: str) -> list[dict]:
    out = []
    for c in calls if isinstance(calls, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}: each tool call needs function.name", "messages")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = loads(args, f"{where}: tool call arguments are") if args.strip() else {}
            except ValueError:
                raise bad_request(f"{where}: tool call arguments are not valid JSON",
                                  "messages") from None
        out.append({"id": c.get("id"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def template_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(f"{where}: role must be system, user, assistant or tool",
                              "messages")
        msg = {"role": role, "content": _text_content(m.get("content"), where,
                                                      images=role == "user")}
        if role == "assistant":
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
            calls = _tool_calls(m.get("tool_calls"), where)
            if calls:
                msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def tools_of(body: dict) -> list[dict] | None:
    """The offered tools in the template's form, or None when there are none."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise bad_request("tools must be a list of {type: function, function: {name, ...}} "
                          "(function tools only)", "tools")
    return [{"type": "function", "function": t["function"]} for t in tools]


def tool_use_of(body: dict) -> ToolUse:
    """``tools``, ``tool_choice`` (auto, none, required, or {type: function, function:
    {name}}) and ``parallel_tool_calls`` as a ``ToolUse``."""
    choice = body.get("tool_choice")
    fn = choice.get("function") if isinstance(choice, dict) else None
    named = isinstance(choice, dict) and choice.get("type") == "function" and \
        isinstance(fn, dict) and isinstance(fn.get("name"), str)
    return openai_tool_use(
        tools_of(body), choice, fn["name"] if named else None,
        max_calls_of(body.get("parallel_tool_calls"), "parallel_tool_calls"),
        "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
        "{\"name\": ...}} (allowed_tools and custom tools are not supported)")


def refuse_logprobs(body: dict) -> None:
    """Token log-probabilities are not reported: asking for them is a 400, not a null."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is not None and asked is not False:  # (the legacy API's logprobs: 0 asks too)
        raise bad_request("logprobs is not supported by this server", "logprobs")
    if top is not None and (isinstance(top, bool) or top != 0):
        raise bad_request("top_logprobs is not supported by this server", "top_logprobs")


def thinking_flag(body: dict, effort=None, param: str = "reasoning_effort") -> bool | None:
    """Thinking on or off: ``chat_template_kwargs.enable_thinking``, ``enable_thinking``, then
    the reasoning effort (``effort``, else ``reasoning_effort``): ``"none"`` is off, any other
    level is on; None leaves it to the template."""
    kw = body.get("chat_template_kwargs")
    if isinstance(kw, dict) and isinstance(kw.get("enable_thinking"), bool):
        return kw["enable_thinking"]
    if isinstance(body.get("enable_thinking"), bool):
        return body["enable_thinking"]
    effort = body.get("reasoning_effort") if effort is None else effort
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise bad_request(f"{param} must be one of {', '.join(EFFORTS)}, not {effort!r}", param)
    return effort != "none"


def gen_request(backend: Backend, body: dict, ids: list[int], *, max_key: str = "max_tokens",
                stop_key: str = "stop", max_temperature: float = 2.0) -> GenRequest:
    ctx = backend.info.context_length
    max_tokens = number(body, "max_completion_tokens", None, integer=True, lo=1)
    if max_tokens is None:
        max_tokens = number(body, max_key, None, integer=True, lo=1)
    if number(body, "n", 1, integer=True, lo=1) != 1:
        raise bad_request("n must be 1 (one choice per request)", "n")
    return GenRequest(
        id=new_id("req_"), prompt_ids=ids if getattr(ids, "images", None) else tuple(ids),
        max_tokens=max_tokens or ctx,
        depth=backend.depth_for(body), sampling=sampling_from(body, max_temperature=max_temperature),
        seed=seed_of(body), stop_strings=stop_strings(body, stop_key))


# ---------------------------------------------------------------------- routes

async def list_models(request: Request) -> JSONResponse:
    backend: Backend = request.app.state.backend
    rows = [backend.model_id] + [n for n in _installed_names() if n != backend.model_id]
    data = [{"id": n, "object": "model", "created": backend.created, "owned_by": "local",
             "loaded": n == backend.model_id} for n in rows]
    return JSONResponse({"object": "list", "data": data})


def _installed_names() -> list[str]:
    try:
        from engine.hub.store import Store

        return [r.name for r in Store().list(include_incomplete=False) if r.loadable]
    except Exception:  # noqa: BLE001 - an unreadable store only shortens the list
        return []


async def get_model(request: Request) -> JSONResponse:
    backend: Backend = request.app.state.backend
    name = backend.resolve_model(request.path_params["model"])
    return JSONResponse({"id": name, "object": "model", "created": backend.created,
                         "owned_by": "local"})


async def chat_completions(request: Request):
    backend: Backend = request.app.state.backend
    body = await read_json(request)
    model = backend.resolve_model(body.get("model"))
    messages = template_messages(body.get("messages"))
    refuse_fields(body, CHAT_REFUSED)
    use = tool_use_of(body)
    tools = use.tools
    messages = await backend.decode_images(messages, "messages")
    refuse_logprobs(body)
    # a forced call's grammar wins over response_format: the reply is the call, not an answer
    fmt = await use.constraint(backend, "tool_choice") or await constraint_of(backend, body)
    thinking = False if fmt else thinking_flag(body)  # the grammar starts at the answer

    def render(m):
        ids = chat_prompt_ids(m, messages, tools=tools, enable_thinking=thinking)
        return ids, prompt_opens_think(m, ids)

    ids, opened = await backend.tokenize(render)
    req = replace(gen_request(backend, body, ids), response_format=fmt)
    parser = ReplyParser(opened_think=opened, max_calls=use.max_calls,
                         schemas=schemas_of(tools) if tools is not None else None)
    gen = Generation(backend, req)
    await gen.start(request)
    meta = {"id": new_id("chatcmpl-"), "created": int(time.time()), "model": model}
    if body.get("stream"):
        opts = body.get("stream_options")
        usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        return sse.stream(gen, _chat_stream(gen, parser, meta, usage))
    return await _chat_once(request, gen, parser, meta)


def _usage(summary) -> dict:
    p, c = (summary.prompt_tokens, summary.tokens) if summary else (0, 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": summary.reused_tokens if summary else 0}}


async def _chat_once(request: Request, gen: Generation, parser: ReplyParser, meta: dict):
    text = "".join([ev.text async for ev in gen.events(request)])
    got = collect(parser, text)
    msg: dict = {"role": "assistant", "content": got.content if got.content or not got.calls
                 else None}
    if got.reasoning:
        msg["reasoning_content"] = got.reasoning
    if got.calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments_json}}
                             for c in got.calls]
    summary = gen.summary
    finish = "tool_calls" if got.calls else FINISH.get(summary.finish_reason if summary else None)
    stats = mtp_stats(summary, gen.req.depth, gen.queued_s)
    out = {**meta, "object": "chat.completion", "system_fingerprint": None,
           "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
           "usage": _usage(summary), "mtp": stats}
    return JSONResponse(out, headers=mtp_headers(stats))


def _chunk(meta: dict, delta: dict | None, finish=None, *, with_usage: bool = False,
           **extra) -> str:
    """One chunk; ``delta=None`` is the usage chunk (empty ``choices``). With include_usage
    every other chunk carries ``"usage": null``, as OpenAI's do."""
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    obj = {**meta, "object": "chat.completion.chunk", "system_fingerprint": None,
           "choices": choices, **extra}
    if with_usage:
        obj.setdefault("usage", None)
    return sse.data(obj)


def _delta(part) -> dict:
    if isinstance(part, ToolStart):
        return {"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                "function": {"name": part.name, "arguments": ""}}]}
    if isinstance(part, ToolArgs):
        return {"tool_calls": [{"index": part.index, "function": {"arguments": part.fragment}}]}
    channel, text = part
    return {"reasoning_content": text} if channel == "reasoning" else {"content": text}


async def _chat_stream(gen: Generation, parser: ReplyParser, meta: dict, usage: bool):
    yield _chunk(meta, {"role": "assistant", "content": ""}, with_usage=usage)
    async for ev in gen.events():
        for part in parser.feed(ev.text) if ev.text else ():
            if isinstance(part, (tuple, ToolStart, ToolArgs)):
                yield _chunk(meta, _delta(part), with_usage=usage)
    for part in parser.flush():
        if isinstance(part, (tuple, ToolStart, ToolArgs)):
            yield _chunk(meta, _delta(part), with_usage=usage)
    summary = gen.summary
    finish = "tool_calls" if parser.calls else FINISH.get(summary.finish_reason if summary else None)
    stats = mtp_stats(summary, gen.req.depth, gen.queued_s)
    yield _chunk(meta, {}, finish, with_usage=usage, mtp=stats)
    if usage:
        yield _chunk(meta, None, with_usage=True, usage=_usage(summary), mtp=stats)
    yield sse.DONE


async def completions(request: Request):
    backend: Backend = request.app.state.backend
    body = await read_json(request)
    model = backend.resolve_model(body.get("model"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, str) and prompt:
        ids = await backend.tokenize(lambda m: text_prompt_ids(m, prompt))
    else:
        raise bad_request("prompt must be a non-empty string (or a list of token ids)", "prompt")
    refuse_fields(body, COMPLETIONS_REFUSED)
    refuse_logprobs(body)
    fmt = await constraint_of(backend, body)
    req = replace(gen_request(backend, body, ids, max_key="max_tokens"), response_format=fmt)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        req = _with_max(req, 16)  # OpenAI's legacy default
    gen = Generation(backend, req)
    await gen.start(request)
    meta = {"id": new_id("cmpl-"), "created": int(time.time()), "model": model}
    if body.get("stream"):
        opts = body.get("stream_options")
        usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        return sse.stream(gen, _completion_stream(gen, meta, usage))
    text = "".join([ev.text async for ev in gen.events(request)])
    stats = mtp_stats(gen.summary, req.depth, gen.queued_s)
    finish = FINISH.get(gen.summary.finish_reason if gen.summary else None)
    out = {**meta, "object": "text_completion", "system_fingerprint": None,
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
           "usage": _usage(gen.summary), "mtp": stats}
    return JSONResponse(out, headers=mtp_headers(stats))


def _with_max(req: GenRequest, n: int) -> GenRequest:
    return replace(req, max_tokens=n)


def _cchunk(meta: dict, text: str, finish=None, **extra) -> str:
    return sse.data({**meta, "object": "text_completion", "choices": [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra})


async def _completion_stream(gen: Generation, meta: dict, usage: bool):
    async for ev in gen.events():
        if ev.text:
            yield _cchunk(meta, ev.text)
    stats = mtp_stats(gen.summary, gen.req.depth, gen.queued_s)
    yield _cchunk(meta, "", FINISH.get(gen.summary.finish_reason if gen.summary else None),
                  mtp=stats)
    if usage:
        yield sse.data({**meta, "object": "text_completion", "choices": [],
                        "usage": _usage(gen.summary), "mtp": stats})
    yield sse.DONE
