"""Issue 35 (defects 8, 9, 11): dashboard fit and labels, gauge scale, the model manager's
offline message, wording and units, clean export file names and attachments in exports."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gui


# -- dashboard ---------------------------------------------------------------------------------
@pytest.fixture
def demo(qtbot):
    from app.dashboard.__main__ import demo_window

    w, feed = demo_window(history=60.0)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.refresh()
    return w, feed


def test_gauge_ceiling_is_a_nice_number_at_or_above():
    from app.dashboard.charts import gauge_ceiling

    assert gauge_ceiling(335) == 400
    assert gauge_ceiling(217) == 250
    assert gauge_ceiling(108.8) == 120
    assert gauge_ceiling(1000) == 1000
    assert gauge_ceiling(0) == 10


def test_gauge_scales_to_the_fastest_reply_seen(qtbot, demo):
    from dataclasses import replace

    w, _ = demo
    summary = replace(w.last_summary, decode_tokens=335, decode_s=1.0)  # 335 tok/s
    w.record.finish("stop", summary)
    w.refresh()
    assert w.gauge.maximum == 400 and w.gauge.maximum >= summary.tokens_per_s
    w.clear()
    assert w.gauge.maximum < 400  # a cleared session starts its scale again


def test_nothing_is_cut_off_at_the_minimum_width(qtbot, demo):
    from PySide6.QtWidgets import QScrollArea

    w, feed = demo
    feed.advance(feed.now + 30)
    w.resize(w.minimumWidth(), 700)
    qtbot.wait(50)
    w.refresh()
    area = w.findChild(QScrollArea)
    assert area.widget().width() <= area.viewport().width()
    # the acceptance notes fit their bars (the row says "overall" once)
    assert w.acceptance.note_label == "overall"
    assert all(note and not note.startswith("overall") for *_, note in w.acceptance.bars)


def test_default_size_shows_every_card_without_scrolling(qtbot, demo):
    from PySide6.QtWidgets import QScrollArea

    from app.dashboard.window import DEFAULT_SIZE

    w, _ = demo
    w.resize(*DEFAULT_SIZE)
    qtbot.wait(50)
    area = w.findChild(QScrollArea)
    assert area.verticalScrollBar().maximum() == 0


def test_elided_label_prefers_shorter_wordings_to_an_ellipsis(qtbot, demo):
    w, _ = demo
    sub = w.acceptance_sub
    assert sub.text().startswith("smoothed · ≈")
    sub.resize(sub.fontMetrics().horizontalAdvance(sub.shorter[-1]) + 4, sub.height())
    assert sub.shown_text() == sub.shorter[-1] and "…" not in sub.shown_text()


def test_tokens_say_last_reply_and_cycles_say_this_session(qtbot, demo):
    w, _ = demo
    assert w.t_tokens.note.text().endswith("cycles, last reply")
    assert w.histogram_sub.text().endswith("cycles this session")


def test_memory_card_uses_decimal_gb_as_the_rest_of_the_app(qtbot, demo):
    from app.dashboard.charts import fmt_bytes

    w, _feed = demo
    assert fmt_bytes(17_179_869_184) == "17.2 GB" and fmt_bytes(350_000_000) == "350.0 MB"
    assert fmt_bytes(None) == "n/a" and fmt_bytes(512) == "512 B"
    assert "GiB" not in w.memory_sub.text() and w.memory_sub.text().endswith(" GB")


def test_tuner_chart_shows_progress_while_it_runs(qtbot):
    from app.dashboard.window import TUNER_IDLE_TEXT, DashboardWindow

    w = DashboardWindow()
    qtbot.addWidget(w)
    assert w.tuner_chart.empty_text == TUNER_IDLE_TEXT
    w.tune_button.click()
    assert w.tuner_chart.empty_text == "Starting the tuner…"
    w.on_tune_progress(3, 27, "depth 2")
    assert w.tuner_chart.empty_text == "Measuring depths… 3 of 27 runs done"
    w.on_tune_failed("stopped")
    assert w.tuner_chart.empty_text == TUNER_IDLE_TEXT


# -- model manager -----------------------------------------------------------------------------
def test_unreachable_hub_reads_as_a_plain_sentence():
    from app.models.jobs import OFFLINE_MESSAGE, _message
    from engine.hub.client import HubNetworkError, HubOfflineError

    exc = HubNetworkError("cannot reach https://huggingface.co: [Errno -2] Name or service not "
                          "known — check your network and retry; finished parts are kept")
    assert _message(exc) == OFFLINE_MESSAGE
    kept = _message(exc, kept_bytes=1_500_000_000)
    assert kept.startswith(OFFLINE_MESSAGE) and "1.5 GB already downloaded are kept" in kept
    assert "Errno" not in kept
    assert "HF_HUB_OFFLINE" in _message(HubOfflineError("downloads are disabled because "
                                                        "HF_HUB_OFFLINE is set"))


def test_check_offline_shows_the_plain_message(qtbot, tmp_path, monkeypatch):
    from app.models import add
    from app.models.add import AddPanel
    from app.models.jobs import OFFLINE_MESSAGE
    from engine.hub.client import HubNetworkError

    def offline(*a, **k):
        raise HubNetworkError("cannot reach https://huggingface.co: [Errno -2] Name or service "
                              "not known — check your network and retry; finished parts are kept")

    monkeypatch.setattr(add, "_precheck", offline)
    p = AddPanel(store_root=tmp_path)
    qtbot.addWidget(p)
    p.check("Qwen/Qwen3.5-4B")
    qtbot.waitUntil(lambda: OFFLINE_MESSAGE in p.report_label.text(), timeout=5000)
    assert "Errno" not in p.report_label.text() and "parts" not in p.report_label.text()


def test_model_manager_uses_decimal_gb_and_gui_words(qtbot, tmp_path):
    from app.models.window import ModelsWindow
    from engine.hub.store import Store

    w = ModelsWindow(store=Store(tmp_path / "models"), total_memory=16 * 2**30,
                     free_space=lambda path: 10**12, auto_resume=False, scan_external=False)
    qtbot.addWidget(w)
    cat = w.catalog_panel
    assert "GiB" not in cat.machine_label.text() and "17.2 GB" in cat.machine_label.text()
    t = cat.table
    cells = [t.item(r, c).text() for r in range(t.rowCount()) for c in (2, 3) if t.item(r, c)]
    assert cells and all(c.endswith(" GB") or c == "?" for c in cells)
    notes = cat.notes.text()
    assert "python -m" not in notes and "Check before download" not in notes
    assert "Check reads" in notes
    rows = w.installed_panel.installed_table
    texts = [[rows.item(r, c).text() for c in range(rows.columnCount()) if rows.item(r, c)]
             for r in range(rows.rowCount())]
    builtin = [row for row in texts if "Included with the app" in row]
    assert builtin and builtin[0][2] == "Ready"
    assert not any("builtin" in row or "built in" in row for row in texts)


# -- export ------------------------------------------------------------------------------------
@pytest.mark.parametrize("title, name", [
    ("What does os.path.join do?", "What does os.path.join do.md"),
    ("What does os_path_join do?", "What does os path join do.md"),
    ("a/b\\c: *x*…", "a b c x.md"),
    ("...", "chat.md"),
    ("", "chat.md"),
])
def test_export_file_name_is_clean(title, name):
    from app.chat.export import file_name

    assert file_name(title, "md") == name
    assert file_name(title, "json") == name.removesuffix(".md") + ".json"


def _conv_and_messages():
    from app.db import Attachment, Conversation, Message

    conv = Conversation(id=1, title="Edited title", created_at=0.0, updated_at=0.0)
    msgs = [Message(1, 1, "user", "Summarise my notes", 1.0),
            Message(2, 1, "assistant", "They say iterators implement __next__.", 2.0)]
    atts = {1: [Attachment("notes.md", "# Notes\nIterators implement __next__.\n", "markdown")]}
    return conv, msgs, atts


def test_markdown_export_includes_attachments_and_the_current_title():
    from app.chat.export import to_markdown

    conv, msgs, atts = _conv_and_messages()
    md = to_markdown(conv, msgs, atts)
    assert md.startswith("# Edited title\n")
    assert "**Attachment: notes.md**" in md
    assert "```markdown\n# Notes\nIterators implement __next__.\n```" in md
    assert md.index("notes.md") < md.index("## Assistant")


def test_json_export_includes_attachments():
    from app.chat.export import to_json

    conv, msgs, atts = _conv_and_messages()
    data = json.loads(to_json(conv, msgs, atts))
    assert data["title"] == "Edited title"
    assert data["messages"][0]["attachments"] == [
        {"name": "notes.md", "kind": "markdown", "content": "# Notes\nIterators implement __next__.\n"}]
    assert "attachments" not in data["messages"][1]


def test_depth_chart_spreads_the_cycles_seen_across_its_width(qtbot):
    """26 cycles filled the first 26/300 of the chart while its right edge read "cycle 26"."""
    from PySide6.QtGui import QImage

    from app.dashboard.charts import BLUE, DepthChart

    chart = DepthChart()
    qtbot.addWidget(chart)
    chart.resize(340, 150)
    chart.set_points([(s, 3 if s < 10 else 4, "chosen") for s in range(26)], max_depth=6)
    img = QImage(chart.size(), QImage.Format.Format_RGB32)
    chart.render(img)
    blue = [x for x in range(img.width()) for y in range(img.height())
            if img.pixelColor(x, y).name() == BLUE.name()]
    assert blue and max(blue) > 0.9 * img.width() and min(blue) < 0.25 * img.width()
