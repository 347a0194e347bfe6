"""Export a conversation to Markdown or JSON (plain functions over ``app.db`` records)."""
from __future__ import annotations

import json
import time
from collections.abc import Sequence

from app.chat.markdown import split_think
from app.db import Conversation, Message

EXPORT_FORMAT = "mtpchat-conversation"
EXPORT_VERSION = 1
_ROLE_TITLES = {"user": "User", "assistant": "Assistant", "system": "System"}


def to_markdown(conv: Conversation, messages: Sequence[Message]) -> str:
    """A readable transcript; reasoning goes into a collapsed ``<details>`` section."""
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
            out += [parts.answer.strip(), ""]
        else:
            out += [m.content.strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def to_json(conv: Conversation, messages: Sequence[Message]) -> str:
    """Everything we store, in a versioned envelope (stable keys; safe to re-import later)."""
    data = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "title": conv.title, "created_at": conv.created_at, "updated_at": conv.updated_at,
        "settings": conv.settings,
        "messages": [{"role": m.role, "content": m.content, "created_at": m.created_at,
                      "meta": m.meta} for m in messages],
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"
