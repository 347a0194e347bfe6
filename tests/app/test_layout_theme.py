"""Issue 16, defects 2, 3 and 5: the chat layout holds at 900×650 with the settings panel
open, the conversation is drawn after a resize, and the dark theme reaches every window."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication

from tests.app.chat_fixtures import send

pytestmark = pytest.mark.gui


def _inside(widget, area) -> bool:
    """``widget`` is shown and its whole rectangle lies inside ``area``'s visible rectangle."""
    top_left = widget.mapTo(area.window(), QPoint(0, 0))
    rect = QRect(top_left, widget.size())
    a = QRect(area.mapTo(area.window(), QPoint(0, 0)), area.size())
    return widget.isVisible() and a.contains(rect)


def _settle(qtbot, w) -> None:
    QApplication.processEvents()
    qtbot.wait(50)
    QApplication.processEvents()


def test_last_reply_fits_at_900x650_with_the_settings_panel(qtbot, win):
    win.apply_preferences(type(win.prefs)(theme="light", show_speculation=True))
    send(qtbot, win, "What does it.__next__() do?")
    win.resize(900, 650)
    win.settings_button.setChecked(True)
    _settle(qtbot, win)
    win.view.scroll_to_bottom()
    _settle(qtbot, win)
    viewport = win.view.viewport()
    reply = win.view.widgets[max(win.view.widgets)]
    for b in (reply.copy_button, reply.regen_button):
        assert _inside(b, viewport), b.text()
    assert not reply.stats_label.wordWrap() and _inside(reply.stats_label, viewport)
    assert "tinted" in reply.stats_label.shown_text()  # one line: a shorter form that fits
    user = win.view.widgets[min(win.view.widgets)]
    assert _inside(user, viewport)
    assert user.width() >= user.body.fontMetrics().horizontalAdvance("What does it") 
    assert _inside(win.settings_panel, win.centralWidget())
    assert _inside(win.composer.button, win.centralWidget())


def test_conversation_is_drawn_after_a_resize(qtbot, win):
    for i in range(4):
        send(qtbot, win, f"question {i}")
    win.resize(1600, 1000)
    _settle(qtbot, win)
    win.resize(900, 650)
    _settle(qtbot, win)
    viewport = win.view.viewport()
    bar = win.view.verticalScrollBar()
    assert bar.value() == bar.maximum()  # still at the latest reply
    visible = [m for m in win.view.widgets.values()
               if m.isVisible() and m.visibleRegion().boundingRect().height() > 20]
    assert visible, "nothing of the conversation is on screen"
    canvas = win.view.widget()
    last = win.view._rows[max(win.view._rows)]
    bottom = last.mapTo(canvas, QPoint(0, last.height())).y()
    assert canvas.height() - bottom < 60  # no blank band under the last message
    image = viewport.grab().toImage()
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7)
               for y in range(0, image.height(), 7)}
    assert len(colours) > 3  # not a blank canvas


def _is_dark(widget) -> bool:
    image = widget.grab().toImage()
    c = image.pixelColor(3, image.height() // 2)
    return c.lightness() < 100


def test_dark_theme_reaches_every_top_level_window(qtbot, win):
    from app.chat.settings_dialog import AppPreferences

    win.apply_preferences(AppPreferences(theme="light"))
    dash = win.aux.show_dashboard()  # made while light: must follow the switch
    models = win.aux.show_models()  # the app closes and deletes both (close_all below)
    _settle(qtbot, win)
    assert not _is_dark(dash) and not _is_dark(models)
    win.apply_preferences(AppPreferences(theme="dark"))
    _settle(qtbot, win)
    for w in (win, dash, models):
        assert _is_dark(w), w.windowTitle()
    win.aux.close_all()
    dash = win.aux.show_dashboard()  # and when reopened
    qtbot.addWidget(dash)
    _settle(qtbot, win)
    assert _is_dark(dash)


def test_checkboxes_are_visible_in_the_dark_theme(qtbot, win):
    from app.chat.settings_dialog import AppPreferences

    win.apply_preferences(AppPreferences(theme="dark"))
    win.settings_button.setChecked(True)
    box = win.settings_panel.form.thinking
    box.setEnabled(True)
    _settle(qtbot, win)
    image = box.grab().toImage()
    h = image.height()
    # the indicator's frame: some pixel in the left square clearly lighter than the window
    bg = win.palette().window().color().lightness()
    lightest = max(image.pixelColor(x, y).lightness() for x in range(min(h, 22)) for y in range(h))
    assert lightest - bg > 60
