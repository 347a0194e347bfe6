"""Tools in the chat (issue 30): MCP servers and the built-in ``python_doc``, and the confirmed
tool loop.

Layout: ``config`` (``mcp.json``: the schema LM Studio and Claude Desktop use, validation,
import from their files, the app's tool preferences), ``host`` (``McpHost``: every MCP session
on one asyncio thread of its own, no Qt; the ``mcp`` SDK is imported there, on first use),
``builtin`` (``python_doc``), ``catalog`` (the tools a chat offers the model, by name),
``history`` (stored messages -> the chat template's tool turns), ``manager`` (the Qt side of the
host), ``loop`` (``ToolLoop``: parse the model's calls, ask, run, continue), ``cards`` (the
call/result cards), ``dialog`` (the Tools & MCP settings window), ``chat_button`` (the per-chat
Tools switch).
"""
