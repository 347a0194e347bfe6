"""The tools a chat offers the model: the built-in ``python_doc`` and the tools of the MCP
servers switched on for the chat, by the names the model sees.

``Catalog.build(servers, states)``: ``servers`` are the chat's chosen server names (the
built-in one is ``app.tools.builtin.SERVER``), ``states`` the host's ``ServerState``s; only
ready servers contribute. A tool name two servers share is offered as ``server__tool`` for
each (the model's call is then unambiguous). ``specs()`` is the chat template's ``tools`` list
(OpenAI's function form), ``schemas()`` the parser's name -> parameters schema,
``resolve(name)`` -> (server, tool) or None.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.tools import builtin
from app.tools.host import ServerState, ToolInfo

BUILTIN_TOOLS = (ToolInfo(builtin.SPEC["name"], builtin.SPEC["description"],
                          builtin.SPEC["inputSchema"]),)


def _model_name(server: str, tool: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")[:64]


@dataclass
class Catalog:
    entries: dict[str, tuple[str, ToolInfo]] = field(default_factory=dict)

    @classmethod
    def build(cls, servers, states: dict[str, ServerState]) -> Catalog:
        found: list[tuple[str, ToolInfo]] = []
        for server in servers:
            if server == builtin.SERVER:
                found.extend((server, t) for t in BUILTIN_TOOLS)
            elif (st := states.get(server)) is not None and st.status == "ready":
                found.extend((server, t) for t in st.tools)
        counts: dict[str, int] = {}
        for _, t in found:
            counts[t.name] = counts.get(t.name, 0) + 1
        entries = {(t.name if counts[t.name] == 1 else _model_name(s, t.name)): (s, t)
                   for s, t in found}
        return cls(entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def specs(self) -> list[dict]:
        return [{"type": "function", "function": {
            "name": name, "description": t.description,
            "parameters": t.schema or {"type": "object", "properties": {}}}}
            for name, (_, t) in self.entries.items()]

    def schemas(self) -> dict[str, dict]:
        return {name: t.schema for name, (_, t) in self.entries.items()}

    def resolve(self, name: str) -> tuple[str, str] | None:
        hit = self.entries.get(name)
        return (hit[0], hit[1].name) if hit else None
