"""Pure text logic for rendering replies: the ``<think>`` split, Markdown block splitting,
draft-span bookkeeping and code highlighting to HTML. No widgets here.

Block splitting contract (what makes streaming cheap): a reply is cut into top-level blocks —
fenced code blocks, and prose chunks separated by blank lines (indented continuation lines stay
with the chunk before them; a very long chunk is split again before a list item or heading).
A block is *stable* once the next block's first line is complete: from then on its text and
extent never change, so its widget is rendered once and never re-laid-out.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SOFT_LIMIT = 1200  # characters after which a prose chunk may be cut before a list item/heading
HARD_LIMIT = 16_000  # a prose chunk or one line is cut here whatever follows (bounded renders)
PREVIEW_CHARS = 50_000  # a longer message shows its first part; the whole is one click away

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
_SPLIT_POINT = re.compile(r"^(?:[-*+] |\d{1,9}[.)] |#{1,6} )")


@dataclass(frozen=True)
class ThinkSplit:
    """``content`` = [``<think>`` think ``</think>``] answer; offsets index into ``content``."""

    think: str | None
    think_done: bool
    answer: str
    answer_offset: int
    think_offset: int = 0


def split_think(content: str) -> ThinkSplit:
    stripped = content.lstrip()
    lead = len(content) - len(stripped)
    if not stripped.startswith(THINK_OPEN):
        if THINK_OPEN.startswith(stripped) and stripped:  # "<thi" while streaming
            return ThinkSplit("", False, "", len(content), len(content))
        return ThinkSplit(None, False, content, 0)
    start = lead + len(THINK_OPEN)
    end = content.find(THINK_CLOSE, start)
    if end < 0:
        return ThinkSplit(content[start:], False, "", len(content), start)
    after = end + len(THINK_CLOSE)
    rest = content[after:]
    skip = len(rest) - len(rest.lstrip("\n"))
    return ThinkSplit(content[start:end], True, rest[skip:], after + skip, start)


def strip_think(content: str) -> str:
    """The answer without its reasoning (what goes back into the next prompt and exports)."""
    return split_think(content).answer


@dataclass(frozen=True)
class Block:
    kind: Literal["prose", "code"]
    start: int          # offsets into the text that was split
    end: int
    text: str           # prose: the Markdown; code: the code without its fences
    lang: str = ""
    closed: bool = True  # code: closing fence seen
    body_start: int = -1  # code: where the code itself starts (after the opening fence line)


def preview_cut(text: str, limit: int = PREVIEW_CHARS) -> int:
    """Where to cut ``text`` to show at most ``limit`` characters: ``len(text)`` when it fits,
    else at a paragraph or line end in the last tenth before ``limit``, else at ``limit``."""
    if len(text) <= limit:
        return len(text)
    floor = limit - limit // 10
    for sep in ("\n\n", "\n"):
        i = text.rfind(sep, floor, limit)
        if i >= 0:
            return i + len(sep)
    return limit


def _bounded_lines(text: str) -> list[str]:
    """``text``'s lines (ends kept), a line longer than ``HARD_LIMIT`` cut into pieces of that
    size: the regular expressions and Qt's layout then never see one unbounded line."""
    lines = text.splitlines(keepends=True)
    if all(len(line) <= HARD_LIMIT for line in lines):
        return lines
    out: list[str] = []
    for line in lines:
        out.extend(line[i:i + HARD_LIMIT] for i in range(0, len(line), HARD_LIMIT))
    return out


def split_blocks(text: str) -> list[Block]:
    """Cut ``text`` into top-level blocks (see the module docstring)."""
    blocks: list[Block] = []
    lines = _bounded_lines(text)
    pos = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            pos += len(line)
            i += 1
            continue
        m = _FENCE.match(line)
        if m:
            i, pos = _take_code(lines, i, pos, m, blocks)
        else:
            i, pos = _take_prose(lines, i, pos, blocks, text)
    return blocks


def _take_code(lines: list[str], i: int, pos: int, m: re.Match, blocks: list[Block]):
    fence = m.group(1)
    start = pos
    pos += len(lines[i])
    body_start = pos
    i += 1
    body: list[str] = []
    closed = False
    while i < len(lines):
        line = lines[i]
        pos += len(line)
        i += 1
        s = line.strip()
        if s and s[0] == fence[0] and set(s) == {fence[0]} and len(s) >= len(fence):
            closed = True
            break
        body.append(line)
    code = "".join(body)
    if code.endswith("\n"):
        code = code[:-1]
    blocks.append(Block("code", start, pos, code, m.group(2), closed, body_start))
    return i, pos


def _take_prose(lines: list[str], i: int, pos: int, blocks: list[Block], text: str):
    start = pos
    size = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            break
        if not line.strip():
            # A blank line ends the chunk unless the next line is an indented continuation.
            j = i
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j >= len(lines) or not lines[j][:1].isspace() or _FENCE.match(lines[j]):
                break
        elif size > SOFT_LIMIT and _SPLIT_POINT.match(line) or size + len(line) > HARD_LIMIT:
            break
        size += len(line)
        pos += len(line)
        i += 1
    blocks.append(Block("prose", start, pos, text[start:pos].rstrip()))
    return i, pos


def stable_count(text: str, blocks: list[Block], *, final: bool) -> int:
    """How many leading ``blocks`` of ``text`` can no longer change as more text arrives."""
    if final:
        return len(blocks)
    n = 0
    for k in range(len(blocks) - 1):
        if "\n" in text[blocks[k + 1].start:]:
            n = k + 1
        else:
            break
    return n


# A code span opens and closes with whole backtick runs of one length (CommonMark); matching
# only whole runs also keeps a line of thousands of backticks linear, not cubic, to scan.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_DUNDER = re.compile(r"(?<![\w\\])__([A-Za-z0-9][A-Za-z0-9_]*?)__(?!\w)")


def protect_identifiers(markdown: str) -> str:
    """Escape the underscores of Python dunder names (``__next__``, ``__init__``) outside code
    spans, so Markdown does not read them as strong emphasis: ``.__next__()`` stays itself.
    (People and models write bold as ``**bold**``; ``__x__`` in a chat is nearly always code.)"""
    out: list[str] = []
    pos = 0
    for m in _CODE_SPAN.finditer(markdown):
        out.append(_DUNDER.sub(r"\\_\\_\1\\_\\_", markdown[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_DUNDER.sub(r"\\_\\_\1\\_\\_", markdown[pos:]))
    return "".join(out)


def plain_inline(text: str) -> str:
    """``text`` without inline Markdown marks (code backticks, ``**``): for one-line places
    that show plain text, such as buttons and chat titles."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), text)
    return re.sub(r"\*\*(.+?)\*\*", r"\1", text)


def draft_spans_in(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``spans`` (absolute [a, b) ranges) inside [start, end), made relative."""
    out = []
    for a, b in spans:
        a2, b2 = max(a, start), min(b, end)
        if a2 < b2:
            out.append((a2 - start, b2 - start))
    return out


def tinted_html(text: str, spans: list[tuple[int, int]], color: str) -> str:
    """``text`` escaped for Qt rich text with ``spans`` (relative ranges) on a tinted background."""
    parts: list[str] = []
    pos = 0
    for a, b in sorted(spans):
        if a > pos:
            parts.append(_esc(text[pos:a]))
        parts.append(f'<span style="background-color:{color};">{_esc(text[max(a, pos):b])}</span>')
        pos = max(pos, b)
    parts.append(_esc(text[pos:]))
    return "".join(parts)


def _esc(s: str) -> str:
    return html.escape(s).replace("\n", "<br>").replace("  ", "&nbsp; ")


def highlight_html(code: str, lang: str, *, dark: bool) -> str:
    """Syntax-highlighted ``code`` as Qt-compatible HTML (inline styles, <pre>), via Pygments.

    Falls back to escaped plain text when Pygments or a lexer for ``lang`` is unavailable.
    """
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import TextLexer, get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:
        return f"<pre>{html.escape(code)}</pre>"
    try:
        lexer = get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    style = "monokai" if dark else "default"
    fmt = HtmlFormatter(style=style, noclasses=True, nowrap=True)
    body = highlight(code, lexer, fmt)
    if body.endswith("\n"):
        body = body[:-1]
    return f"<pre style=\"margin:0;\">{body}</pre>"
