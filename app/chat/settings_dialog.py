"""Settings UI: the per-chat side panel and the app-wide defaults dialog (Ctrl+,).

Both use ``SettingsForm`` (system prompt, temperature, top-p, top-k, max tokens, depth,
thinking). The form knows what the loaded model can do: no MTP heads -> depth fixed at 0;
no ``enable_thinking`` in its chat template -> thinking toggle disabled.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.chat.settings import DEPTH_CHOICES, ChatSettings
from app.chat.theme import THEME_MODES

DEFAULT_PRESET = "\x00default"  # the preset combo's "Default" entry (no preset has this name)


def _depth_label(d: int | str) -> str:
    return {"auto": "Auto (adaptive)", 0: "Off (plain decoding)"}.get(
        d, f"{d} draft token" if d == 1 else f"{d} draft tokens")


class SettingsForm(QWidget):
    """Edits a ``ChatSettings``; emits ``changed()`` on every edit."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setPlaceholderText("You are a helpful assistant.")
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setObjectName("textInput")
        self.system_prompt.setFixedHeight(90)
        self.temperature = self._dspin(0.0, 2.0, 0.05, "Temperature")
        self.top_p = self._dspin(0.01, 1.0, 0.05, "Top-p")
        self.top_k = QSpinBox(self, minimum=0, maximum=1000)
        self.top_k.setAccessibleName("Top-k")
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox(self, minimum=16, maximum=131072, singleStep=256)
        self.max_tokens.setAccessibleName("Maximum tokens")
        self.depth = QComboBox(self)
        self.depth.setAccessibleName("Speculation depth")
        for d in DEPTH_CHOICES:
            self.depth.addItem(_depth_label(d), d)
        self.thinking = QCheckBox("Let the model think first", self)
        self.thinking.setAccessibleName("Thinking")
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Speculation depth", self.depth)
        form.addRow("Thinking", self.thinking)
        self.capability_note = QLabel("", self)
        self.capability_note.setObjectName("muted")
        self.capability_note.setWordWrap(True)
        form.addRow(self.capability_note)
        self.system_prompt.textChanged.connect(self.changed)
        for w in (self.temperature, self.top_p):
            w.valueChanged.connect(self.changed)
        for w in (self.top_k, self.max_tokens):
            w.valueChanged.connect(self.changed)
        self.depth.currentIndexChanged.connect(self.changed)
        self.thinking.toggled.connect(self.changed)

    def _dspin(self, lo: float, hi: float, step: float, name: str) -> QDoubleSpinBox:
        w = QDoubleSpinBox(self, minimum=lo, maximum=hi, singleStep=step, decimals=2)
        w.setAccessibleName(name)
        return w

    def set_settings(self, s: ChatSettings) -> None:
        widgets = (self.system_prompt, self.temperature, self.top_p, self.top_k,
                   self.max_tokens, self.depth, self.thinking)
        for w in widgets:
            w.blockSignals(True)
        try:
            self.system_prompt.setPlainText(s.system_prompt)
            self.temperature.setValue(s.temperature)
            self.top_p.setValue(s.top_p)
            self.top_k.setValue(s.top_k)
            self.max_tokens.setValue(s.max_tokens)
            idx = self.depth.findData(s.depth)
            self.depth.setCurrentIndex(max(0, idx))
            self.thinking.setChecked(s.thinking)
        finally:
            for w in widgets:
                w.blockSignals(False)

    def settings(self) -> ChatSettings:
        return ChatSettings(
            system_prompt=self.system_prompt.toPlainText(), temperature=self.temperature.value(),
            top_p=self.top_p.value(), top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
            depth=self.depth.currentData(), thinking=self.thinking.isChecked())

    def set_model_info(self, info) -> None:
        has_mtp = bool(getattr(info, "has_mtp", False))
        thinks = bool(getattr(info, "supports_thinking", False))
        self.depth.setEnabled(info is None or has_mtp)
        self.thinking.setEnabled(info is None or thinks)
        notes = []
        if info is not None and not has_mtp:
            notes.append("This model has no MTP heads: it decodes one token at a time.")
        elif info is not None:
            notes.append(f"This model can draft up to {info.max_depth} tokens per cycle.")
        if info is not None and not thinks:
            notes.append("Its chat template has no thinking switch.")
        self.capability_note.setText(" ".join(notes))


class ChatSettingsPanel(QWidget):
    """Per-chat settings beside the conversation; ``settings_changed(ChatSettings)``.

    System prompt presets: picking one puts its prompt into this chat's settings;
    ``preset_saved(name, prompt)`` and ``preset_deleted(name)`` ask the window to store them
    (it answers with ``set_presets``)."""

    settings_changed = Signal(object)
    reset_requested = Signal()
    preset_saved = Signal(str, str)
    preset_deleted = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Chat settings")
        self.setMinimumWidth(210)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        title = QLabel("<b>This chat</b>", self)
        lay.addWidget(title)
        lay.addLayout(self._preset_row())
        self.form = SettingsForm(self)
        self.form.changed.connect(lambda: self.settings_changed.emit(self.form.settings()))
        self.form.changed.connect(self.sync_preset)
        lay.addWidget(self.form)
        reset = QPushButton("Reset to defaults", self)
        reset.setAccessibleName("Reset chat settings to defaults")
        reset.clicked.connect(self.reset_requested)
        lay.addWidget(reset)
        lay.addStretch(1)


    def _preset_row(self) -> QVBoxLayout:
        row = QVBoxLayout()
        self.presets: dict[str, str] = {}
        self.defaults: ChatSettings | None = None
        self.preset = QComboBox(self)
        self.preset.setAccessibleName("System prompt preset")
        self.preset.setToolTip("Saved system prompts: pick one for this chat")
        self.preset.activated.connect(self._on_preset_picked)
        self.save_preset = QPushButton("Save as preset…", self)
        self.save_preset.setAccessibleName("Save the system prompt as a preset")
        self.save_preset.setToolTip("Save this chat's system prompt as a preset")
        self.save_preset.clicked.connect(self._ask_preset_name)
        self.delete_preset = QPushButton("Delete", self)
        self.delete_preset.setAccessibleName("Delete the preset")
        self.delete_preset.clicked.connect(
            lambda: self.preset_deleted.emit(self.preset.currentData() or ""))
        top = QHBoxLayout()
        top.addWidget(QLabel("Preset", self))
        top.addWidget(self.preset, 1)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.save_preset)
        buttons.addWidget(self.delete_preset)
        row.addLayout(top)
        row.addLayout(buttons)
        self.set_presets([])
        return row

    def set_presets(self, presets: list[tuple[str, str]]) -> None:
        self.presets = dict(presets)
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItem("Default", DEFAULT_PRESET)
        self.preset.setItemData(0, "The default settings for new chats (Settings…)",
                                Qt.ItemDataRole.ToolTipRole)
        for name, _prompt in presets:
            self.preset.addItem(name, name)
        self.preset.blockSignals(False)
        self.sync_preset()

    def set_defaults(self, defaults: ChatSettings | None) -> None:
        """The app-wide defaults: the combo says "Default" while this chat uses exactly them."""
        self.defaults = defaults
        self.sync_preset()

    def sync_preset(self) -> None:
        """The combo names what this chat uses: "Default" (the defaults' values), the preset
        whose prompt it has, or "Custom" (an entry present only while it applies)."""
        if not hasattr(self, "form"):
            return
        settings = self.form.settings()
        prompt = settings.system_prompt
        name = next((n for n, p in self.presets.items() if p == prompt and prompt), None)
        if self.defaults is not None and settings == self.defaults:
            target = DEFAULT_PRESET
        else:
            target = name
        self.preset.blockSignals(True)
        custom = self.preset.findData(None)
        if target is None and custom < 0:
            self.preset.addItem("Custom", None)
        elif target is not None and custom >= 0:
            self.preset.removeItem(custom)
        self.preset.setCurrentIndex(max(0, self.preset.findData(target)))
        self.preset.blockSignals(False)
        self.delete_preset.setEnabled(name is not None)

    def _on_preset_picked(self, index: int) -> None:
        name = self.preset.itemData(index)
        if name == DEFAULT_PRESET:
            self.reset_requested.emit()
        elif name in self.presets:
            self.form.system_prompt.setPlainText(self.presets[name])  # emits changed

    def _ask_preset_name(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        if ok and name.strip():
            self.preset_saved.emit(name.strip(), self.form.system_prompt.toPlainText())


def align_form_labels(*forms: QFormLayout) -> int:
    """Give every label of these forms the widest one's width (and one alignment), so the
    fields of forms in different groups start at the same x. Returns that width."""
    labels = [f.itemAt(row, QFormLayout.ItemRole.LabelRole) for f in forms
              for row in range(f.rowCount())]
    widgets = [item.widget() for item in labels if item is not None and item.widget()]
    width = max((w.sizeHint().width() for w in widgets), default=0)
    align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    for f in forms:
        f.setLabelAlignment(align)
        f.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    for w in widgets:
        w.setMinimumWidth(width)
    return width


@dataclass(frozen=True)
class AppPreferences:
    theme: str = "system"
    font_size: int = 0          # 0: the platform default
    show_speculation: bool = False

    @classmethod
    def from_dict(cls, d: dict | None) -> AppPreferences:
        d = d if isinstance(d, dict) else {}
        theme = d.get("theme", "system")
        size = d.get("font_size", 0)
        ok = isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= 96
        return cls(theme=theme if isinstance(theme, str) and theme in THEME_MODES else "system",
                   font_size=size if ok else 0,
                   show_speculation=bool(d.get("show_speculation", False)))


class DefaultsDialog(QDialog):
    """App-wide defaults for new chats, plus appearance."""

    def __init__(self, defaults: ChatSettings, prefs: AppPreferences, info=None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        lay = QVBoxLayout(self)
        box = QGroupBox("Defaults for new chats", self)
        bl = QVBoxLayout(box)
        self.form = SettingsForm(box)
        self.form.set_settings(defaults)
        self.form.set_model_info(info)
        bl.addWidget(self.form)
        lay.addWidget(box)
        look = QGroupBox("Appearance", self)
        fl = QFormLayout(look)
        self.theme = QComboBox(look)
        self.theme.setAccessibleName("Theme")
        for mode in THEME_MODES:
            self.theme.addItem({"system": "Follow the system", "light": "Light", "dark": "Dark"}[mode], mode)
        self.theme.setCurrentIndex(max(0, self.theme.findData(prefs.theme)))
        self.font_size = QSpinBox(look, minimum=0, maximum=32)
        self.font_size.setSpecialValueText("default")
        self.font_size.setValue(prefs.font_size)
        self.font_size.setAccessibleName("Font size")
        self.show_speculation = QCheckBox("Tint text that came from accepted drafts", look)
        self.show_speculation.setChecked(prefs.show_speculation)
        self.show_speculation.setAccessibleName("Show speculation")
        fl.addRow("Theme", self.theme)
        fl.addRow("Font size", self.font_size)
        fl.addRow("Speculation", self.show_speculation)
        lay.addWidget(look)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel, self)
        for b in buttons.buttons():  # plain buttons, as on a Mac: no stock tick/cross icons
            b.setIcon(QIcon())
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.form.layout().setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        align_form_labels(self.form.layout(), fl)
        self.buttons = buttons

    def defaults(self) -> ChatSettings:
        return self.form.settings()

    def preferences(self) -> AppPreferences:
        return AppPreferences(theme=self.theme.currentData(), font_size=self.font_size.value(),
                              show_speculation=self.show_speculation.isChecked())
