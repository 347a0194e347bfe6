"""``McpHost``: the app's MCP client sessions, on one asyncio thread of their own (not the UI
thread, not the engine's worker). No Qt.

Contract
--------
- Nothing runs and ``mcp`` is not imported until ``configure(specs)`` is first called with a
  server to start (the SDK takes about 0.8 s to import): a chat without tools pays nothing.
- ``configure(specs)`` starts the servers that are new or changed, stops those gone;
  ``restart(name)`` stops and starts one. Each server's ``ServerState`` (status ``starting`` /
  ``ready`` / ``error`` / ``stopped`` / ``disabled``, its tools, the last error) is read with
  ``states()``; every change calls ``on_change()`` (from the host thread).
- A stdio server's stderr goes to ``<log_dir>/mcp-<name>.log``; when it fails or exits, the
  state's error ends with that file's last line. A server that dies is noticed by the call
  that found it gone, or by a ping every ``PING_S`` seconds.
- ``call(server, tool, arguments, timeout_s)`` -> ``concurrent.futures.Future[CallResult]``:
  never raises; a tool error, a timeout, a dead server become ``CallResult(is_error=True)``
  with a one-line text. ``future.cancel()`` cancels the call. The built-in tools (server
  ``app.tools.builtin.SERVER``) run here too, in a thread of the host's loop.
- ``shutdown()`` stops every server (their processes end) and the thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.tools import builtin
from app.tools.config import ServerSpec

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0   # npx may download its package on first use
PING_S = 5.0
PING_TIMEOUT_S = 10.0
MAX_RESULT_CHARS = 16_000


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str = ""
    schema: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ServerState:
    name: str
    status: str = "stopped"
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""
    detail: str = ""  # the command line or URL


@dataclass(frozen=True)
class CallResult:
    text: str
    is_error: bool = False
    seconds: float = 0.0


class ServerGone(RuntimeError):
    """The server's connection ended."""


@dataclass(eq=False)
class _Conn:
    spec: ServerSpec
    stop: asyncio.Event
    wake: asyncio.Event
    task: asyncio.Task | None = None
    session: object = None
    broken: str = ""


def first_line(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    return next((ln for ln in reversed(lines) if ln), "")[:300]


def result_text(result) -> tuple[str, bool]:
    """(text, is_error) of an MCP ``CallToolResult`` (SDK 1.x or 2.x field names)."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if getattr(block, "text", None) is not None:
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'}: {getattr(block, 'mime_type', '') or ''}]".strip())
    structured = getattr(result, "structured_content", getattr(result, "structuredContent", None))
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[… cut at {MAX_RESULT_CHARS:,} characters]"
    is_error = bool(getattr(result, "is_error", getattr(result, "isError", False)))
    return text, is_error


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class McpHost:
    def __init__(self, *, log_dir: Path, on_change: Callable[[], None] = lambda: None) -> None:
        self.log_dir = Path(log_dir)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._states: dict[str, ServerState] = {}
        self._conns: dict[str, _Conn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- any thread ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._loop is not None

    def states(self) -> dict[str, ServerState]:
        with self._lock:
            return dict(self._states)

    def configure(self, specs: dict[str, ServerSpec]) -> None:
        with self._lock:
            for name in list(self._states):
                if name not in specs:
                    del self._states[name]
            for name, spec in specs.items():
                old = self._states.get(name)
                status = "disabled" if spec.disabled else (old.status if old else "starting")
                self._states[name] = ServerState(name, status, old.tools if old else (),
                                                 old.error if old else "", spec.describe())
        if not self.running and not any(not s.disabled for s in specs.values()):
            self.on_change()
            return
        self._submit(self._configure(dict(specs)))
        self.on_change()

    def restart(self, name: str) -> None:
        if self.running:
            self._submit(self._restart(name))

    def call(self, server: str, tool: str, arguments: dict,
             timeout_s: float) -> concurrent.futures.Future:
        return self._submit(self._call(server, tool, dict(arguments), float(timeout_s)))

    def shutdown(self, timeout_s: float = 8.0) -> None:
        loop = self._loop
        if loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._stop_all(), loop)
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            fut.result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._loop = self._thread = None

    # -- the host thread -------------------------------------------------------------------
    def _submit(self, coro) -> concurrent.futures.Future:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()
                loop.close()

            self._thread = threading.Thread(target=run, name="mcp-host", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _set(self, name: str, **changes) -> None:
        with self._lock:
            old = self._states.get(name)
            if old is None:
                return
            self._states[name] = replace(old, **changes)
        self.on_change()

    async def _configure(self, specs: dict[str, ServerSpec]) -> None:
        for name, conn in list(self._conns.items()):
            if specs.get(name) != conn.spec:
                await self._stop(name)
        for name, spec in specs.items():
            if name not in self._conns and not spec.disabled:
                self._start(spec)

    async def _restart(self, name: str) -> None:
        conn = self._conns.get(name)
        spec = conn.spec if conn else None
        await self._stop(name)
        if spec is None:
            return
        self._set(name, status="starting", error="", tools=())
        self._start(spec)

    def _start(self, spec: ServerSpec) -> None:
        conn = _Conn(spec, asyncio.Event(), asyncio.Event())
        self._conns[spec.name] = conn
        conn.task = asyncio.get_running_loop().create_task(self._serve(conn))

    async def _stop(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is None or conn.task is None:
            return
        conn.stop.set()
        conn.wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(conn.task), 10)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - stopping must not fail
            conn.task.cancel()

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(name) for name in list(self._conns)))

    def errlog(self, name: str) -> Path:
        return self.log_dir / f"mcp-{_safe(name)}.log"

    async def _serve(self, conn: _Conn) -> None:
        name = conn.spec.name
        self._set(name, status="starting", error="")
        try:
            async with contextlib.AsyncExitStack() as stack:
                conn.session = await self._connect(conn.spec, stack)
                async with asyncio.timeout(START_TIMEOUT_S):
                    await conn.session.initialize()
                    tools = await self._list_tools(conn.session)
                self._set(name, status="ready", tools=tools, error="")
                await self._watch(conn)
        except Exception as exc:  # noqa: BLE001 - any failure is the server's state
            if not conn.stop.is_set():
                self._set(name, status="error", error=self._describe(conn, exc), tools=())
                log.warning("MCP server %s: %s", name, self._describe(conn, exc))
                return
        finally:
            conn.session = None
        if conn.stop.is_set():
            self._set(name, status="stopped")

    def _describe(self, conn: _Conn, exc: BaseException) -> str:
        text = conn.broken or first_line(exc)
        if isinstance(exc, TimeoutError) and not conn.broken:
            text = f"did not start within {START_TIMEOUT_S:g} s"
        if isinstance(exc, FileNotFoundError):
            text = f"{conn.spec.command}: command not found"
        tail = last_line(self.errlog(conn.spec.name)) if conn.spec.kind == "stdio" else ""
        return f"{text} — stderr: {tail}" if tail and tail not in text else text

    async def _connect(self, spec: ServerSpec, stack: contextlib.AsyncExitStack):
        from mcp import ClientSession

        if spec.kind == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            self.log_dir.mkdir(parents=True, exist_ok=True)
            errlog = stack.enter_context(self.errlog(spec.name).open("w", encoding="utf-8"))
            params = StdioServerParameters(command=spec.command, args=list(spec.args),
                                           env=dict(spec.env) or None)
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        else:
            from mcp.client.streamable_http import streamable_http_client

            try:
                from mcp.shared._httpx_utils import create_mcp_http_client
                client = create_mcp_http_client(headers=dict(spec.headers))
            except ImportError:  # pragma: no cover - an SDK without the helper
                import httpx2
                client = httpx2.AsyncClient(headers=dict(spec.headers))
            await stack.enter_async_context(client)
            streams = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=client))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))

    @staticmethod
    async def _list_tools(session) -> tuple[ToolInfo, ...]:
        result = await session.list_tools()
        out = []
        for t in result.tools:
            schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}
            out.append(ToolInfo(t.name, t.description or "", dict(schema)))
        return tuple(out)

    async def _watch(self, conn: _Conn) -> None:
        """Returns when the server is to stop; raises when it is gone."""
        while not conn.stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_S):
                    await conn.wake.wait()
            conn.wake.clear()
            if conn.stop.is_set():
                return
            if conn.broken:
                raise ServerGone(conn.broken)
            try:
                async with asyncio.timeout(PING_TIMEOUT_S):
                    await conn.session.send_ping()
            except Exception as exc:  # noqa: BLE001
                conn.broken = f"the server stopped answering ({first_line(exc)})"
                raise ServerGone(conn.broken) from exc

    async def _call(self, server: str, tool: str, arguments: dict,
                    timeout_s: float) -> CallResult:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                text, is_error = await self._dispatch(server, tool, arguments)
        except TimeoutError:
            text, is_error = f"The tool {tool} did not answer within {timeout_s:g} s.", True
        except ServerGone as exc:
            text, is_error = f"The call failed: {exc}", True
        return CallResult(text, is_error, round(time.monotonic() - t0, 3))

    async def _dispatch(self, server: str, tool: str, arguments: dict) -> tuple[str, bool]:
        if server == builtin.SERVER:
            return await asyncio.to_thread(builtin.call_builtin, tool, arguments)
        conn = self._conns.get(server)
        if conn is None or conn.session is None or conn.broken:
            state = self.states().get(server)
            why = f"{state.status}{': ' + state.error if state and state.error else ''}" \
                if state else "not configured"
            raise ServerGone(f"the server {server} is not running ({why})")
        try:
            result = await conn.session.call_tool(tool, arguments)
        except Exception as exc:  # noqa: BLE001 - the connection or the protocol failed
            if await self._alive(conn):
                return f"The tool {tool} failed: {first_line(exc)}", True
            conn.broken = f"the server exited ({first_line(exc)})"
            conn.wake.set()
            raise ServerGone(self._describe(conn, exc)) from exc
        return result_text(result)

    @staticmethod
    async def _alive(conn: _Conn) -> bool:
        try:
            async with asyncio.timeout(2):
                await conn.session.send_ping()
            return True
        except Exception:  # noqa: BLE001
            return False
