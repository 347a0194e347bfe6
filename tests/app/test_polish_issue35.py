"""Issue 35 (defects 4, 5, 6, 7, 10, 12): the model picker, the menus and shortcuts, the About
box, the Settings dialog, the edit banner, the Think toggle, inputs, presets and the stats line."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QFormLayout

from app.chat.main_window import about_text
from app.chat.settings_dialog import DefaultsDialog
from app.chat.stats_line import format_stats, seconds, shorter_stats, stats_tooltip
from app.chat.theme import current_colors, stylesheet

STATS = {"tokens": 120, "tokens_per_s": 312.4, "ttft_s": 0.0031, "cycles": 50,
         "tokens_per_cycle": 2.62, "accepted_per_cycle": 1.67, "depth_max": 4, "depth_min": 1,
         "prompt_tokens": 37, "draft_acceptance": 0.54}


def _native(key) -> str:
    return QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText)


def test_stats_line_speaks_plain_words_and_the_tooltip_has_the_figures():
    line = format_stats(STATS)
    assert line == ("312.4 tok/s · 2.6 tokens per step · first token <0.01 s · 120 tokens · "
                    "acceptance rate 54%")
    for jargon in ("TTFT", "tok/cycle", "accepted,", "depths", "0.00 s"):
        assert jargon not in line
    tip = stats_tooltip(STATS)
    for figure in ("312.40 tokens per second", "(TTFT): 0.003 s", "120 generated, 37 in the prompt",
                   "2.62 tokens per decoding step", "1.67 drafted tokens accepted",
                   "depths 1–4", "50 steps", "54% of drafted tokens"):
        assert figure in tip, figure
    assert stats_tooltip(None) == "" and format_stats(None) == ""


def test_short_times_never_read_zero():
    assert seconds(0.0) == seconds(0.0049) == "<0.01 s"
    assert seconds(0.005) == "0.01 s" and seconds(0.31) == "0.31 s"
    assert "first token 0.05 s" in format_stats({"tokens": 3, "ttft_s": 0.05})


def test_the_reply_shows_the_tooltip(qtbot, win):
    from tests.app.chat_fixtures import send

    send(qtbot, win, "hello")
    reply = win.view.widgets[max(win.view.widgets)]
    assert "first token" in reply.stats_label.text()
    assert "Time to first token" in reply.stats_label.toolTip()


def test_menu_order_puts_help_last(win):
    titles = [a.text().replace("&", "") for a in win.menuBar().actions()]
    assert titles == ["File", "Edit", "View", "Server", "Help"]


def test_no_hard_coded_shortcut_text(win):
    find, new = _native(QKeySequence.StandardKey.Find), _native(QKeySequence.StandardKey.New)
    assert win.sidebar.search.placeholderText() == f"Search chats ({find})"
    assert win.sidebar.new_button.toolTip() == f"New chat ({new})"
    import inspect

    from app.chat import sidebar
    src = inspect.getsource(sidebar)
    assert "(Ctrl+F)" not in src and "(Ctrl+N)" not in src


def test_about_names_the_app_version_and_libraries():
    import engine

    text = about_text()
    assert "MTP Chat" in text and f"Version {engine.__version__}" in text
    assert "speculative decoding" in text and "MLX " in text and "mlx-lm " in text
    assert "href" not in text and "http" not in text


@pytest.mark.parametrize("which", ["dashboard", "models"])
@pytest.mark.parametrize("key", ["esc", "close"])
def test_escape_and_close_keys_close_the_other_windows(qtbot, win, which, key):
    w = getattr(win.aux, f"show_{which}")()
    qtbot.waitExposed(w)
    w.activateWindow()
    QApplication.processEvents()
    from PySide6.QtGui import QShortcut

    shortcuts = [s for s in w.findChildren(QShortcut) if s.parent() is w]
    keys = {k.toString() for s in shortcuts for k in s.keys()}
    assert {"Esc", "Ctrl+W"} <= keys
    assert shortcuts[-1].context() == Qt.ShortcutContext.WindowShortcut
    shortcuts[-1].activated.emit()
    assert not w.isVisible()


def test_settings_dialog_plain_buttons_and_aligned_fields(qtbot, win):
    dlg = DefaultsDialog(win.conversations.defaults, win.prefs, None, win)
    qtbot.addWidget(dlg)
    dlg.show()
    QApplication.processEvents()
    assert all(b.icon().isNull() for b in dlg.buttons.buttons())
    assert dlg.buttons.standardButtons() == (QDialogButtonBox.StandardButton.Ok
                                             | QDialogButtonBox.StandardButton.Cancel)
    lefts = set()
    for form in dlg.findChildren(QFormLayout):
        for row in range(form.rowCount()):
            item = form.itemAt(row, QFormLayout.ItemRole.FieldRole)
            label = form.itemAt(row, QFormLayout.ItemRole.LabelRole)
            if item is not None and label is not None and item.widget():
                lefts.add(item.widget().mapTo(dlg, item.widget().rect().topLeft()).x())
    assert len(lefts) == 1, lefts  # every field of both groups starts at one x


def test_edit_banner_says_a_branch_is_made(win):
    text = win.composer.edit_label.text()
    assert "branch" in text and "‹ ›" in text and "replaces" not in text


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_think_checked_state_and_inputs_are_styled(win, theme):
    win.apply_preferences(type(win.prefs)(theme=theme))
    c = current_colors()
    css = stylesheet(c)
    assert "QToolButton#composerToggle:checked" in css and f"background: {c.accent}" in css
    assert win.composer.think_button.objectName() == "composerToggle"
    assert win.composer.edit.objectName() == win.sidebar.search.objectName() == "textInput"
    assert f"border: 1px solid {c.input_border}" in css
    # spin boxes too (dark Fusion draws their frame in the window's own colour), arrows drawn
    from app.chat.theme import ARROWS

    assert "QAbstractSpinBox { background:" in css and all(a.is_file() for a in ARROWS)
    assert all(f"image: url({a.as_posix()})" in css for a in ARROWS)
    pal = QApplication.palette()
    placeholder = pal.color(pal.ColorRole.PlaceholderText)
    typed = pal.color(pal.ColorRole.Text)
    assert abs(placeholder.lightness() - typed.lightness()) >= 60  # clearly dimmer


def test_preset_says_default_at_default_values(qtbot, win):
    panel = win.settings_panel
    assert panel.preset.currentText() == "Default"
    assert [panel.preset.itemText(i) for i in range(panel.preset.count())] == ["Default"]
    panel.form.temperature.setValue(1.5)
    assert panel.preset.currentText() == "Custom"
    panel.preset_saved.emit("Pirate", "Arr.")
    items = [panel.preset.itemText(i) for i in range(panel.preset.count())]
    assert items[:2] == ["Default", "Pirate"]
    panel.preset.activated.emit(0)  # "Default" resets this chat to the defaults
    assert win.conversations.settings_for(win.current_conv) == win.conversations.defaults
    assert panel.preset.currentText() == "Default"


def test_picker_fits_its_label_and_shows_the_name_once(qtbot, win):
    win.resize(1440, 900)
    QApplication.processEvents()
    qtbot.waitUntil(lambda: win.model.ready, timeout=5000)
    QApplication.processEvents()
    combo = win.picker.combo
    fm = combo.fontMetrics()
    assert combo.width() >= fm.horizontalAdvance(combo.currentText())
    assert not win.picker.status.isVisible()  # no second label with the name
    assert win.model.info.name in combo.toolTip()


def test_chat_column_stays_usable_at_900_with_settings(qtbot, win):
    win.resize(900, 650)
    QApplication.processEvents()
    win.settings_button.setChecked(True)
    QApplication.processEvents()
    qtbot.wait(50)
    pane = win.splitter.widget(1)
    assert pane.width() >= 460, win.splitter.sizes()
    assert win.settings_panel.isVisible()


def test_the_application_is_named_mtp_chat(qapp):
    from app.main import APP_ID, application

    assert application() is QApplication.instance()
    assert QApplication.applicationName() == QApplication.applicationDisplayName() == "MTP Chat"
    assert QApplication.desktopFileName() == APP_ID == "mtpchat"


def test_shorter_stats_drop_figures_in_order_and_keep_the_speed():
    assert [s.count(" · ") for s in shorter_stats(STATS)] == [3, 2, 1]
    assert shorter_stats(STATS)[-1] == "312.4 tok/s · 2.6 tokens per step"
    assert shorter_stats(None) == [] and shorter_stats({"tokens": 3}) == []


def test_stats_line_is_one_line_at_900_with_settings_open(qtbot, win):
    from tests.app.chat_fixtures import send

    send(qtbot, win, "hello")
    win.resize(900, 650)
    win.settings_button.setChecked(True)
    QApplication.processEvents()
    qtbot.wait(50)
    label = win.view.widgets[max(win.view.widgets)].stats_label
    stats = win.conversations.message(max(win.view.widgets)).meta["stats"]
    fm = label.fontMetrics()
    assert label.height() < 2 * fm.lineSpacing()  # one line, never wrapped
    shown = label.shown_text()
    assert shown in [format_stats(stats), *shorter_stats(stats)]  # a whole form, no "…"
    assert fm.horizontalAdvance(shown) <= label.contentsRect().width()
    assert label.text() == format_stats(stats) and "Time to first token" in label.toolTip()
    win.settings_button.setChecked(False)
    win.resize(1440, 900)
    QApplication.processEvents()
    qtbot.wait(50)
    assert label.shown_text() == format_stats(stats)  # room enough: every figure


def test_about_box_has_a_plain_ok_button(qtbot, win):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QMessageBox

    seen = {}

    def inspect() -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        seen["title"] = box.windowTitle()
        seen["icons"] = [b.icon().isNull() for b in box.buttons()]
        seen["text"] = box.text()
        box.accept()

    QTimer.singleShot(100, inspect)
    win.show_about()
    assert seen["title"] == "About MTP Chat" and seen["icons"] == [True]
    assert seen["text"] == about_text()
