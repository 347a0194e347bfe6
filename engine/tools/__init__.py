"""Tools that run inside MTP Chat itself (no MCP server): ``python_doc``. The app offers them in
its chat (``app.tools.builtin``); the demo model's trainer writes its tool chats with them, so
what the model learnt to read is what the tool returns."""
from __future__ import annotations
