"""The built-in tool ``python_doc(name)``, the real docstring of a standard-library module,
class or function from the Python the app runs on.

Read-only: a name is looked up among the modules already imported, or imported only when its
top-level module is in the standard library (``sys.stdlib_module_names``) and not one that
does something when imported (``DENIED``: ``antigravity`` opens a browser, ``this`` prints,
the GUI and demo packages). No attribute is called; at most ``MAX_CHARS`` come back.
"""
from __future__ import annotations

import builtins
import importlib
import inspect
import re
import sys

NAME = "python_doc"
MAX_CHARS = 4000
DENIED = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter",
                    "turtle", "turtledemo", "webbrowser", "pydoc_data", "ensurepip", "venv"})
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

SPEC = {
    "name": NAME,
    "description": ("Return the documentation (signature and docstring) of a Python "
                    "standard-library module, class or function, e.g. 'os.path.join', "
                    "from the Python this app runs on."),
    "inputSchema": {
        "type": "object",
        "properties": {"name": {"type": "string",
                                "description": "dotted name, e.g. 'json.dumps'"}},
        "required": ["name"],
    },
}


def function_spec() -> dict:
    """The tool in OpenAI's function form, as a chat template's ``tools`` list holds it."""
    return {"type": "function", "function": {"name": NAME, "description": SPEC["description"],
                                             "parameters": SPEC["inputSchema"]}}


class DocError(LookupError):
    """The name cannot be documented: the message says why, in one line."""


def _module_for(parts: list[str]):
    """The longest importable module prefix of ``parts`` and how many parts it took."""
    top = parts[0]
    if top in DENIED:
        raise DocError(f"{top} is not looked up (importing it has side effects)")
    if top not in sys.modules and top not in sys.stdlib_module_names:
        if hasattr(builtins, top):  # str.split, len
            return builtins, 0
        raise DocError(f"{top} is not a standard-library module")
    module, used = None, 0
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in sys.modules:
            module, used = sys.modules[name], i
            break
        if parts[0] in sys.stdlib_module_names:
            try:
                module, used = importlib.import_module(name), i
                break
            except ImportError:
                continue
    if module is None:
        raise DocError(f"no module named {top}")
    return module, used


def _signature(obj) -> str:
    if not callable(obj):
        return ""
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def python_doc(name: str) -> str:
    """The documentation of ``name``; raises ``DocError``."""
    name = (name or "").strip().strip("`").removesuffix("()")
    if not _DOTTED.match(name):
        raise DocError(f"{name!r} is not a dotted Python name such as 'os.path.join'")
    parts = name.split(".")
    obj, used = _module_for(parts)
    for i, attr in enumerate(parts[used:], start=used):
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            raise DocError(f"{'.'.join(parts[:i])} has no attribute {attr}") from None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    doc = inspect.getdoc(obj) or "(no docstring)"
    head = f"{name}{_signature(obj)}"
    text = f"{head}\n\n{doc}"
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rstrip() + f"\n\n[… cut at {MAX_CHARS} characters]"
    return text
