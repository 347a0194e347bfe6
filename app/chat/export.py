"""Export a conversation to Markdown or JSON (plain functions over ``app.db`` records).

``to_markdown`` and ``to_json`` take the conversation (its current title), its messages and
``attachments`` (message id -> its ``Attachment`` list, as ``ChatStore.attachments`` returns),
each attachment's name and text going with the message it came with; an image goes in
whole, as the file it was (Markdown: an inline ``data:`` image, so the export is one file that
any Markdown viewer shows; JSON: ``"mime"`` and ``"data_base64"``). ``file_name(title, fmt)``
is a clean default file name for the export.
"""
from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping, Sequence

from app.chat.images import data_uri, mime_type
from app.chat.markdown import split_think
from app.db import Attachment, Conversation, Message
from app.tools.history import calls_markdown, result_markdown, visible_answer

EXPORT_FORMAT = "mtpchat-conversation"
EXPORT_VERSION = 1
_ROLE_TITLES = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}


Attachments = Mapping[int, Sequence[Attachment]]
_FENCE_LANG = {"markdown": "markdown", "code": ""}
MAX_NAME = 80


def file_name(title: str, fmt: str) -> str:
    """A default file name from ``title``: letters, digits, spaces, dashes and inner dots kept,
    any other run of characters becomes one space (no "_" stand-ins), at most ``MAX_NAME``
    characters, ending in ``.md`` or ``.json``; "chat" when nothing is left."""
    words = re.sub(r"[^\w\s.-]|_", " ", title.replace("…", " "))
    words = re.sub(r"\.{2,}", " ", words)  # ellipses and ".." (never a path part)
    clean = " ".join(words.split()).strip(" .-")
    if len(clean) > MAX_NAME:
        clean = clean[:MAX_NAME].rsplit(" ", 1)[0].strip(" .-") or clean[:MAX_NAME]
    return f"{clean or 'chat'}.{'md' if fmt == 'md' else 'json'}"


def _fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _attachment_markdown(a: Attachment) -> list[str]:
    if a.kind == "image":
        alt = a.name.replace("[", "(").replace("]", ")")
        return [f"![{alt}]({data_uri(a.data)})", ""]
    fence = _fence(a.content)
    lang = _FENCE_LANG.get(a.kind, "")
    if a.kind == "code" and "." in a.name:
        lang = a.name.rsplit(".", 1)[1].lower()
    return [f"**Attachment: {a.name}**", "", f"{fence}{lang}", a.content.rstrip("\n"), fence, ""]


def to_markdown(conv: Conversation, messages: Sequence[Message],
                attachments: Attachments | None = None) -> str:
    """A readable transcript; reasoning goes into a collapsed ``<details>`` section, each
    attachment (name and text) into a fenced block under the message it came with."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.created_at))
    out = [f"# {conv.title}", "", f"*Exported from MTP Chat — started {when}*", ""]
    system = conv.settings.get("system_prompt") if conv.settings else None
    if system:
        out += ["## System", "", system, ""]
    for m in messages:
        out += [f"## {_ROLE_TITLES.get(m.role, m.role.title())}", ""]
        if m.role == "assistant":
            parts = split_think(m.content)
            if parts.think is not None and parts.think.strip():
                secs = m.meta.get("think_s")
                label = f"Thought for {secs:.0f} s" if isinstance(secs, (int, float)) else "Thoughts"
                out += ["<details>", f"<summary>{label}</summary>", "", parts.think.strip(), "",
                        "</details>", ""]
            out += [visible_answer(parts.answer).strip(), ""] + calls_markdown(m.meta)
        elif m.role == "tool":
            out += result_markdown(m)
        else:
            out += [m.content.strip(), ""]
        for a in (attachments or {}).get(m.id, ()):
            out += _attachment_markdown(a)
    return "\n".join(out).rstrip() + "\n"


def to_json(conv: Conversation, messages: Sequence[Message],
            attachments: Attachments | None = None) -> str:
    """Everything we store, in a versioned envelope (stable keys; safe to re-import later);
    a message with attachments has ``"attachments": [{"name", "kind", "content"}, ...]``
    (an image's also ``"mime"`` and ``"data_base64"``: the file's bytes)."""
    data = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "title": conv.title, "created_at": conv.created_at, "updated_at": conv.updated_at,
        "settings": conv.settings,
        "messages": [_message_json(m, (attachments or {}).get(m.id, ())) for m in messages],
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def _message_json(m: Message, attachments: Sequence[Attachment]) -> dict:
    out = {"role": m.role, "content": m.content, "created_at": m.created_at, "meta": m.meta}
    if attachments:
        out["attachments"] = [_attachment_json(a) for a in attachments]
    return out


def _attachment_json(a: Attachment) -> dict:
    out = {"name": a.name, "kind": a.kind, "content": a.content}
    if a.kind == "image":
        out["mime"] = mime_type(a.data)
        out["data_base64"] = base64.b64encode(a.data).decode("ascii")
    return out
