"""A chat reply's raw text -> the parts both APIs report: reasoning, content and tool calls.

Contract: ``ReplyParser(opened_think=..., schemas=...)``; ``feed(text)`` / ``flush()`` return
parts in order: ``("reasoning", str)``, ``("content", str)`` or a ``toolcalls`` piece
(``ToolStart`` / ``ToolArgs`` / ``ToolEnd``). Tool calls are looked for (only when
``schemas`` is not None, i.e. the request offered tools) in the whole reply, inside a think
block too (vLLM #39056 dropped those); what is left goes through the think splitter. A
non-streaming response is the same parts, collected (``collect``). ``max_calls`` bounds the
calls reported (``parallel_tool_calls: false`` is 1): the pieces of later calls are dropped and
``calls`` holds only the first ``max_calls``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.server.reasoning import ThinkSplitter
from engine.server.toolcalls import Text, ToolArgs, ToolCall, ToolCallParser, ToolEnd, ToolStart

Part = tuple[str, str] | ToolStart | ToolArgs | ToolEnd


class ReplyParser:
    def __init__(self, *, opened_think: bool = False, schemas: dict[str, dict] | None = None,
                 id_prefix: str = "call_", max_calls: int | None = None) -> None:
        self.think = ThinkSplitter(opened=opened_think)
        self.tools = ToolCallParser(schemas, id_prefix=id_prefix) if schemas is not None else None
        self.max_calls = max_calls

    @property
    def calls(self) -> list[ToolCall]:
        calls = self.tools.calls if self.tools is not None else []
        return calls if self.max_calls is None else calls[:self.max_calls]

    @property
    def thinking(self) -> bool:
        """True while the reply is inside its think block (the think splitter's view)."""
        return self.think.state == "reasoning"

    def feed(self, text: str) -> list[Part]:
        if self.tools is None:
            return list(self.think.feed(text))
        return self._route(self.tools.feed(text))

    def flush(self) -> list[Part]:
        out: list[Part] = self._route(self.tools.flush()) if self.tools is not None else []
        out.extend(self.think.flush())
        return out

    def _route(self, pieces) -> list[Part]:
        out: list[Part] = []
        for p in pieces:
            if isinstance(p, Text):
                out.extend(self.think.feed(p.text))
            elif self.max_calls is None or p.index < self.max_calls:
                out.append(p)
        return out


@dataclass
class Collected:
    """A whole reply's parts, joined."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def collect(parser: ReplyParser, text: str) -> Collected:
    out = Collected()
    for part in parser.feed(text) + parser.flush():
        if isinstance(part, tuple):
            if part[0] == "reasoning":
                out.reasoning += part[1]
            else:
                out.content += part[1]
    out.calls = list(parser.calls)
    return out
