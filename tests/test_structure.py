"""Structure of ``engine/`` and ``app/``, every module of them, subpackages included:

- no import cycles between their modules (imports inside functions included);
- no module uses another module's private names (``_name``) through a module reference;
- no function over 60 lines (templates excepted, named below) and no class over 400.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400
# Functions that are text templates, not logic: their length is the document's. Each is
# "<path suffix>:<function>", matched against the end of the file's path, so that moving the
# package that holds it (engine/training -> engine/x/training) keeps the exemption.
TEMPLATES = {"training/readme.py:render"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files()}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` statement in ``module`` imports from."""
    base = node.module or ""
    if node.level:
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return base


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``tree`` imports, wherever the import statement is. A module's own
    ancestor packages are left out: Python imports them before the module in any case."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
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
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; dunders (``__all__``, ``__version__``) are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _PrivateUses(ast.NodeVisitor):
    """Private names of other project modules that one module reaches through a module:
    ``from m import _x``, ``import m as a; a._x``, ``from pkg import m; m._x`` (imports at
    any depth, each scope seeing its own and its enclosing scopes' imports). Attributes of
    objects (``self._x``) are not module references and are not looked at. A private
    *submodule* (``engine._blas``) is a module, not a name, and is let through."""

    def __init__(self, module: str, is_package: bool, known: set[str], rel: str) -> None:
        self.module, self.is_package, self.known, self.rel = module, is_package, known, rel
        self.found: list[str] = []
        self.scopes: list[dict[str, str]] = [{}]

    def _flag(self, node: ast.AST, target: str, name: str) -> None:
        if target != self.module and is_private(name) and f"{target}.{name}" not in self.known:
            self.found.append(f"{self.rel}:{node.lineno} {target}.{name}")

    def _bindings(self, body: list[ast.stmt]) -> dict[str, str]:
        """Names the imports directly in this scope (not in nested functions or classes)
        bind to project modules."""
        env: dict[str, str] = {}
        todo = list(body)
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in self.known:
                        env[a.asname] = a.name
                    elif not a.asname and a.name.split(".")[0] in self.known:
                        env[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, self.module, self.is_package)
                for a in node.names:
                    if f"{base}.{a.name}" in self.known:
                        env[a.asname or a.name] = f"{base}.{a.name}"
            todo.extend(ast.iter_child_nodes(node))
        return env

    def _scope(self, node: ast.AST, body: list[ast.stmt]) -> None:
        env = dict(self.scopes[-1])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    env.pop(a.arg, None)  # a parameter hides a module of that name
        env.update(self._bindings(body))
        self.scopes.append(env)
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Module(self, node: ast.Module) -> None:
        self.scopes = [self._bindings(node.body)]
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scope(node, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scope(node, [])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _from_base(node, self.module, self.is_package)
        if base in self.known:
            for a in node.names:
                self._flag(node, base, a.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain: list[str] = []
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and (target := self.scopes[-1].get(base.id)):
            for attr in reversed(chain):  # engine.hub.download._gb: a module, then a name
                if f"{target}.{attr}" not in self.known:
                    self._flag(node, target, attr)
                    break
                target = f"{target}.{attr}"
            return  # the chain is looked at whole, not again for each of its parts
        self.generic_visit(node)


def private_uses(source: str, module: str, known: set[str], *, is_package: bool = False,
                 rel: str | None = None) -> list[str]:
    """``path:line module._name`` for each private name of another project module (one of
    ``known``) that ``source``, the text of ``module``, uses."""
    visitor = _PrivateUses(module, is_package, known, rel or module.replace(".", "/") + ".py")
    visitor.visit(ast.parse(source))
    return visitor.found


def test_the_private_name_check_sees_every_form():
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.c", "pkg._priv"}

    def uses(src: str, module: str = "pkg.b", **kw) -> list[str]:
        return [u.split(" ", 1)[1] for u in private_uses(src, module, known, **kw)]

    assert uses("from pkg.a import _y, z") == ["pkg.a._y"]
    assert uses("def f():\n    from pkg.a import _y\n    return _y") == ["pkg.a._y"]
    assert uses("from .a import _y") == ["pkg.a._y"]
    assert uses("from ..a import _y", "pkg.sub.c") == ["pkg.a._y"]
    assert uses("from .c import _y", "pkg.sub", is_package=True) == ["pkg.sub.c._y"]
    assert uses("import pkg.a as m\nm._y()") == ["pkg.a._y"]
    assert uses("def f():\n    import pkg.a as m\n    return m._y") == ["pkg.a._y"]
    assert uses("from pkg import a\na._y(1)") == ["pkg.a._y"]
    assert uses("from pkg import sub\nsub.c._y = 1") == ["pkg.sub.c._y"]
    assert uses("import pkg.sub.c\npkg.sub.c._y()") == ["pkg.sub.c._y"]
    assert uses("import pkg\npkg._y") == ["pkg._y"]  # a package's __init__ too
    assert uses("from pkg import _y") == ["pkg._y"]
    # not a module reference, not private, a private module, or the module's own name:
    assert uses("self._x; obj._y; from pkg.a import __all__, y; import pkg.a as m; m.__doc__") == []
    assert uses("from pkg import _priv\nfrom pkg._priv import y\nimport pkg._priv") == []
    assert uses("import pkg.a as m\ndef f(m):\n    return m._y") == []  # m: a parameter
    assert uses("import pkg.b as me\nme._y", "pkg.b") == []


def test_no_private_names_across_modules():
    mods = _modules()
    known = set(mods)
    found = [use for m, p in sorted(mods.items())
             for use in private_uses(p.read_text("utf-8"), m, known,
                                     is_package=p.name == "__init__.py", rel=_rel(p))]
    assert found == [], "private names used from another module:\n" + "\n".join(found)


def _is_template(rel: str, name: str) -> bool:
    return any(name == fn and (rel == suffix or rel.endswith("/" + suffix))
               for suffix, fn in (t.rsplit(":", 1) for t in TEMPLATES))


def test_the_template_exemption_matches_by_path_suffix():
    assert _is_template("engine/training/readme.py", "render")
    assert _is_template("engine/hub/client/training/readme.py", "render")
    assert not _is_template("engine/training/readme.py", "other")
    assert not _is_template("engine/xtraining/readme.py", "render")


def test_no_long_functions():
    long = []
    for path in _files():
        rel = _rel(path)
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not _is_template(rel, node.name):
                    long.append(f"{rel}:{node.lineno} {node.name} ({n})")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_long_classes():
    long = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - start + 1
                if n > MAX_CLASS_LINES:
                    long.append(f"{_rel(path)}:{start} {node.name} ({n})")
    assert long == [], f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(long)
