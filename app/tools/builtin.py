"""The app's built-in tool server: ``python_doc`` (``engine.tools.python_doc``) under the server
name ``python``, and ``call_builtin``, which runs a call the user allowed."""
from __future__ import annotations

from engine.tools.python_doc import (DENIED, MAX_CHARS, NAME, SPEC, DocError,  # noqa: F401
                                     python_doc)

SERVER = "python"  # the name the built-in tools go by, as an MCP server's would


def call_builtin(tool: str, arguments: dict) -> tuple[str, bool]:
    """(text, is_error) of a built-in tool call."""
    if tool != NAME:
        return f"There is no built-in tool named {tool}.", True
    name = arguments.get("name")
    if not isinstance(name, str):
        return "python_doc needs a 'name' (a string such as 'os.path.join').", True
    try:
        return python_doc(name), False
    except DocError as exc:
        return f"python_doc: {exc}.", True
