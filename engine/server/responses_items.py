"""The Responses API's items: input items -> template messages, and reply parts -> output
items and their stream events (``engine.server.responses_api``).

Contract:
- ``input_messages(input)``: a string (one user message) or a list of items -> template
  messages (``engine.server.templates``). ``message`` items (roles user, system, developer,
  assistant; string content or ``input_text`` / ``output_text`` parts), ``function_call``
  (merged into the assistant turn before it, as the template writes one turn with its calls),
  ``function_call_output`` (a tool message), ``reasoning`` (its text becomes the next
  assistant turn's ``reasoning_content``). Anything else (images, files, hosted tool items,
  item references) is a 400 naming the item.
- ``output_messages(items)``: a response's output items as the template messages they add.
- ``tools_of(tools)``: flat function tools (``{type: function, name, description,
  parameters}``) -> the template's form; other tool types are a 400.
- ``OutputItems``: ``part(p)`` takes the next ``ReplyParser`` part and returns the stream
  events it makes as ``(type, fields)`` pairs (no ``sequence_number``); ``close(incomplete)``
  ends the open item (and adds an empty message when the reply had neither text nor calls);
  ``done_items()`` is the finished ``output`` list.
"""
from __future__ import annotations

import json

from engine.server.common import new_id
from engine.server.errors import bad_request
from engine.server.images import openai_part
from engine.server.toolcalls import ToolArgs, ToolEnd, ToolStart

TEXT_PARTS = ("input_text", "output_text", "text")


# ---------------------------------------------------------------------- input

def _parts_text(content, where: str, images: bool = False):
    """Text parts joined; with ``images`` (a user message) ``input_image`` parts become
    image placeholders (``engine.server.images``) and the content a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of text parts", "input")
    out, mixed = [], []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else type(p).__name__
        if kind in TEXT_PARTS and isinstance(p.get("text"), str):
            out.append(p["text"])
            mixed.append({"type": "text", "text": p["text"]})
        elif kind == "refusal" and isinstance(p.get("refusal"), str):
            out.append(p["refusal"])
            mixed.append({"type": "text", "text": p["refusal"]})
        elif images and kind == "input_image":
            mixed.append(openai_part(p, f"{where}.content[{j}]"))
        else:
            only = "text and input_image" if images else "text only"
            raise bad_request(f"{where}.content[{j}]: {kind!r} parts are not supported by this "
                              f"server ({only})", "input")
    return mixed if len(mixed) != len(out) else "".join(out)


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant"):
        raise bad_request(f"{where}: role must be user, assistant, system or developer", "input")
    return {"role": role, "content": _parts_text(item.get("content"), where,
                                                 images=role == "user")}


def _arguments(item: dict, where: str) -> dict:
    args = item.get("arguments")
    if isinstance(args, dict):
        return args
    if args is None or (isinstance(args, str) and not args.strip()):
        return {}
    try:
        value = json.loads(args) if isinstance(args, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise bad_request(f"{where}: arguments must be a JSON object (as a string)", "input")
    return value


def _add_call(out: list[dict], item: dict, where: str, reasoning: str | None) -> None:
    if not isinstance(item.get("name"), str):
        raise bad_request(f"{where}: a function_call needs a name", "input")
    call = {"id": item.get("call_id"), "type": "function",
            "function": {"name": item["name"], "arguments": _arguments(item, where)}}
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
    turn = out[-1]
    if reasoning:
        turn["reasoning_content"] = turn.get("reasoning_content", "") + reasoning
    turn.setdefault("tool_calls", []).append(call)


def _reasoning_text(item: dict) -> str:
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(p["text"] for p in parts if isinstance(p, dict)
                           and p.get("type") == kind and isinstance(p.get("text"), str))
            if text:
                return text
    return ""


def input_messages(value) -> list[dict]:
    """See the module docstring."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request("input must be a string or a list of items", "input")
    out: list[dict] = []
    reasoning: str | None = None
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type") or "message"
        if kind == "message":
            msg = _message(item, where)
            if msg["role"] == "assistant" and reasoning:
                msg["reasoning_content"] = reasoning
            reasoning = None if msg["role"] == "assistant" else reasoning
            out.append(msg)
        elif kind == "function_call":
            _add_call(out, item, where, reasoning)
            reasoning = None
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _parts_text(item.get("output"), where)})
        elif kind == "reasoning":
            reasoning = (reasoning or "") + _reasoning_text(item)
        else:
            raise bad_request(f"{where}: {kind!r} items are not supported by this server "
                              "(message, function_call, function_call_output, reasoning)",
                              "input")
    return out


def output_messages(items: list[dict]) -> list[dict]:
    return input_messages(items)


def tools_of(tools) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of {type: function, name, parameters}", "tools")
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise bad_request(f"tools[{i}]: {kind!r} tools are not supported by this server "
                              "(function tools only)", "tools")
        fn = t["function"] if isinstance(t.get("function"), dict) else t  # chat-style too
        if not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{i}]: a function tool needs a name", "tools")
        out.append({"type": "function", "function": {
            "name": fn["name"], "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}}}})
    return out


# ---------------------------------------------------------------------- output

class OutputItems:
    """Reply parts -> output items and their events (see the module docstring)."""

    def __init__(self, *, summary: bool = False) -> None:
        self.summary = summary
        self.items: list[dict] = []
        self.open: dict | None = None
        self.text = ""       # the open item's text so far (reasoning, message or arguments)

    def done_items(self) -> list[dict]:
        return [i for i in self.items if i.get("status") != "in_progress"]

    def _where(self) -> dict:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _add(self, item: dict) -> list[tuple[str, dict]]:
        out = self.close()
        self.items.append(item)
        self.open, self.text = item, ""
        added = ("response.output_item.added", {"output_index": len(self.items) - 1,
                                                "item": dict(item)})
        if item["type"] == "message":
            return out + [added, ("response.content_part.added", {
                **self._where(), "content_index": 0, "part": _text_part("")})]
        if item["type"] == "reasoning":
            return out + [added, ("response.content_part.added", {
                **self._where(), "content_index": 0,
                "part": {"type": "reasoning_text", "text": ""}})]
        return out + [added]

    def part(self, part) -> list[tuple[str, dict]]:
        if isinstance(part, ToolStart):
            return self._add({"id": new_id("fc_"), "type": "function_call", "call_id": part.id,
                              "name": part.name, "arguments": "", "status": "in_progress"})
        if isinstance(part, ToolArgs):
            self.text += part.fragment
            return [("response.function_call_arguments.delta",
                     {**self._where(), "delta": part.fragment})]
        if isinstance(part, ToolEnd):
            return self.close()
        channel, text = part
        kind = "reasoning" if channel == "reasoning" else "message"
        out = []
        if self.open is None or self.open["type"] != kind:
            out = self._add({"id": new_id("rs_"), "type": "reasoning", "summary": [],
                             "content": [], "status": "in_progress"} if kind == "reasoning" else
                            {"id": new_id("msg_"), "type": "message", "role": "assistant",
                             "status": "in_progress", "content": []})
        self.text += text
        event = "response.reasoning_text.delta" if kind == "reasoning" else \
            "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return out + [(event, {**self._where(), "content_index": 0, "delta": text, **extra})]

    def close(self, incomplete: bool = False) -> list[tuple[str, dict]]:
        """End the open item; with ``incomplete`` this is the end of the reply (cut short
        when True), and a reply with no message and no call gets an empty message."""
        item = self.open
        if item is None:
            return []
        where, text, self.open = self._where(), self.text, None
        item["status"] = "incomplete" if incomplete else "completed"
        if item["type"] == "function_call":
            item["arguments"] = text
            return [("response.function_call_arguments.done",
                     {**where, "arguments": text, "name": item["name"]}),
                    ("response.output_item.done", {"output_index": where["output_index"],
                                                   "item": item})]
        if item["type"] == "message":
            item["content"] = [_text_part(text)]
            events = [("response.output_text.done", {**where, "content_index": 0, "text": text,
                                                      "logprobs": []}),
                      ("response.content_part.done", {**where, "content_index": 0,
                                                      "part": _text_part(text)})]
        else:
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events = [("response.reasoning_text.done", {**where, "content_index": 0,
                                                         "text": text}),
                      ("response.content_part.done", {**where, "content_index": 0,
                                                      "part": item["content"][0]})]
            events += self._summary(item, where, text)
        return events + [("response.output_item.done", {"output_index": where["output_index"],
                                                        "item": item})]

    def _summary(self, item: dict, where: dict, text: str) -> list[tuple[str, dict]]:
        """The reasoning as its own summary, when one was asked for."""
        if not self.summary:
            return []
        part = {"type": "summary_text", "text": text}
        item["summary"] = [part]
        at = {**where, "summary_index": 0}
        return [("response.reasoning_summary_part.added",
                 {**at, "part": {"type": "summary_text", "text": ""}}),
                ("response.reasoning_summary_text.delta", {**at, "delta": text}),
                ("response.reasoning_summary_text.done", {**at, "text": text}),
                ("response.reasoning_summary_part.done", {**at, "part": part})]

    def finish(self, incomplete: bool) -> list[tuple[str, dict]]:
        """The end of the reply: close the open item; an empty reply gets an empty message."""
        out = self.close(incomplete)
        if not any(i["type"] in ("message", "function_call") for i in self.items):
            out += self._add({"id": new_id("msg_"), "type": "message", "role": "assistant",
                              "status": "in_progress", "content": []})
            out += self.close(incomplete)
        return out


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
