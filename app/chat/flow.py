"""``MarkdownFlow``: a reply's Markdown as a column of block widgets, updated incrementally.

Contract: ``set_text(text, final=...)`` may be called with ever-longer text; blocks that became
stable (see ``app.chat.markdown``) were rendered for the last time and are never touched
again — only the tail block is re-rendered per update. Prose blocks are ``QLabel``s in
Markdown mode; fenced code is a ``CodeBlock`` (language, Copy button, highlighted text).
With ``tint`` (the "show speculation" view) text is shown raw, with the characters that came
from accepted drafts on a tinted background.
"""
from __future__ import annotations

import html

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextOption,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.markdown import (
    Block,
    draft_spans_in,
    highlight_html,
    protect_identifiers,
    split_blocks,
    stable_count,
    tinted_html,
)
from app.chat.theme import current_colors

_MONO = ["Menlo", "DejaVu Sans Mono", "Consolas", "monospace"]


class _CodeView(QTextBrowser):
    """Unwrapped code whose height follows its content (a horizontal scroll bar if too wide)."""

    def fit(self) -> None:
        doc = self.document()
        h = int(doc.size().height()) + 2
        if doc.idealWidth() > self.width() > 0:
            h += self.horizontalScrollBar().sizeHint().height()
        if h != self.height():
            self.setFixedHeight(h)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.fit()


class CodeBlock(QFrame):
    """A fenced code block: header (language, Copy) over highlighted, unwrapped text."""

    copied = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.code = ""
        self.lang = ""
        self._rendered_lines = -1
        self._head_html = ""
        lay = QVBoxLayout(self)
        lay.setContentsMargins(1, 1, 1, 1)
        lay.setSpacing(0)
        header = QWidget(self)
        header.setObjectName("codeHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(10, 2, 4, 2)
        self.lang_label = QLabel("", header)
        self.lang_label.setObjectName("muted")
        self.copy_button = QToolButton(header)
        self.copy_button.setObjectName("msgAction")
        self.copy_button.setText("Copy")
        self.copy_button.setAccessibleName("Copy code")
        self.copy_button.setToolTip("Copy this code block")
        self.copy_button.clicked.connect(self.copy)
        hl.addWidget(self.lang_label)
        hl.addStretch(1)
        hl.addWidget(self.copy_button)
        lay.addWidget(header)
        self.view = _CodeView(self)
        self.view.setObjectName("codeText")
        self.view.setAccessibleName("Code")
        self.view.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        self.view.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
        self.view.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setFrameShape(QFrame.Shape.NoFrame)
        self.view.document().setDocumentMargin(10)
        font = QGuiApplication.font()
        font.setFamilies(_MONO)
        font.setStyleHint(font.StyleHint.Monospace)
        self.view.setFont(font)
        lay.addWidget(self.view)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        QTimer.singleShot(1500, self._reset_copy_label)
        self.copied.emit(self.code)

    def _reset_copy_label(self) -> None:
        self.copy_button.setText("Copy")

    def set_code(self, code: str, lang: str, *, final: bool, tint: list | None = None) -> None:
        self.code, self.lang = code, lang
        self.lang_label.setText(lang or "code")
        dark = current_colors().dark
        if tint is not None:
            body = tinted_html(code, tint, current_colors().draft_tint)
            self.view.setHtml(f"<pre style='margin:0;'>{body}</pre>")
            self._rendered_lines = -1
        elif final:
            self.view.setHtml(highlight_html(code, lang, dark=dark))
            self._rendered_lines = -2
        else:
            # Streaming: re-highlight only when a line completes; the partial line stays plain.
            done, _, partial = code.rpartition("\n")
            n = code.count("\n")
            if n != self._rendered_lines:
                head = highlight_html(done, lang, dark=dark) if n else "<pre style='margin:0;'></pre>"
                self._head_html = head[: -len("</pre>")] + ("\n" if n else "")
                self._rendered_lines = n
            self.view.setHtml(self._head_html + html.escape(partial) + "</pre>")
        self.view.fit()


class CachedLabel(QLabel):
    """A word-wrapped label that remembers its size hints until its text changes.

    Qt's layouts throw away their items' cached sizes on every invalidation, and measuring
    wrapped rich text means laying it out again: with dozens of labels in a reply that is what
    made each streamed update cost tens of milliseconds.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._cache: dict = {}

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        self._cache.clear()
        super().setText(text)

    def setTextFormat(self, fmt) -> None:  # noqa: N802 - Qt override
        self._cache.clear()
        super().setTextFormat(fmt)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self._cache.clear()  # font, style or palette changes alter the metrics
        super().changeEvent(event)

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        key = ("h", width)
        if key not in self._cache:
            self._cache[key] = super().heightForWidth(width)
        return self._cache[key]

    def sizeHint(self):  # noqa: N802 - Qt override
        if "s" not in self._cache:
            self._cache["s"] = super().sizeHint()
        return self._cache["s"]

    def minimumSizeHint(self):  # noqa: N802 - Qt override
        if "m" not in self._cache:
            self._cache["m"] = super().minimumSizeHint()
        return self._cache["m"]


def markdown_html(text: str, *, font: QFont, code_bg: str) -> str:
    """Markdown -> Qt rich text, with inline code on a tinted monospace background.

    (A Markdown-mode QLabel renders `code` in a monospace font only, which is easy to miss.)
    """
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setMarkdown(protect_identifiers(text), QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    code_fmt = QTextCharFormat()
    code_fmt.setFontFamilies(_MONO)
    code_fmt.setBackground(QColor(code_bg))
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().fontFixedPitch():
                cur = QTextCursor(doc)
                cur.setPosition(frag.position())
                cur.setPosition(frag.position() + frag.length(), QTextCursor.MoveMode.KeepAnchor)
                cur.mergeCharFormat(code_fmt)
            it += 1
        block = block.next()
    return doc.toHtml()


def prose_label(parent: QWidget, name: str = "Message text") -> CachedLabel:
    label = CachedLabel(parent)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
    label.setOpenExternalLinks(True)
    label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
    label.setAccessibleName(name)
    return label


PAGE_SIZE = 12  # stable blocks per page widget: a new block relays out one page, not all


class _Page(QWidget):
    """A container of stable blocks that remembers its height for a width (see CachedLabel)."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._hfw: dict[int, int] = {}
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)

    def add(self, w: QWidget) -> None:
        self._hfw.clear()
        self.layout().addWidget(w)

    def event(self, event) -> bool:
        if event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.FontChange,
                            QEvent.Type.StyleChange):
            self._hfw.clear()
        return super().event(event)

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        if width not in self._hfw:
            self._hfw[width] = super().heightForWidth(width)
        return self._hfw[width]


class MarkdownFlow(QWidget):
    """See the module docstring. Stable blocks live in "pages" (plain containers of up to
    ``PAGE_SIZE`` widgets) so that a streamed update only invalidates the flow's own short
    layout — pages keep their cached sizes — and the tail block's widget."""

    def __init__(self, parent: QWidget | None = None, *, tint: bool = False) -> None:
        super().__init__(parent)
        self.tint = tint
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(8)
        self._offset = 0                 # where the unstable region starts in the text
        self._pages: list[_Page] = []
        self._stable: list[QWidget] = []
        self._tail: list[tuple[str, QWidget, str]] = []   # (kind, widget, rendered key)
        self.renders = 0                 # block renders (the bench and tests read it)

    @property
    def stable_widgets(self) -> list[QWidget]:
        return list(self._stable)

    def block_widgets(self) -> list[QWidget]:
        return self._stable + [w for _, w, _ in self._tail]

    def set_text(self, text: str, *, final: bool, spans: list | None = None, base: int = 0) -> None:
        region = text[self._offset:]
        blocks = split_blocks(region)
        n_stable = stable_count(region, blocks, final=final)
        origin = base + self._offset
        for block in blocks[:n_stable]:
            self._add_stable(block, spans, origin)
        self._drop_tail(0, min(n_stable, len(self._tail)))
        for k, block in enumerate(blocks[n_stable:]):
            self._render_tail(k, block, spans, origin)
        self._drop_tail(len(blocks) - n_stable, len(self._tail))
        if n_stable:
            self._offset += blocks[n_stable].start if n_stable < len(blocks) else len(region)

    def _drop_tail(self, lo: int, hi: int) -> None:
        for _, w, _ in self._tail[lo:hi]:
            self._lay.removeWidget(w)
            w.hide()
            w.deleteLater()
        del self._tail[lo:hi]

    def _add_stable(self, block: Block, spans: list | None, origin: int) -> None:
        if not self._pages or self._pages[-1].layout().count() >= PAGE_SIZE:
            page = _Page(self)
            self._lay.insertWidget(len(self._pages), page)
            self._pages.append(page)
        page = self._pages[-1]
        w = self._make(block.kind, page)
        self._fill(w, block, final=True, spans=spans, origin=origin)
        page.add(w)
        self._stable.append(w)

    def _render_tail(self, k: int, block: Block, spans: list | None, origin: int) -> None:
        key = f"{block.closed}|{block.lang}|{block.text}"
        if k < len(self._tail) and self._tail[k][0] == block.kind:
            if self._tail[k][2] == key:
                return
            w = self._tail[k][1]
        else:
            w = self._make(block.kind, self)
            if k < len(self._tail):
                old = self._tail[k][1]
                self._lay.replaceWidget(old, w)
                old.hide()
                old.deleteLater()
            else:
                self._lay.addWidget(w)
                self._tail.append((block.kind, w, ""))
        self._tail[k] = (block.kind, w, key)
        self._fill(w, block, final=False, spans=spans, origin=origin)

    def _make(self, kind: str, parent: QWidget) -> QWidget:
        return CodeBlock(parent) if kind == "code" else prose_label(parent)

    def _fill(self, w: QWidget, block: Block, *, final: bool, spans: list | None, origin: int) -> None:
        self.renders += 1
        tint = None
        if self.tint and block.kind == "code":
            a = origin + block.body_start
            tint = draft_spans_in(spans or [], a, a + len(block.text))
        elif self.tint:
            tint = draft_spans_in(spans or [], origin + block.start, origin + block.end)
        if block.kind == "code":
            w.set_code(block.text, block.lang, final=final and block.closed, tint=tint)
        elif tint is not None:
            w.setTextFormat(Qt.TextFormat.RichText)
            w.setText(tinted_html(block.text, tint, current_colors().draft_tint))
        else:
            w.setTextFormat(Qt.TextFormat.RichText)
            w.setText(markdown_html(block.text, font=w.font(), code_bg=current_colors().code_header))
