"""``python -m app --self-test``: the real app, end to end, without a person.

Starts the main window (offscreen unless a platform is set), loads the default model (or
``--model PATH``) on the worker thread, sends one message through the composer, waits for the
streamed reply and its stats, checks that the reply on screen is the reply persisted in SQLite
(read back through a second connection) and that the stats line under it shows the worker's
``ReplySummary``, removes its test conversation and exits 0.
Any failure exits non-zero with the reason on stderr: 2 = model missing, 1 = a check failed.

``MTPCHAT_SELFTEST_FAKE=1`` swaps in the scripted fake engine (for the app's own tests only;
``MTPCHAT_SELFTEST_FAKE_TPS`` sets its speed, default 400 tokens/s);
``MTPCHAT_SELFTEST_TIMEOUT`` (seconds, default 600) bounds each wait.

The self-test neither depends on nor changes the user's saved state: the window runs with the
built-in defaults of every setting (chat defaults, preferences, window sizes, the local server,
which therefore never starts from a saved "serve whenever a model is loaded"), and what it
would save stays in memory (:func:`isolate_settings`). It still writes (and then erases) one
test conversation in the chat database: that a reply can be saved is what it checks.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, Slot

from app.chat import main_window as main_window_module
from app.chat.main_window import MainWindow
from app.chat.session import STORAGE_ERRORS
from app.chat.stats_line import format_stats
from app.db import ChatStore
from app.errors import describe
from app.fake.engine import FakeModel, make_fake_loader
from app.paths import default_model_path

log = logging.getLogger(__name__)

PROMPT = "Hello! Please introduce yourself in one sentence."


class SelfTestFailure(Exception):
    pass


def _say(msg: str) -> None:
    print(f"self-test: {msg}", file=sys.stderr, flush=True)


def run_self_test(args) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    fake = os.environ.get("MTPCHAT_SELFTEST_FAKE") == "1"
    path = str(args.model or default_model_path())
    if not fake and not Path(path).exists():
        _say(f"FAIL: model folder not found: {path}")
        return 2
    loader = None
    if fake:
        tps = float(os.environ.get("MTPCHAT_SELFTEST_FAKE_TPS", "400"))
        loader = make_fake_loader(FakeModel(tokens_per_second=tps))
        if not Path(path).exists():
            path = tempfile.mkdtemp(prefix="mtpchat-fake-model-")
        _say("using the scripted FAKE engine (MTPCHAT_SELFTEST_FAKE=1)")
    from app.qt_app import application

    application()
    try:
        window = _isolated_window(path, loader)
    except Exception as exc:
        log.debug("the window could not be built", exc_info=exc)
        _say(f"FAIL: the window could not be built: {describe(exc)}")
        return 1
    window.show()
    try:
        _check_store(window)
        report = _SelfTest(window, path).run()
    except SelfTestFailure as exc:
        _say(f"FAIL: {exc}")
        return 1
    except STORAGE_ERRORS as exc:  # the disk filled up or went read-only mid-test
        log.debug("the chat database failed", exc_info=exc)
        _say(f"FAIL: the chat database {window.store.path} failed: {exc}")
        return 1
    finally:
        window.close()
    _say("OK: " + report)
    print("self-test: OK")
    return 0


def isolate_settings(store):
    """Make ``store`` (a ``ChatStore``) read every app setting as unset (the built-in
    defaults) and keep what is set in memory only, never in the database; returns it."""
    session: dict = {}

    def get_setting(key, default=None):
        return session.get(key, default)

    def set_setting(key, value) -> None:
        session[key] = value

    store.get_setting = get_setting
    store.set_setting = set_setting
    store.isolated_settings = session
    return store


def _isolated_window(path: str, loader) -> MainWindow:
    """The main window over the user's chat database with its settings isolated (see the
    module docstring): ``MainWindow`` opens the store and reads the settings in its
    constructor, so its ``open_chat_store`` is wrapped while it is built."""
    original = main_window_module.open_chat_store

    def open_isolated(path_fn):
        store, notice = original(path_fn)
        return isolate_settings(store), notice

    main_window_module.open_chat_store = open_isolated
    try:
        return MainWindow(model_path=path, loader=loader, autoload=False)
    finally:
        main_window_module.open_chat_store = original


def _check_store(window) -> None:
    """The self-test checks that a reply is saved: a store that saves nothing (a read-only
    home, a full disk) fails it at once, with the store's own explanation."""
    if not window.store.persistent:
        notice = window.store_notice
        why = (notice.message if notice is not None
               else f"the chat database {window.store.path} cannot be written")
        raise SelfTestFailure(f"replies cannot be saved, so nothing can be checked: {why}")

class _SelfTest(QObject):
    def __init__(self, window, path: str) -> None:
        super().__init__()
        self.w = window
        self.path = path
        self.timeout = float(os.environ.get("MTPCHAT_SELFTEST_TIMEOUT", "600"))
        self.stats: list[object] = []
        self.events: dict[str, object] = {}

    def _wait(self, what: str, done) -> None:
        deadline = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() > deadline:
                raise SelfTestFailure(f"timed out after {self.timeout:.0f} s waiting for {what}")
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            time.sleep(0.005)

    def run(self) -> str:
        w = self.w
        w.worker.loaded.connect(self._on_loaded)
        w.worker.load_failed.connect(self._on_load_failed)
        w.worker.stats.connect(self._on_stats)
        w.worker.finished.connect(self._on_summary)
        w.session.stream_finished.connect(self._on_finished)
        t0 = time.monotonic()
        w.load_model(self.path)
        self._wait("the model to load", lambda: "loaded" in self.events or "load_failed" in self.events)
        if "load_failed" in self.events:
            raise SelfTestFailure(f"loading {self.path} failed: {self.events['load_failed']}")
        info = self.events["loaded"]
        _say(f"loaded {info.name} ({info.num_parameters:,} parameters, MTP={info.has_mtp}) "
             f"in {time.monotonic() - t0:.1f} s")
        conv = self._send()
        try:
            return self._check(conv, info)
        finally:
            try:
                w.store.erase_conversation(conv)
            except STORAGE_ERRORS as exc:  # not worth hiding the verdict for
                log.warning("could not remove the self-test's conversation: %s", exc)

    def _send(self) -> int:
        w = self.w
        conv = w.session.new_conversation()
        settings = replace(w.session.settings_for(conv), temperature=0.0, max_tokens=48,
                           thinking=False)
        w.store.set_conversation_settings(conv, settings.to_dict())
        w.chats.open_conversation(conv)
        w.composer.edit.setPlainText(PROMPT)
        if not w.composer.button.isEnabled():
            raise SelfTestFailure("the Send button is disabled after the model loaded")
        w.composer.button.click()
        if not w.session.streams:
            raise SelfTestFailure("sending did not start a reply")
        self._wait("the reply", lambda: "finished" in self.events)
        return conv

    def _check(self, conv: int, info) -> str:
        msg_id, status = self.events["finished"]
        if status != "done":
            msg = self.w.store.message(msg_id)
            raise SelfTestFailure(f"the reply ended with status {status!r}: "
                                  f"{msg.meta.get('error') if msg else '?'}")
        if not any(hasattr(s, "prompt_tokens") for s in self.stats):
            raise SelfTestFailure("no prefill stats were received")
        cycles = [s for s in self.stats if hasattr(s, "emitted")]
        if not cycles:
            raise SelfTestFailure("no decode-cycle stats were received")
        other = ChatStore(self.w.store.path)  # a second connection: what is really on disk
        try:
            saved = other.message(msg_id)
        finally:
            other.close()
        if saved is None or saved.meta.get("status") != "done":
            raise SelfTestFailure("the reply was not persisted as finished")
        shown = self.w.view.widgets.get(msg_id)
        if shown is None or shown.content != saved.content:
            raise SelfTestFailure("the reply on screen differs from the persisted reply")
        summary = self.events.get("summary")
        if summary is None or summary.tokens < 1:
            raise SelfTestFailure("the reply has no tokens")
        if (saved.meta.get("stats") or {}).get("tokens") != summary.tokens:
            raise SelfTestFailure("the persisted stats differ from the reply's summary")
        if not shown.stats_label.text().startswith(format_stats(summary)):
            raise SelfTestFailure(f"the stats line {shown.stats_label.text()!r} does not show "
                                  f"the reply's summary {format_stats(summary)!r}")
        preview = " ".join(saved.content.split())[:80]
        acceptance = (f", acceptance rate {summary.draft_acceptance:.0%}"
                      if summary.draft_acceptance is not None else "")
        return (f"{summary.tokens} tokens, {summary.tokens_per_s:.1f} tok/s, "
                f"TTFT {summary.ttft_s:.2f} s, {summary.cycles} cycles{acceptance}, "
                f"persisted; reply: {preview!r}")

    # Slots of a QObject living on the GUI thread: worker signals arrive queued.
    @Slot(object)
    def _on_loaded(self, info) -> None:
        self.events["loaded"] = info

    @Slot(str)
    def _on_load_failed(self, message: str) -> None:
        self.events["load_failed"] = message

    @Slot(int, object)
    def _on_stats(self, _rid: int, obj) -> None:
        self.stats.append(obj)

    @Slot(int, str, object)
    def _on_summary(self, _rid: int, _reason: str, summary) -> None:
        self.events["summary"] = summary

    @Slot(int, int, str)
    def _on_finished(self, _conv: int, msg_id: int, status: str) -> None:
        self.events["finished"] = (msg_id, status)
