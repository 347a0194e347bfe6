"""Qwen tool calls in a model's text, parsed as the text streams.

Contract: ``ToolCallParser.feed(text)`` takes the next piece of the model's raw output and
returns a list of pieces, in order: ``Text`` (ordinary text, safe to show), ``ToolStart``
(a call began: index, id, name), ``ToolArgs`` (the next fragment of the call's ``arguments``
JSON; the fragments of one call concatenate to a complete JSON object) and ``ToolEnd`` (the
call is complete, with its parsed ``arguments`` dict). ``flush()`` ends the stream. Text that
may be the start of ``<tool_call>`` is held back until it is decided, so no raw tool-call
markup ever reaches ``Text``.

Two forms are accepted inside ``<tool_call>…</tool_call>`` (SERVER.md):
- Qwen3.5/3.6 (Qwen3-Coder) XML: ``<function=NAME>`` then ``<parameter=KEY>\\nVALUE\\n</parameter>``
  blocks, ``</function>``. Values are text, converted to the type the tool's JSON schema
  declares for that parameter (``schemas``: tool name -> JSON schema of its parameters).
- Qwen3 JSON: ``{"name": ..., "arguments": {...}}``.

A block that is neither (or is cut off by the end of the stream before a call started) comes
back as ``Text``; a call cut off after it started is closed with the parameters seen so far.
Whitespace-only text between or after calls is dropped (it would otherwise become an empty
text block between ``tool_use`` blocks).
``parse_tool_calls(text, schemas)`` is the non-streaming form: (text, [ToolCall]).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNC = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>")


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgs:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolEnd:
    index: int
    arguments: dict


Piece = Text | ToolStart | ToolArgs | ToolEnd


@dataclass
class ToolCall:
    """One complete call, as the non-streaming APIs report it."""

    id: str
    name: str
    arguments: dict = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def new_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


def convert_value(raw: str, schema: dict | None) -> object:
    """A parameter's text converted to the JSON type its schema declares."""
    kind = (schema or {}).get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    text = raw.strip()
    if kind == "string":
        return raw
    if kind in ("integer", "number", "boolean", "object", "array", "null"):
        try:
            value = json.loads(text if kind != "boolean" else text.lower())
        except ValueError:
            return raw
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        return value
    if kind is None:  # undeclared: JSON when it parses as a structure, else the text
        try:
            value = json.loads(text)
        except ValueError:
            return raw
        return value if not isinstance(value, str) else raw
    return raw


def _trim_value(raw: str) -> str:
    # The template writes "<parameter=k>\nVALUE\n</parameter>": one newline each side is markup.
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


class ToolCallParser:
    """Streaming parser; see the module docstring."""

    def __init__(self, schemas: dict[str, dict] | None = None, *, id_prefix: str = "call_") -> None:
        self.schemas = schemas or {}
        self.id_prefix = id_prefix
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._in_call = False
        self._call: _CallState | None = None

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            progressed = self._step_call(out) if self._in_call else self._step_text(out)
            if not progressed:
                return out

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._in_call:
            if self._call is not None and self._call.started:
                self._call.finish(out, self)
            else:
                out.append(Text(OPEN + self._buf))
        elif self._buf and (self._buf.strip() or not self.calls):
            out.append(Text(self._buf))
        self._buf, self._in_call, self._call = "", False, None
        return out

    def _step_text(self, out: list[Piece]) -> bool:
        i = self._buf.find(OPEN)
        if i >= 0:
            if i and (self._buf[:i].strip() or not self.calls):
                out.append(Text(self._buf[:i]))
            self._buf = self._buf[i + len(OPEN):]
            self._in_call, self._call = True, _CallState(len(self.calls))
            return True
        keep = _partial_suffix(self._buf, OPEN)
        if self.calls and not self._buf[:len(self._buf) - keep].strip():
            return False  # whitespace between or after calls: hold (dropped at the end)
        if len(self._buf) > keep:
            out.append(Text(self._buf[:len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _step_call(self, out: list[Piece]) -> bool:
        call = self._call
        assert call is not None
        end = self._buf.find(CLOSE)
        body = self._buf if end < 0 else self._buf[:end]
        call.advance(body, out, self)
        if end < 0:
            return False
        if call.started:
            call.finish(out, self)
        elif not call.parse_json(body, out, self):
            out.append(Text(OPEN + body + CLOSE))
        self._buf = self._buf[end + len(CLOSE):]
        self._in_call, self._call = False, None
        return True

    def _start(self, name: str, out: list[Piece]) -> ToolCall:
        call = ToolCall(id=new_call_id(self.id_prefix), name=name)
        self.calls.append(call)
        out.append(ToolStart(len(self.calls) - 1, call.id, name))
        return call


@dataclass
class _CallState:
    """One ``<tool_call>`` block being read: how much of its body is consumed."""

    index: int
    pos: int = 0          # consumed characters of the body
    call: ToolCall | None = None
    opened_args: bool = False

    @property
    def started(self) -> bool:
        return self.call is not None

    def advance(self, body: str, out: list[Piece], parser: ToolCallParser) -> None:
        """Consume every complete ``<function=…>`` / ``<parameter>…</parameter>`` in ``body``."""
        if self.call is None:
            m = _FUNC.search(body, self.pos)
            if m is None:
                return
            self.call = parser._start(m.group(1).strip(), out)
            self.pos = m.end()
        while True:
            m = _PARAM.search(body, self.pos)
            if m is None:
                return
            end = body.find("</parameter>", m.end())
            if end < 0:
                return
            self._add_param(m.group(1).strip(), _trim_value(body[m.end():end]), out, parser)
            self.pos = end + len("</parameter>")

    def _add_param(self, key: str, raw: str, out: list[Piece], parser: ToolCallParser) -> None:
        assert self.call is not None
        props = (parser.schemas.get(self.call.name) or {}).get("properties") or {}
        value = convert_value(raw, props.get(key))
        self.call.arguments[key] = value
        sep = ", " if self.opened_args else "{"
        self.opened_args = True
        frag = f"{sep}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        out.append(ToolArgs(self.index, frag))

    def finish(self, out: list[Piece], parser: ToolCallParser) -> None:
        assert self.call is not None
        out.append(ToolArgs(self.index, "}" if self.opened_args else "{}"))
        out.append(ToolEnd(self.index, dict(self.call.arguments)))

    def parse_json(self, body: str, out: list[Piece], parser: ToolCallParser) -> bool:
        """Qwen3's ``{"name": …, "arguments": …}`` form; False when ``body`` is not that."""
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return False
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return False
        if not isinstance(args, dict):
            return False
        self.call = parser._start(obj["name"], out)
        self.call.arguments.update(args)
        out.append(ToolArgs(self.index, json.dumps(args, ensure_ascii=False)))
        out.append(ToolEnd(self.index, dict(args)))
        return True


def parse_tool_calls(text: str, schemas: dict[str, dict] | None = None,
                     *, id_prefix: str = "call_") -> tuple[str, list[ToolCall]]:
    """Non-streaming: the text with tool-call blocks removed, and the calls in order."""
    parser = ToolCallParser(schemas, id_prefix=id_prefix)
    pieces = parser.feed(text) + parser.flush()
    return "".join(p.text for p in pieces if isinstance(p, Text)), parser.calls


def schemas_of(tools: list[dict] | None) -> dict[str, dict]:
    """Tool name -> parameters schema, from OpenAI (``function``) or Anthropic tool specs."""
    out: dict[str, dict] = {}
    for t in tools or []:
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        if isinstance(name, str):
            out[name] = fn.get("parameters") or fn.get("input_schema") or {}
    return out
