"""Stored messages <-> the chat template's tool turns, and what a step shows.

An assistant step that called tools keeps the model's own text as its content and, in
``meta["tool_calls"]``, one record per call: ``{"id", "name"`` (as the model wrote it),
``"server"``, ``"tool"``, ``"arguments"``, ``"state"``}: ``pending`` (asking the user),
``running``, ``done``, ``error``, ``denied``, ``cancelled`` (Stop), ``skipped`` (over the step
bound). Each call that ran or was denied has a ``tool`` message after the step, its result as
content and ``meta`` ``{"tool_call_id", "name", "server", "is_error", "seconds"}``.

``template_message(m, files, vision=)`` is what ``ChatSession.history`` sends for a stored
message: for user/system/plain assistant messages exactly what it sent before tools existed; for a step,
``content`` without the call markup and its thinking as ``reasoning_content`` (the template
keeps it only in the turns after the last user message, as Qwen3.5 expects), and the calls
that got a result as ``tool_calls``; a ``tool`` message as ``{"role": "tool", ...}``.
"""
from __future__ import annotations

import json
import re

from app.chat.images import user_content
from app.chat.markdown import split_think, strip_think

_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.S)
ANSWERED = ("done", "error", "denied")


def visible_answer(text: str) -> str:
    """``text`` without tool-call markup: complete blocks removed, an unfinished one (still
    streaming) cut off, and a trailing partial ``<tool_call>`` tag held back."""
    text = _BLOCK.sub("", text)
    i = text.find("<tool_call>")
    if i >= 0:
        text = text[:i]
    for n in range(len("<tool_call>") - 1, 0, -1):
        if text.endswith("<tool_call>"[:n]):
            text = text[:-n]
            break
    return text


def template_message(m, files=(), *, vision: bool = False) -> dict | None:
    """The chat template's message for stored message ``m`` (None: left out). A user message
    with images has a list of parts as content when the model reads images (``vision``)."""
    meta = m.meta or {}
    if m.role == "tool":
        return {"role": "tool", "content": m.content,
                "tool_call_id": meta.get("tool_call_id", ""), "name": meta.get("name", "")}
    if m.role != "assistant":
        return {"role": m.role, "content": user_content(m.content, files, vision=vision)}
    calls = [c for c in meta.get("tool_calls") or [] if c.get("state") in ANSWERED]
    if not calls and not meta.get("tool_calls"):
        content = strip_think(m.content)
        if not content.strip():
            return None
        return {"role": "assistant", "content": content}
    parts = split_think(m.content)
    out = {"role": "assistant", "content": visible_answer(parts.answer).strip()}
    if parts.think is not None and parts.think.strip():
        out["reasoning_content"] = parts.think.strip("\n")
    if calls:
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in calls]
    elif not out["content"]:
        return None
    return out


def _fenced(text: str, lang: str = "") -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{lang}", text.rstrip("\n"), fence, ""]


def calls_markdown(meta: dict) -> list[str]:
    """A step's tool calls for a Markdown export: each call's tool, state and arguments."""
    out: list[str] = []
    for c in (meta or {}).get("tool_calls") or []:
        where = f"{c.get('server')} › {c.get('tool')}" if c.get("server") else c.get("name")
        out += [f"**Tool call: {where}** ({c.get('state')})", ""]
        out += _fenced(json.dumps(c.get("arguments", {}), indent=2, ensure_ascii=False), "json")
    if (meta or {}).get("tool_note"):
        out += [f"*{meta['tool_note']}*", ""]
    return out


def result_markdown(m) -> list[str]:
    """A ``tool`` message for a Markdown export."""
    meta = m.meta or {}
    kind = "error" if meta.get("is_error") else "result"
    where = f"{meta.get('server')} › {meta.get('tool') or meta.get('name')}"
    return [f"**Tool {kind}: {where}**", ""] + _fenced(m.content)
