"""Light and dark themes. "system" follows the OS colour scheme; "light"/"dark" force one.

Colours of the chat's own widgets (bubbles, code blocks, think cards, the speculation tint)
derive from the application palette, so they follow whatever the platform style provides;
where the platform cannot switch schemes (offscreen, some Linux styles) a built-in palette is
installed instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QWidget

CHECK_MARK = Path(__file__).with_name("check.svg")
ARROWS = (Path(__file__).with_name("arrow-up.svg"), Path(__file__).with_name("arrow-down.svg"))

THEME_MODES = ("system", "light", "dark")
# placeholders: clearly dimmer than typed text (#e8eaed / #202124) in each theme
DARK_PLACEHOLDER = "#80868b"
LIGHT_PLACEHOLDER = "#8a8f95"


@dataclass(frozen=True)
class Colors:
    dark: bool
    window: str
    text: str
    muted: str
    user_bubble: str
    assistant_bubble: str
    border: str
    code_bg: str
    code_header: str
    think_bg: str
    accent: str
    draft_tint: str
    error: str
    input_border: str = "#b8bcc2"  # text fields: a border that shows on the window colour
    base: str = "#ffffff"          # text fields' background
    on_accent: str = "#ffffff"     # text on the accent colour (a checked toggle)


def palette_is_dark(pal: QPalette | None = None) -> bool:
    pal = pal or QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def current_colors() -> Colors:
    pal = QGuiApplication.palette()
    dark = palette_is_dark(pal)
    text = pal.color(QPalette.ColorRole.WindowText)
    window = pal.color(QPalette.ColorRole.Window)
    accent = pal.color(QPalette.ColorRole.Highlight)
    if dark:
        return Colors(True, window.name(), text.name(), "#9aa0a6", "#2b3a55", "#26282b",
                      "#3c4043", "#1b1d1f", "#2f3336", "#23262a", accent.name(),
                      "rgba(76, 175, 80, 0.35)", "#f28b82", "#6b7075",
                      pal.color(QPalette.ColorRole.Base).name(),
                      pal.color(QPalette.ColorRole.HighlightedText).name())
    return Colors(False, window.name(), text.name(), "#5f6368", "#dbe8fb", "#ffffff",
                  "#d5d8dc", "#f6f8fa", "#eaedf0", "#f3f0fa", accent.name(),
                  "rgba(76, 175, 80, 0.28)", "#c5221f", "#b0b4ba",
                  pal.color(QPalette.ColorRole.Base).name(),
                  pal.color(QPalette.ColorRole.HighlightedText).name())


def _dark_palette() -> QPalette:
    p = QPalette()
    roles = QPalette.ColorRole
    for role, color in (
        (roles.Window, "#202124"), (roles.WindowText, "#e8eaed"), (roles.Base, "#17181a"),
        (roles.AlternateBase, "#2a2b2e"), (roles.Text, "#e8eaed"), (roles.Button, "#2d2e31"),
        (roles.ButtonText, "#e8eaed"), (roles.ToolTipBase, "#303134"),
        (roles.ToolTipText, "#e8eaed"), (roles.Highlight, "#4f8ff7"),
        (roles.HighlightedText, "#ffffff"), (roles.Link, "#8ab4f8"),
        (roles.PlaceholderText, DARK_PLACEHOLDER), (roles.BrightText, "#ffffff"),
        (roles.Mid, "#3c4043"), (roles.Dark, "#111214"), (roles.Light, "#3c4043"),
    ):
        p.setColor(role, QColor(color))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6f7378"))
    return p


def apply_theme(mode: str, app: QApplication | None = None) -> bool:
    """Apply ``mode`` ("system", "light" or "dark"); returns whether the result is dark."""
    app = app or QApplication.instance()
    hints = app.styleHints()
    if mode == "system":
        if hasattr(hints, "unsetColorScheme"):
            hints.unsetColorScheme()
        # An empty palette overrides nothing: the platform's palette (and its later
        # light/dark switches) show through.
        app.setPalette(QPalette())
        return palette_is_dark()
    want_dark = mode == "dark"
    if hasattr(hints, "setColorScheme"):
        hints.setColorScheme(Qt.ColorScheme.Dark if want_dark else Qt.ColorScheme.Light)
    pal = app.style().standardPalette()
    if palette_is_dark(pal) != want_dark:
        pal = _dark_palette() if want_dark else _light_palette()
    pal.setColor(QPalette.ColorRole.PlaceholderText,
                 QColor(DARK_PLACEHOLDER if want_dark else LIGHT_PLACEHOLDER))
    app.setPalette(pal)
    return want_dark


def _light_palette() -> QPalette:
    p = QPalette(QColor("#efefef"))
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Text, QColor("#202124"))
    p.setColor(QPalette.ColorRole.WindowText, QColor("#202124"))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor(LIGHT_PLACEHOLDER))
    return p


def stylesheet(c: Colors) -> str:
    """The app's style sheet, installed on the ``QApplication`` so every top-level window
    (chat, dashboard, model manager, dialogs) gets it: the chat widgets' colours (selectors are
    object names set by the widgets) and check boxes that stay visible in the dark theme."""
    check = CHECK_MARK.as_posix()
    up, down = (a.as_posix() for a in ARROWS)
    return f"""
    QCheckBox::indicator, QGroupBox::indicator {{ width: 14px; height: 14px; border-radius: 3px;
        border: 1px solid {c.muted}; background: {"#17181a" if c.dark else "#ffffff"}; }}
    QCheckBox::indicator:checked, QGroupBox::indicator:checked {{ background: {c.accent};
        border-color: {c.accent}; image: url({check}); }}
    QCheckBox::indicator:disabled {{ border-color: {c.border}; }}
    QCheckBox::indicator:checked:disabled {{ background: {c.border}; }}
    QFrame#chip {{ background: {c.code_header}; border: 1px solid {c.border}; border-radius: 9px; }}
    QLabel#branchLabel {{ color: {c.muted}; }}
    QFrame#userBubble {{ background: {c.user_bubble}; border-radius: 12px; }}
    QFrame#assistantBubble {{ background: {c.assistant_bubble}; border: 1px solid {c.border};
        border-radius: 12px; }}
    QFrame[match="true"] {{ border: 2px solid {c.accent}; }}
    QFrame#errorBubble {{ border: 1px solid {c.error}; border-radius: 12px; }}
    QFrame#codeBlock {{ background: {c.code_bg}; border: 1px solid {c.border}; border-radius: 8px; }}
    QWidget#codeHeader {{ background: {c.code_header}; border-top-left-radius: 8px;
        border-top-right-radius: 8px; }}
    QTextBrowser#codeText {{ background: {c.code_bg}; border: none; }}
    QFrame#thinkCard {{ background: {c.think_bg}; border: 1px solid {c.border}; border-radius: 8px; }}
    QFrame#toolCard {{ background: {c.think_bg}; border: 1px solid {c.border};
        border-left: 3px solid {c.muted}; border-radius: 8px; }}
    QFrame#toolCardPending {{ background: {c.think_bg}; border: 1px solid {c.accent};
        border-left: 3px solid {c.accent}; border-radius: 8px; }}
    QLabel#muted, QLabel#statsLine, QLabel#roleLabel {{ color: {c.muted}; }}
    QLabel#errorText {{ color: {c.error}; }}
    QWidget#conversationCanvas {{ background: {c.window}; }}
    QToolButton#msgAction {{ border: none; color: {c.muted}; padding: 2px 6px; }}
    QToolButton#msgAction:hover {{ color: {c.text}; }}
    QFrame#undoBar {{ background: {c.code_header}; border-radius: 6px; }}
    QLineEdit#textInput, QPlainTextEdit#textInput {{ background: {c.base};
        border: 1px solid {c.input_border}; border-radius: 6px; padding: 2px 4px; }}
    QLineEdit#textInput:focus, QPlainTextEdit#textInput:focus {{ border-color: {c.accent}; }}
    QAbstractSpinBox {{ background: {c.base}; border: 1px solid {c.input_border};
        border-radius: 4px; padding: 1px 2px; }}
    QAbstractSpinBox:focus {{ border-color: {c.accent}; }}
    QAbstractSpinBox:disabled {{ color: {c.muted}; border-color: {c.border}; }}
    QAbstractSpinBox::up-button, QAbstractSpinBox::down-button {{ subcontrol-origin: border;
        width: 16px; border: none; background: transparent; }}
    QAbstractSpinBox::up-button {{ subcontrol-position: top right; }}
    QAbstractSpinBox::down-button {{ subcontrol-position: bottom right; }}
    QAbstractSpinBox::up-arrow {{ image: url({up}); width: 10px; height: 6px; }}
    QAbstractSpinBox::down-arrow {{ image: url({down}); width: 10px; height: 6px; }}
    QToolButton#composerToggle {{ border: 1px solid {c.input_border}; border-radius: 6px;
        padding: 2px 10px; background: {c.code_header}; color: {c.text}; }}
    QToolButton#composerToggle:hover {{ border-color: {c.accent}; }}
    QToolButton#composerToggle:checked {{ background: {c.accent}; border-color: {c.accent};
        color: {c.on_accent}; font-weight: bold; }}
    QToolButton#composerToggle:disabled {{ color: {c.muted}; border-color: {c.border}; }}
    QLabel#mtpBadge {{ border: 1px solid {c.accent}; color: {c.accent}; border-radius: 8px;
        padding: 1px 6px; }}
    """


def apply_app_style(app: QApplication | None = None) -> None:
    """Install ``stylesheet(current_colors())`` app-wide and re-apply every widget's own style
    sheet: Qt resolves ``palette(...)`` in a style sheet once, when it is set, so a window
    styled that way (the dashboard's cards, the model manager's rows) would keep the old
    theme's colours after a palette change."""
    app = app or QApplication.instance()
    app.setStyleSheet(stylesheet(current_colors()))
    for top in app.topLevelWidgets():
        for w in [top, *top.findChildren(QWidget)]:
            own = w.styleSheet()
            if own:
                w.setStyleSheet("")
                w.setStyleSheet(own)
