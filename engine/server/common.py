"""What both APIs share: the backend state, parameter checks, the bridge from the scheduler's
worker thread to the event loop, and the speculation stats every response carries.

Contract:
- ``Backend`` holds the scheduler, the loaded model's id and names it answers to, and the
  server defaults (``--depth``). ``resolve_model(name)`` raises ``ApiError(404)`` for a
  name that is neither the loaded model nor (``alias_prefixes``) an alias for it.
- Parameter helpers raise ``ApiError(400)`` naming the parameter.
- ``Generation`` submits one ``GenRequest`` and turns the worker's items into an async
  stream of ``Event`` objects on the loop. ``await gen.start(request)`` returns once the first
  event (prefill + first token) exists, so engine errors found up front (prompt too long,
  bad depth) become 4xx responses before any byte is sent; a full queue raises 429 with
  ``Retry-After``. While waiting it watches for the client going away and cancels then.
  ``gen.close()`` cancels the generation if it has not finished (call it in ``finally``).
  A client that goes away raises ``ClientGone`` (an ``ApiError``: no traceback, one info
  line). A reply that ends without finishing raises ``ApiError`` from ``events()`` instead of
  ending like a finished one: the grammar failed mid-reply (400, ``engine.sampling.grammar``), or the
  server cancelled it (503: it is draining or changed models).
- ``mtp_stats(summary, depth)`` / ``mtp_headers(...)``: the ``"mtp"`` extension object and
  ``x-mtp-*`` headers, all figures from ``engine.metrics.summary.ReplySummary``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from concurrent.futures import ThreadPoolExecutor

from engine.core.scheduler import (
    Done, Failed, GenRequest, QueueFull, Scheduler, SchedulerClosed, Started)
from engine.errors import PromptTooLongError
from engine.metrics.summary import ReplySummary
from engine.server.errors import ApiError, bad_request, from_engine_error
from engine.types import MAX_DEPTH, Depth, Event, ModelInfo, SamplingParams

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


@dataclass
class Backend:
    scheduler: Scheduler
    info: ModelInfo
    default_depth: Depth = "auto"
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    alias_prefixes: tuple[str, ...] = ("claude-", "gpt-", "default")
    accepting: bool = True      # False once the server drains: new generations get 503
    # images in requests: limits, remote URLs (``engine.server.images.ImagePolicy``)
    images: object = field(default_factory=lambda: _image_policy())
    # Prompt rendering runs here, off the event loop; the runner shuts it down on exit (a
    # daemon thread left inside the tokenizer at exit can abort the process).
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=2, thread_name_prefix="mtp-tokenize"))

    @property
    def model_id(self) -> str:
        return self.info.name

    def resolve_model(self, name: object) -> str:
        if name is None or name == "":
            return self.model_id
        if not isinstance(name, str):
            raise bad_request("model must be a string", "model")
        if name in (self.model_id, self.info.path) or name.startswith(self.alias_prefixes):
            return self.model_id
        raise ApiError(404, f"The model {name!r} is not loaded. This server serves "
                            f"{self.model_id!r} (restart it with --model to serve another).",
                       param="model", code="model_not_found")

    async def decode_images(self, messages: list[dict], param: str) -> list[dict]:
        """``messages`` with their image parts decoded on a worker thread
        (``engine.server.images.collect``: limits, remote URLs, a model without vision)."""
        from engine.server import images

        if not images.has_images(messages):
            return messages
        images.refuse_without_vision(self.info, param)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, images.collect, messages,
                                          self.images, self.info, param)

    async def tokenize(self, fn):
        """``fn(model)`` on a worker thread, between cycles (see ``Scheduler.with_tokenizer``);
        a template or tokenizer error is the request's fault (400)."""
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self.scheduler.with_tokenizer, fn)
        except ApiError:
            raise
        except PromptTooLongError as exc:
            raise from_engine_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - jinja/tokenizer errors name the problem
            raise bad_request(f"The prompt could not be rendered: {exc}") from None

    def depth_for(self, body: dict) -> Depth:
        ext = body.get("mtp")
        depth = self.default_depth
        if ext is not None:
            if not isinstance(ext, dict):
                raise bad_request("mtp must be an object such as {\"depth\": \"auto\"}", "mtp")
            depth = ext.get("depth", depth)
        if depth != "auto" and (isinstance(depth, bool) or not isinstance(depth, int)
                                or not 0 <= depth <= MAX_DEPTH):
            raise bad_request(f"mtp.depth must be \"auto\" or an integer 0..{MAX_DEPTH}",
                              "mtp.depth")
        if not self.info.has_mtp and depth == "auto":
            return 0
        return depth


# ---------------------------------------------------------------------- parameter checks

def _image_policy():
    from engine.server.images import ImagePolicy

    return ImagePolicy()


def number(body: dict, key: str, default, *, lo=None, hi=None, integer: bool = False,
           lo_open: bool = False):
    value = body.get(key)
    if value is None:
        return default
    ok_type = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type):
        raise bad_request(f"{key} must be {'an integer' if integer else 'a number'}", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"{key} must be a finite number, not {value}", key)
    if (lo is not None and (value < lo or (lo_open and value == lo))) or \
            (hi is not None and value > hi):
        if hi is None:
            span = f"{'above' if lo_open else 'at least'} {lo}"
        elif lo is None:
            span = f"at most {hi}"
        else:
            span = f"in {'(' if lo_open else '['}{lo}, {hi}]"
        raise bad_request(f"{key} must be {span}, not {value}", key)
    return value


def refuse_fields(body: dict, accepted: dict[str, tuple], prefix: str = "") -> None:
    """A 400 for a field that would change the reply but is not supported: ``accepted`` maps
    each such field to the values that leave the reply as it is (absent is ``None``)."""
    for key, ok in accepted.items():
        value = body.get(key)
        if value not in ok:
            shown = json.dumps(value)[:80] if _jsonable(value) else type(value).__name__
            raise bad_request(f"{prefix}{key} = {shown} is not supported by this server (it "
                              f"would change the reply); leave it out", prefix + key)


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def sampling_from(body: dict, *, max_temperature: float) -> SamplingParams:
    top_k = number(body, "top_k", 0, integer=True, lo=-1)
    return SamplingParams(
        temperature=float(number(body, "temperature", 1.0, lo=0, hi=max_temperature)),
        top_p=float(number(body, "top_p", 1.0, lo=0, hi=1, lo_open=True)),
        top_k=max(0, top_k),
        min_p=float(number(body, "min_p", 0.0, lo=0, hi=0.999999)),
        presence_penalty=float(number(body, "presence_penalty", 0.0, lo=-2, hi=2)),
        frequency_penalty=float(number(body, "frequency_penalty", 0.0, lo=-2, hi=2)))


def stop_strings(body: dict, key: str) -> tuple[str, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise bad_request(f"{key} must be a non-empty string or a list of them", key)
    return tuple(value)


def seed_of(body: dict) -> int | None:
    return number(body, "seed", None, integer=True)


# ---------------------------------------------------------------------- worker -> loop bridge

class ClientGone(ApiError):
    """The client disconnected; its generation was cancelled. An ``ApiError`` so the app
    answers it (to nobody) without logging a crash; 499 is nginx's "client closed request"."""

    def __init__(self) -> None:
        super().__init__(499, "The client closed the connection.")


class Generation:
    """One request's stream of events on the event loop; see the module docstring."""

    def __init__(self, backend: Backend, req: GenRequest) -> None:
        self.backend = backend
        self.req = req
        self.loop = asyncio.get_running_loop()
        self._items: asyncio.Queue = asyncio.Queue()
        self.first: Event | None = None
        self.summary: ReplySummary | None = None
        self.queued_s = 0.0
        self.finished = False

    def _sink(self, item) -> None:
        self.loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def start(self, request) -> Event:
        if not self.backend.accepting:
            raise ApiError(503, "The server is shutting down.")
        try:
            self.backend.scheduler.submit(self.req, self._sink)
        except QueueFull as exc:
            raise ApiError(429, f"The server is busy ({exc}); retry shortly.",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        except SchedulerClosed as exc:
            raise ApiError(503, f"The server is shutting down ({exc}).") from None
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            while self.first is None:
                item = await self._next(watcher)
                if isinstance(item, Event):
                    self.first = item
        finally:
            watcher.cancel()
        if self.first.finish_reason == "cancelled":  # cancelled while queued: nothing to send
            raise self._cancelled()
        return self.first

    async def events(self, request=None) -> AsyncIterator[Event]:
        """The first event again, then the rest until the reply ends."""
        assert self.first is not None
        yield self.first
        watcher = asyncio.ensure_future(_wait_disconnect(request)) if request else None
        try:
            while True:
                item = await self._next(watcher)
                if isinstance(item, Event):
                    yield item
                elif isinstance(item, Done):
                    self.summary, self.finished = item.summary, True
                    self._check_end()
                    return
        finally:
            if watcher is not None:
                watcher.cancel()

    def _check_end(self) -> None:
        """Raise for a reply that ended without finishing (see the module docstring)."""
        error = getattr(self.req.response_format, "error", None)
        if error is not None:
            log.info("request %s: the grammar failed mid-reply: %s", self.req.id, error)
            raise ApiError(400, f"The reply could not follow the JSON schema (the grammar "
                                f"failed after {self.summary.tokens} tokens: {error}). "
                                "Simplify the schema.", code="grammar_failed",
                           param="response_format")
        if self.summary.finish_reason == "cancelled":
            raise self._cancelled()

    def _cancelled(self) -> ApiError:
        """The server cancelled the reply (our own ``close`` never gets this far)."""
        tokens = self.summary.tokens if self.summary else 0
        why = ("it is shutting down" if not self.backend.accepting
               else "its model was changed or unloaded")
        log.info("request %s: cancelled by the server (%s) after %d tokens",
                 self.req.id, why, tokens)
        return ApiError(503, f"The server cancelled the reply after {tokens} tokens: {why}.",
                        code="cancelled")

    async def _next(self, watcher):
        if watcher is None:
            item = await self._items.get()
        else:
            getter = asyncio.ensure_future(self._items.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                self.close()
                log.info("request %s: the client went away (%s); cancelled", self.req.id,
                         "while queued" if self.first is None else "mid-reply")
                raise ClientGone()
            item = getter.result()
        if isinstance(item, Started):
            self.queued_s = item.waited_s
        elif isinstance(item, Failed):
            self.finished = True
            raise from_engine_error(item.error)
        elif isinstance(item, Done):
            self.summary, self.finished = item.summary, True
            if self.first is None:
                raise ApiError(500, "The engine ended the reply without any event.")
        return item

    def close(self) -> None:
        if not self.finished:
            self.req.cancel.set()


async def _wait_disconnect(request) -> None:
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


# ---------------------------------------------------------------------- speculation stats

def mtp_stats(summary: ReplySummary | None, depth: Depth, queued_s: float = 0.0) -> dict:
    if summary is None:
        return {"depth": depth}
    def r(x):
        return None if x is None else round(x, 4)
    return {
        "depth": depth, "tokens_per_s": r(summary.tokens_per_s),
        "tokens_per_cycle": r(summary.tokens_per_cycle),
        "acceptance_by_position": [r(p.rate) for p in summary.positions],
        # the counts behind the rates, so a client can add replies up exactly (the app's
        # remote models: ``app.remote.reply.summary_from_mtp``)
        "drafted_by_position": [p.drafted for p in summary.positions],
        "reached_by_position": [p.reached for p in summary.positions],
        "accepted_by_position": [p.accepted for p in summary.positions],
        "draft_acceptance": r(summary.draft_acceptance), "cycles": summary.cycles,
        "drafted": summary.drafted, "accepted": summary.accepted,
        "ttft_s": r(summary.ttft_s), "queued_s": r(queued_s),
        "batch_max": summary.batch_max,
        "prompt_tokens": summary.prompt_tokens, "reused_prompt_tokens": summary.reused_tokens,
        "completion_tokens": summary.tokens, "finish_reason": summary.finish_reason,
    }


def mtp_headers(stats: dict) -> dict[str, str]:
    acc = ",".join("" if a is None else f"{a:.3f}" for a in stats.get("acceptance_by_position", []))
    return {"x-mtp-depth": str(stats.get("depth")),
            "x-mtp-tokens-per-second": f"{stats.get('tokens_per_s') or 0:.2f}",
            "x-mtp-tokens-per-cycle": f"{stats.get('tokens_per_cycle') or 0:.3f}",
            "x-mtp-acceptance": acc,
            "x-mtp-ttft-ms": f"{(stats.get('ttft_s') or 0) * 1000:.1f}",
            "x-mtp-reused-prompt-tokens": str(stats.get("reused_prompt_tokens", 0))}
