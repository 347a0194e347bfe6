"""Attachments: files whose text goes into the prompt with the message (no Qt).

``read_attachment(path)`` turns a text, code, Markdown or PDF file into an ``app.db.Attachment``
(PDF text through pypdf) or raises ``AttachmentError`` with a message for the user.
``with_attachments(text, files)`` is what the model sees: each file's name and text in a
fenced block before the message. ``estimate_tokens`` is the app's conservative token count
(about 3 characters a token, where English prose runs near 4) used to warn before the
context overflows; the engine's own count is known only once a reply is written.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from app.db import Attachment

MAX_BYTES = 2_000_000  # a bigger file would not fit any context worth having
CHARS_PER_TOKEN = 3.0
CODE_SUFFIXES = {
    ".py", ".pyi", ".js", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs",
    ".go", ".java", ".kt", ".swift", ".rb", ".php", ".cs", ".sh", ".bash", ".zsh", ".sql",
    ".html", ".css", ".scss", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".xml",
    ".lua", ".r", ".m", ".pl", ".scala", ".dart", ".zig", ".el", ".vim", ".mk",
}
TEXT_SUFFIXES = {".txt", ".text", ".log", ".csv", ".tsv", ".rst", ".tex", ""}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdx"}
FILE_FILTER = ("Text, code, Markdown and PDF files (*.txt *.md *.pdf *.py *.js *.ts *.json "
               "*.csv *.log *.yaml *.toml *.c *.cpp *.h *.rs *.go *.java *.sh *.html *.css);;"
               "All files (*)")


class AttachmentError(Exception):
    """A file that cannot be attached; the message says why, for the user."""


def kind_of(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in CODE_SUFFIXES:
        return "code"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return None


def read_attachment(path: str | Path) -> Attachment:
    p = Path(path)
    kind = kind_of(p)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise AttachmentError(f"{p.name} cannot be read: {exc.strerror or exc}.") from None
    if size > MAX_BYTES:
        raise AttachmentError(f"{p.name} is {size / 1e6:.1f} MB; files up to "
                              f"{MAX_BYTES / 1e6:.0f} MB can be attached.")
    if kind == "pdf":
        return Attachment(p.name, _pdf_text(p), "pdf")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"{p.name} cannot be read: {exc.strerror or exc}.") from None
    if b"\0" in raw[:4096]:
        raise AttachmentError(f"{p.name} is not a text file (text, code, Markdown or PDF).")
    return Attachment(p.name, raw.decode("utf-8", errors="replace"), kind or "text")


def _pdf_text(p: Path) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError
    except ImportError:  # pragma: no cover - a dependency of the app
        raise AttachmentError("Reading PDF files needs the pypdf package.") from None
    try:
        reader = PdfReader(str(p))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PyPdfError, OSError, ValueError, KeyError) as exc:
        raise AttachmentError(f"{p.name} could not be read as a PDF ({exc}).") from None
    text = "\n\n".join(t.strip() for t in pages if t.strip())
    if not text:
        raise AttachmentError(f"{p.name} has no text to extract (a scanned PDF?).")
    return text


def with_attachments(text: str, files: Iterable[Attachment]) -> str:
    """The message as the model sees it: each attached file, named, then the message
    (images are not text: ``app.chat.images.user_content`` places them)."""
    parts = []
    for a in files:
        if a.kind == "image":
            continue
        fence = "````" if "```" in a.content else "```"
        parts.append(f"Attached file: {a.name}\n{fence}\n{a.content.rstrip()}\n{fence}")
    return "\n\n".join(parts + [text]) if parts else text


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + 1
