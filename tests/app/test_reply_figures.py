"""One reply, one set of figures: the chat's stats line, the dashboard (header and "At a
glance"), ``generate --json``'s report and ``engine.metrics.summary`` give the same tok/s, acceptance
rate and token counts; and the
loaded model is the same in every view, also after a failed load."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.fake.engine import FakeModel, make_fake_loader
from engine.commands.generate import json_report
from engine.errors import UnsupportedModelError
from engine.metrics.summary import ReplyTally, summarize
from engine.resources import default_model_path
from engine.types import CycleStats, Event, PrefillStats
from tests.app.chat_fixtures import Relay, make_window, send

pytestmark = pytest.mark.gui


def _events(relay: Relay, summary) -> list[Event]:
    """The reply's events as the engine yielded them, rebuilt from the worker's signals
    (the prefill event carries the first token when the engine emits one there)."""
    objs = [e[2] for e in relay.log if e[0] == "stats"]
    cycles = [o for o in objs if isinstance(o, CycleStats)]
    first = summary.tokens - sum(len(c.emitted) for c in cycles)
    prefill = next(o for o in objs if isinstance(o, PrefillStats))
    return ([Event(token_ids=(0,) * first, prefill=prefill)]
            + [Event(token_ids=c.emitted, stats=c) for c in cycles])


def _cli_report(events: list[Event]) -> dict:
    tally = ReplyTally()
    for ev in events:
        tally.add(ev)
    return json_report(tally)


def _check_one_reply(qtbot, w) -> None:
    dash = w.aux.show_dashboard()
    relay = Relay(w.worker)
    send(qtbot, w, "How do I use json.dumps?", timeout=120_000)
    qtbot.waitUntil(lambda: "finished" in relay.names(), timeout=10_000)
    summary = next(e[3] for e in relay.log if e[0] == "finished")
    expected = summarize(_events(relay, summary))
    assert summary.tokens_per_s == pytest.approx(expected.tokens_per_s) and summary.tokens_per_s > 0
    assert summary.draft_acceptance == pytest.approx(expected.draft_acceptance)
    assert summary.drafted > 0  # the reply speculated: there is an acceptance rate to show
    assert (summary.tokens, summary.cycles) == (expected.tokens, expected.cycles)
    cli = _cli_report(_events(relay, summary))["stats"]  # what `generate --json` prints
    assert cli["decode_tokens_per_s"] == round(expected.tokens_per_s, 3)
    assert cli["draft_acceptance"] == pytest.approx(expected.draft_acceptance)
    assert (cli["tokens"], cli["cycles"]) == (expected.tokens, expected.cycles)

    tps = f"{expected.tokens_per_s:.1f} tok/s"
    acceptance = f"acceptance rate {expected.draft_acceptance:.0%}"
    reply = w.store.messages(w.current_conv)[-1]
    line = w.view.widgets[reply.id].stats_label.text()
    assert tps in line and acceptance in line and f"{expected.tokens} tokens" in line
    assert f"{expected.tokens_per_cycle:.1f} tokens per step" in line
    tip = w.view.widgets[reply.id].stats_label.toolTip()
    assert f"{expected.tokens_per_cycle:.2f} tokens per decoding step" in tip

    dash.refresh()
    header = dash.summary_label.text()
    assert tps in header and acceptance in header and f"{expected.tokens} tokens" in header
    assert dash.t_tokens.value.text() == str(expected.tokens)  # the same count as the header
    assert dash.series_sub.text() == f"{expected.tokens} tokens in 1 reply"
    assert dash.t_cycle.value.text() == f"{expected.tokens_per_cycle:.2f}"
    assert dash.t_cycle.note.text() == f"{expected.accepted_per_cycle:.2f} drafts accepted"


def test_fake_engine_reply_has_one_set_of_figures(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, FakeModel(tokens_per_second=2000))
    try:
        _check_one_reply(qtbot, w)
    finally:
        w.close()


def test_demo_model_reply_has_one_set_of_figures(qtbot, tmp_path):
    """The real engine: its first token comes out of the prefill, and still nothing differs."""
    from app.chat.main_window import MainWindow

    w = MainWindow(model_path=str(default_model_path()), db_file=tmp_path / "db.sqlite")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.model.ready or w.banner.isVisibleTo(w), timeout=120_000)
    assert w.model.ready, w.banner.text()
    settings = replace(w.session.settings_for(w.current_conv), max_tokens=24, temperature=0.0,
                       depth=2, thinking=False)
    w.store.set_conversation_settings(w.current_conv, settings.to_dict())
    try:
        _check_one_reply(qtbot, w)
    finally:
        w.close()


def test_a_failed_load_keeps_the_previous_model_in_every_view(qtbot, tmp_path):
    from app.chat.main_window import MainWindow

    good = make_fake_loader(FakeModel(tokens_per_second=20000))

    def loader(path: str):
        if path.endswith("broken"):
            raise UnsupportedModelError("Architecture 'llama' is not supported.")
        return good(path)

    for name in ("good", "broken"):
        (tmp_path / name).mkdir()
    w = MainWindow(model_path=str(tmp_path / "good"), loader=loader, db_file=tmp_path / "db")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.model.ready, timeout=5000)
    dash, models = w.aux.show_dashboard(), w.aux.show_models()
    before = w.model.info
    w.load_model(str(tmp_path / "broken"))
    assert not w.model.ready and "Loading" in w.composer.hint.text()
    qtbot.waitUntil(lambda: w.model.ready, timeout=5000)
    assert w.model.info is before and w.model.error == "Architecture 'llama' is not supported."
    assert w.worker.model_info == before  # the worker holds it again
    assert w.banner.isVisibleTo(w) and w.banner.text() == w.model.error
    assert w.picker.info is before and w.picker.status.text() == before.name
    assert dash.info is before and before.name in dash.model_label.text()
    assert models.installed_panel.loaded_path == before.path
    send(qtbot, w, "still there?")  # and the chat goes on with it
    reply = w.store.messages(w.current_conv)[-1]
    assert reply.meta["status"] == "done" and reply.meta["model"] == before.name
    w.close()
