"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``.

Contract (SERVER.md; where it is silent, the official ``openai`` package's
``types/responses`` and its stream accumulator, which checks every event against the ones
before it):
- Request: ``input`` (a string, or a list of items: messages with ``input_text`` /
  ``output_text`` parts, ``function_call``, ``function_call_output``, ``reasoning``),
  ``instructions`` (a system message for this request only: those of a previous response are
  not carried over, as OpenAI does), ``previous_response_id`` (the stored conversation is put
  before ``input``), ``tools`` (flat function tools), ``tool_choice`` (auto, none, required or
  ``{type: function, name}``: a forced call follows a grammar), ``parallel_tool_calls`` (false:
  at most one call), ``max_tool_calls``, ``text.format`` (``json_schema`` / ``json_object``:
  the reply follows the schema through a token mask, thinking off), ``max_output_tokens``,
  ``reasoning.effort`` (``none`` turns thinking off, any other level on), ``temperature``,
  ``top_p``, ``stream``, ``store`` (default true) and the ``mtp`` extension. A field that would
  change the reply but is not supported (``REFUSED``: background, conversation, prompt
  templates, context management, hosted tools, logprobs, a verbosity other than medium) is a
  400 in OpenAI's error shape; fields that leave the reply as it is (metadata, user,
  prompt_cache_key, service_tier, truncation, ...) are ignored.
- Output: a ``response`` object whose ``output`` holds, in order, a ``reasoning`` item (the
  think block as ``reasoning_text`` content; also as the ``summary`` when one is asked for:
  the local model writes no separate summary), a ``message`` with one ``output_text`` part,
  and ``function_call`` items (``call_id``, JSON ``arguments``). A reply cut by
  ``max_output_tokens`` is ``status: "incomplete"``. ``usage`` counts tokens; ``mtp`` holds
  the speculation stats (also as ``x-mtp-*`` headers when not streamed).
- Streaming: ``response.created``, ``response.in_progress``, then per item
  ``response.output_item.added``, its deltas (``response.reasoning_text.delta``,
  ``response.content_part.added`` / ``response.output_text.delta`` / ``.done`` /
  ``response.content_part.done``, ``response.function_call_arguments.delta`` / ``.done``) and
  ``response.output_item.done``; last ``response.completed`` (or ``response.incomplete``),
  every event numbered by ``sequence_number``. A reply that fails mid-way ends with an
  ``error`` event and ``response.failed``.
- Stored responses (``ResponseStore``) live in memory only, at most ``max_items`` of them and
  ``max_chars`` of their JSON text together, each for ``ttl_s`` seconds; an unknown or expired
  ``previous_response_id`` is a 400
  (``previous_response_not_found``).
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.server import sse
from engine.server.common import (
    Backend, Generation, mtp_headers, mtp_stats, new_id, number, refuse_fields)
from engine.server.constraints import ToolUse, constraint_of, max_calls_of, openai_tool_use
from engine.server.errors import ApiError, bad_request
from engine.server.openai_api import gen_request, read_json, refuse_logprobs, thinking_flag
from engine.server.reply_parts import ReplyParser
from engine.server.responses_items import (
    OutputItems, input_messages, output_messages, tools_of)
from engine.server.templates import chat_prompt_ids, prompt_opens_think
from engine.server.toolcalls import schemas_of

MAX_STORED = 200        # responses kept for previous_response_id ...
STORED_TTL_S = 3600.0   # ... each for an hour at most ...
MAX_STORED_CHARS = 32_000_000  # ... and their conversations' text, all together, at most this
REFUSED = {"background": (None, False), "background_options": (None,), "conversation": (None,),
           "prompt": (None,), "context_management": (None, []), "moderation": (None,),
           "image": (None,), "input_transformations": (None, []), "access_programs": (None,)}
INCLUDABLE_REFUSED = ("message.output_text.logprobs",)


@dataclass
class Stored:
    messages: list[dict]   # the conversation up to and including the reply (no instructions)
    response: dict         # the response object as it was returned
    expires: float
    chars: int             # the size it is counted at (JSON text of both)


class ResponseStore:
    """Finished responses by id, in memory: at most ``max_items`` and ``max_chars`` of JSON
    text together (the oldest go first), each for ``ttl_s`` seconds."""

    def __init__(self, max_items: int = MAX_STORED, ttl_s: float = STORED_TTL_S,
                 clock=time.monotonic, max_chars: int = MAX_STORED_CHARS) -> None:
        self.max_items, self.ttl_s, self.clock = max_items, ttl_s, clock
        self.max_chars = max_chars
        self.chars = 0
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def put(self, rid: str, messages: list[dict], response: dict) -> None:
        self._expire()
        size = len(json.dumps(messages)) + len(json.dumps(response))
        if size > self.max_chars:
            return  # (one over the whole bound is not kept: previous_response_id then 400s)
        self.delete(rid)
        self._items[rid] = Stored(messages, response, self.clock() + self.ttl_s, size)
        self.chars += size
        while len(self._items) > self.max_items or self.chars > self.max_chars:
            self.chars -= self._items.popitem(last=False)[1].chars

    def get(self, rid: str) -> Stored | None:
        self._expire()
        return self._items.get(rid)

    def delete(self, rid: str) -> bool:
        found = self._items.pop(rid, None)
        if found is not None:
            self.chars -= found.chars
        return found is not None

    def _expire(self) -> None:
        now = self.clock()
        for rid in [r for r, s in self._items.items() if s.expires <= now]:
            self.delete(rid)


# ---------------------------------------------------------------------- request

def refuse_unsupported(body: dict) -> None:
    refuse_fields(body, REFUSED)
    refuse_logprobs(body)
    include = body.get("include") or []
    if not isinstance(include, list):
        raise bad_request("include must be a list", "include")
    for name in include:
        if name in INCLUDABLE_REFUSED:
            raise bad_request(f"include {name!r} is not supported by this server", "include")
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad_request("text must be an object such as {\"format\": {\"type\": \"text\"}}",
                          "text")
    refuse_fields(text or {}, {"verbosity": (None, "medium")}, prefix="text.")


def tool_use_of(body: dict) -> ToolUse:
    tools, choice = tools_of(body.get("tools")), body.get("tool_choice")
    max_calls = max_calls_of(body.get("parallel_tool_calls"), "parallel_tool_calls")
    most = number(body, "max_tool_calls", None, integer=True, lo=1)
    if most is not None:
        max_calls = min(most, max_calls or most)
    named = isinstance(choice, dict) and choice.get("type") == "function" and \
        isinstance(choice.get("name"), str)
    return openai_tool_use(
        tools, choice, choice["name"] if named else None, max_calls,
        "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...} "
        "(hosted tools and allowed_tools are not supported)")


def _reasoning(body: dict) -> dict:
    value = body.get("reasoning")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("reasoning must be an object such as {\"effort\": \"low\"}",
                          "reasoning")
    return value


def _history(store: ResponseStore, body: dict) -> list[dict]:
    prev = body.get("previous_response_id")
    if prev is None:
        return []
    found = store.get(prev) if isinstance(prev, str) else None
    if found is None:
        raise ApiError(400, f"Previous response with id {prev!r} not found (responses are kept "
                            f"in memory for {store.ttl_s / 60:g} minutes, the last "
                            f"{store.max_items}).", param="previous_response_id",
                       code="previous_response_not_found")
    return found.messages


@dataclass
class Plan:
    """One request, read: what to render and how to report it."""

    body: dict
    model: str
    history: list[dict]     # previous conversation + this input (no instructions)
    use: ToolUse
    summary: bool           # reasoning.summary was asked for


async def _plan(request: Request, backend: Backend) -> Plan:
    body = await read_json(request)
    model = backend.resolve_model(body.get("model"))
    refuse_unsupported(body)
    history = _history(request.app.state.responses, body) + input_messages(body.get("input"))
    if not history:
        raise bad_request("input must not be empty", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", "instructions")
    reasoning = _reasoning(body)
    thinking_flag(body, reasoning.get("effort"), "reasoning.effort")  # a 400 before compiling
    return Plan(body, model, history, tool_use_of(body), reasoning.get("summary") is not None)


# ---------------------------------------------------------------------- routes

async def create(request: Request):
    backend: Backend = request.app.state.backend
    plan = await _plan(request, backend)
    body, use = plan.body, plan.use
    fmt = await use.constraint(backend, "tool_choice") or \
        await constraint_of(backend, {"text.format": (body.get("text") or {}).get("format")},
                            "text.format")
    thinking = False if fmt else thinking_flag(body, _reasoning(body).get("effort"),
                                               "reasoning.effort")
    messages = await backend.decode_images(plan.history, "input")
    if body.get("instructions"):
        messages = [{"role": "system", "content": body["instructions"]}] + messages

    def render(m):
        ids = chat_prompt_ids(m, messages, tools=use.tools, enable_thinking=thinking)
        return ids, prompt_opens_think(m, ids)

    ids, opened = await backend.tokenize(render)
    req = replace(gen_request(backend, body, ids, max_key="max_output_tokens"),
                  response_format=fmt)
    parser = ReplyParser(opened_think=opened, max_calls=use.max_calls,
                         schemas=schemas_of(use.tools) if use.tools is not None else None)
    gen = Generation(backend, req)
    await gen.start(request)
    reply = _Reply(plan, gen, parser, request.app.state.responses)
    if body.get("stream"):
        return sse.stream(gen, reply.stream(), error=reply.error_event)
    return await reply.once(request)


async def retrieve(request: Request) -> JSONResponse:
    store: ResponseStore = request.app.state.responses
    found = store.get(request.path_params["response_id"])
    if found is None:
        raise ApiError(404, f"No response with id {request.path_params['response_id']!r} (they "
                            "are kept in memory for a bounded time).", code="not_found")
    return JSONResponse(found.response)


async def delete(request: Request) -> Response:
    store: ResponseStore = request.app.state.responses
    rid = request.path_params["response_id"]
    if not store.delete(rid):
        raise ApiError(404, f"No response with id {rid!r}.", code="not_found")
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


# ---------------------------------------------------------------------- reply

class _Reply:
    """One response: its object, its items as they are made, and how it ends."""

    def __init__(self, plan: Plan, gen: Generation, parser: ReplyParser,
                 store: ResponseStore) -> None:
        self.plan, self.gen, self.parser, self.store = plan, gen, parser, store
        self.id = new_id("resp_")
        self.created = int(time.time())
        self.items = OutputItems(summary=plan.summary)
        self.seq = 0
        self.reasoning_tokens = 0

    def _event(self, kind: str, **fields) -> str:
        obj = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return sse.event(kind, obj)

    def error_event(self, err: ApiError) -> str:
        """A reply that failed mid-way: an ``error`` event, then ``response.failed``."""
        out = self.response("failed")
        out["error"] = {"code": "server_error" if err.status >= 500 else "invalid_prompt",
                        "message": err.message}
        return self._event("error", code=err.code or "server_error", message=err.message,
                           param=err.param) + self._event("response.failed", response=out)

    def response(self, status: str) -> dict:
        body, use = self.plan.body, self.plan.use
        text = body.get("text") or {}
        out = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"), "model": self.plan.model,
            "output": self.items.done_items() if status != "in_progress" else [],
            "parallel_tool_calls": use.max_calls != 1,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": _reasoning(body).get("effort"),
                          "summary": _reasoning(body).get("summary")},
            "store": body.get("store") is not False,
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "text": {"format": text.get("format") or {"type": "text"},
                     "verbosity": text.get("verbosity", "medium")},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "truncation": body.get("truncation", "disabled"), "metadata": body.get("metadata"),
            "user": body.get("user"), "usage": None}
        if status == "in_progress":
            return out
        s = self.gen.summary
        p, c = (s.prompt_tokens, s.tokens) if s else (len(self.gen.req.prompt_ids), 0)
        out["usage"] = {"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                        "input_tokens_details": {"cached_tokens": s.reused_tokens if s else 0},
                        "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["completed_at"] = int(time.time()) if status == "completed" else None
        out["mtp"] = mtp_stats(s, self.gen.req.depth, self.gen.queued_s)
        return out

    def _status(self) -> str:
        s = self.gen.summary
        return "incomplete" if s is not None and s.finish_reason == "length" and \
            not self.parser.calls else "completed"

    def _feed(self, ev) -> list:
        if self.parser.thinking:
            self.reasoning_tokens += len(ev.token_ids)
        return self.parser.feed(ev.text) if ev.text else []

    def _finish(self) -> dict:
        out = self.response(self._status())
        if self.plan.body.get("store") is not False:
            self.store.put(self.id, self.plan.history + output_messages(out["output"]), out)
        return out

    async def once(self, request: Request) -> JSONResponse:
        async for ev in self.gen.events(request):
            for part in self._feed(ev):
                self.items.part(part)
        for part in self.parser.flush():
            self.items.part(part)
        self.items.finish(self._status() == "incomplete")
        out = self._finish()
        return JSONResponse(out, headers=mtp_headers(out["mtp"]))

    async def stream(self):
        yield self._event("response.created", response=self.response("in_progress"))
        yield self._event("response.in_progress", response=self.response("in_progress"))
        async for ev in self.gen.events():
            for part in self._feed(ev):
                for kind, fields in self.items.part(part):
                    yield self._event(kind, **fields)
        for part in self.parser.flush():
            for kind, fields in self.items.part(part):
                yield self._event(kind, **fields)
        for kind, fields in self.items.finish(self._status() == "incomplete"):
            yield self._event(kind, **fields)
        out = self._finish()
        done = "response.completed" if out["status"] == "completed" else "response.incomplete"
        yield self._event(done, response=out)
