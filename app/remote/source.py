"""``RemoteSource``: the chat's replies from a model served elsewhere.

It is the second implementation of what ``app.chat.session.ChatSession`` asks of the worker
(``app.worker.Worker``): ``submit(GenerationRequest)``, ``cancel(request_id)`` and the
signals ``delta(request_id, text, token_ids, from_draft)``, ``stats(request_id, obj)``,
``finished(request_id, reason, summary)`` and ``failed(request_id, message)``, with the same
meanings; only the per-cycle ``stats`` never come (a server sends its figures once, at the
end, in the summary). Replies run on one asyncio loop in a thread of their own
(``app.remote.reply.stream_reply`` over httpx), so the UI never waits on the network; Stop
cancels the reply's task, which closes its HTTP stream at once.

``use(connection, model)`` picks where the next replies go.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from PySide6.QtCore import QObject, Signal

from app.remote.connections import Connection
from app.remote.reply import ReplyFailed, ReplyState, measured_summary, new_client, stream_reply

log = logging.getLogger(__name__)


class RemoteSource(QObject):
    delta = Signal(int, str, object, object)
    stats = Signal(int, object)
    finished = Signal(int, str, object)
    failed = Signal(int, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.connection: Connection | None = None
        self.model = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client = None
        self._tasks: dict[int, asyncio.Task] = {}
        self._lock = threading.Lock()

    def use(self, connection: Connection, model: str) -> None:
        self.connection, self.model = connection, model

    # -- the worker's interface ----------------------------------------------------------------
    def submit(self, request) -> None:
        conn, model = self.connection, self.model
        if conn is None:
            self.failed.emit(request.request_id, "No server is connected.")
            return
        loop = self._ensure_loop()
        asyncio.run_coroutine_threadsafe(self._run(conn, model, request), loop)

    def cancel(self, request_id: int) -> None:
        with self._lock:
            task = self._tasks.get(request_id)
        if task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(task.cancel)

    def cancel_all(self) -> None:
        with self._lock:
            ids = list(self._tasks)
        for rid in ids:
            self.cancel(rid)

    def shutdown(self) -> None:
        """Cancel every reply, close the HTTP client and end the loop and its thread."""
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        self.cancel_all()
        try:
            asyncio.run_coroutine_threadsafe(self._close_client(), loop).result(5)
        except Exception as exc:  # noqa: BLE001 - quitting goes on
            log.warning("closing the remote client: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = None

    async def _close_client(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the loop's thread ---------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name="remote-replies")
            self._thread.start()
        return self._loop

    async def _run(self, conn: Connection, model: str, req) -> None:
        rid = req.request_id
        with self._lock:
            self._tasks[rid] = asyncio.current_task()
        if self._client is None:
            self._client = new_client()
        state = ReplyState()
        try:
            summary = await stream_reply(
                self._client, conn, model, req,
                lambda text: self.delta.emit(rid, text, [0], []), state)
            self.finished.emit(rid, summary.finish_reason or "stop", summary)
        except asyncio.CancelledError:  # Stop: the figures of what streamed until then
            self.finished.emit(rid, "cancelled",
                               measured_summary(state, "cancelled", time.perf_counter()))
        except ReplyFailed as exc:
            self.failed.emit(rid, str(exc))
        except Exception as exc:  # noqa: BLE001 - nothing escapes a reply
            log.exception("remote reply %s failed", rid)
            self.failed.emit(rid, f"The reply from {conn.host} failed: {exc}")
        finally:
            with self._lock:
                self._tasks.pop(rid, None)
