"""``mcp.json``: the MCP servers the app may start, in the schema LM Studio and Claude Desktop
use, and the app's tool preferences.

Contract
--------
- ``parse_config(text)`` -> ``{name: ServerSpec}``; anything malformed raises ``ConfigError``
  with one line saying where (``mcpServers.fs.args: expected a list of strings``). A server is
  ``{"command": str, "args": [str], "env": {str: str}}`` (stdio) or ``{"url": str, "headers":
  {str: str}}`` (streamable HTTP); ``"disabled": true`` keeps it listed but never started.
- ``load_config(path)`` -> ``(specs, error)``: a missing file is no servers, a malformed one is
  no servers and its one-line error (the app starts anyway and shows it).
- ``import_sources()``: the other apps' files that exist (Claude Desktop on Linux and macOS,
  LM Studio); ``merge_import(text, path)`` adds their servers to ``text`` (names already
  there are kept) and returns the new text and the names added. Those files are only read.
- ``filesystem_server(folders)``: the official filesystem server, given only ``folders``.
- ``ToolPrefs``: the call timeout (default 60 s), the most steps a reply may take (default 8)
  and the tools "always allowed", per server; saved in the chat store's settings.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.tools.builtin import SERVER

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_STEPS = 8
PREFS_KEY = "tools"
FILE_NAME = "mcp.json"
EMPTY_CONFIG = '{\n  "mcpServers": {}\n}\n'
RESERVED = SERVER  # the built-in tools go by this name
_NAME = re.compile(r"^[A-Za-z0-9_.\- ]{1,64}$")


class ConfigError(ValueError):
    """A malformed ``mcp.json``: the message is one line."""


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    disabled: bool = False

    @property
    def kind(self) -> str:
        return "http" if self.url else "stdio"

    def describe(self) -> str:
        if self.url:
            return self.url
        return " ".join([self.command or "", *self.args]).strip()


def _strings(value, where: str, *, kind: str) -> tuple:
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings")
        return tuple(value)
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: expected an object of strings")
    return tuple(value.items())


def parse_server(name: str, obj) -> ServerSpec:
    where = f"mcpServers.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: a server name has 1-64 letters, digits, spaces or _.-")
    if name == RESERVED:
        raise ConfigError(f"{where}: \"{RESERVED}\" is the name of the built-in tools; "
                          "choose another name")
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected an object with \"command\" or \"url\"")
    disabled = obj.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ConfigError(f"{where}.disabled: expected true or false")
    if "url" in obj:
        url = obj["url"]
        if not isinstance(url, str) or not re.match(r"^https?://", url):
            raise ConfigError(f"{where}.url: expected an http:// or https:// address")
        return ServerSpec(name, url=url, disabled=disabled,
                          headers=_strings(obj.get("headers", {}), f"{where}.headers", kind="dict"))
    command = obj.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{where}: needs \"command\" (a program to run) or \"url\"")
    return ServerSpec(name, command=command, disabled=disabled,
                      args=_strings(obj.get("args", []), f"{where}.args", kind="list"),
                      env=_strings(obj.get("env", {}), f"{where}.env", kind="dict"))


def parse_config(text: str) -> dict[str, ServerSpec]:
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
                          ) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object with \"mcpServers\"")
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConfigError("mcpServers: expected an object of servers by name")
    return {name: parse_server(name, obj) for name, obj in servers.items()}


def config_path() -> Path:
    """Where mcp.json lives; the folder is made when it is first saved (a read-only home still
    starts: the file then reads as absent)."""
    from app.paths import config_dir

    return config_dir(create=False) / FILE_NAME


def load_config(path: Path) -> tuple[dict[str, ServerSpec], str | None]:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return {}, None
    except (OSError, UnicodeDecodeError) as exc:
        return {}, f"{path.name} cannot be read: {exc}"
    try:
        return parse_config(text), None
    except ConfigError as exc:
        return {}, f"{path.name} is not valid ({exc}); no MCP server was started."


def save_config(path: Path, text: str) -> dict[str, ServerSpec]:
    """Validate ``text`` and write it atomically; raises ``ConfigError`` (nothing written)."""
    specs = parse_config(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text if text.endswith("\n") else text + "\n", "utf-8")
    tmp.replace(path)
    return specs


def import_sources(home: Path | None = None) -> list[tuple[str, Path]]:
    """(label, path) of the other apps' MCP files that exist on this machine."""
    home = home or Path.home()
    candidates = [
        ("Claude Desktop", home / ".config" / "Claude" / "claude_desktop_config.json"),
        ("Claude Desktop", home / "Library" / "Application Support" / "Claude"
         / "claude_desktop_config.json"),
        ("LM Studio", home / ".lmstudio" / "mcp.json"),
    ]
    return [(label, p) for label, p in candidates if p.is_file()]


def merge_import(text: str, source: Path) -> tuple[str, list[str]]:
    """``text`` (this app's mcp.json) with the servers of ``source`` added; raises
    ``ConfigError`` when either is malformed. ``source`` is only read."""
    mine = json.loads(text) if text.strip() else {}
    parse_config(json.dumps(mine))
    try:
        theirs_text = source.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} cannot be read: {exc}") from None
    try:
        theirs = parse_config(theirs_text)
    except ConfigError as exc:
        raise ConfigError(f"{source.name}: {exc}") from None
    raw = json.loads(theirs_text).get("mcpServers", {})
    servers = mine.setdefault("mcpServers", {})
    added = [name for name in theirs if name not in servers]
    for name in added:
        servers[name] = raw[name]
    return json.dumps(mine, indent=2, ensure_ascii=False) + "\n", added


def filesystem_server(folders: list[str]) -> dict:
    """The official filesystem server, allowed only into ``folders`` (the user's choice)."""
    if not folders:
        raise ConfigError("choose at least one folder for the filesystem server")
    return {"command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem",
                     *[str(Path(f).expanduser().resolve()) for f in folders]]}


@dataclass(frozen=True)
class ToolPrefs:
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_steps: int = DEFAULT_MAX_STEPS
    always_allow: dict = field(default_factory=dict)  # server -> tuple of tool names

    def allows(self, server: str, tool: str) -> bool:
        return tool in self.always_allow.get(server, ())

    def with_allowed(self, server: str, tool: str, on: bool = True) -> ToolPrefs:
        allowed = {k: tuple(v) for k, v in self.always_allow.items()}
        names = set(allowed.get(server, ()))
        names = names | {tool} if on else names - {tool}
        allowed[server] = tuple(sorted(names))
        return replace(self, always_allow={k: v for k, v in allowed.items() if v})

    def to_dict(self) -> dict:
        return {"timeout_s": self.timeout_s, "max_steps": self.max_steps,
                "always_allow": {k: list(v) for k, v in self.always_allow.items()}}

    @classmethod
    def from_dict(cls, data) -> ToolPrefs:
        """Tolerant: bad values fall back to the defaults."""
        if not isinstance(data, dict):
            return cls()
        out = cls()
        t = data.get("timeout_s")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and 1 <= t <= 3600:
            out = replace(out, timeout_s=float(t))
        s = data.get("max_steps")
        if isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 100:
            out = replace(out, max_steps=s)
        allowed = data.get("always_allow")
        if isinstance(allowed, dict):
            out = replace(out, always_allow={
                k: tuple(x for x in v if isinstance(x, str)) for k, v in allowed.items()
                if isinstance(k, str) and isinstance(v, list)})
        return out
