"""Structure of ``engine/`` and ``app/``: no import cycles between their modules (imports
inside functions included) and no function over 60 lines (templates excepted, named below)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app")
MAX_FUNCTION_LINES = 60
# Functions that are text templates, not logic: their length is the document's.
TEMPLATES = {"engine/training/readme.py:render"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files()}


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``tree`` imports, wherever the import statement is. A module's own
    ancestor packages are left out: Python imports them before the module in any case."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # "import app.chat.session" depends on app.chat.session (and its packages'
            # __init__, which are imported first; they are tiny and import nothing of app).
            if name in known:
                out.add(name)
    out.discard(module)
    return {m for m in out if not module.startswith(m + ".")}


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imported(ast.parse(p.read_text("utf-8")), m, p.name == "__init__.py", known)
            for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "app.chat.main_window" in graph["app.main"]  # imported inside main()
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_no_long_functions():
    long = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in TEMPLATES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({n})")
    assert long == []
