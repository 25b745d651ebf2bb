"""The package's structure: imports layered without circles, no source text compiled, private names
kept inside their package (read from the AST, so it holds for lazy imports too)."""
from __future__ import annotations

import ast
import pathlib

import mrkit

ROOT = pathlib.Path(mrkit.__file__).parent


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path, path.name == "__init__.py"


def _imports(name, path, is_pkg):
    """(imported module, names) for every mrkit import in the file, lazy ones included."""
    pkg = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("mrkit"):
                yield mod, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mrkit"):
                    yield a.name, []


def _graph():
    mods = {n: (p, pkg) for n, p, pkg in _modules()}
    g = {}
    for name, (path, is_pkg) in mods.items():
        deps = set()
        for mod, names in _imports(name, path, is_pkg):
            for n in names:  # `from .x import y` where y is a submodule
                if f"{mod}.{n}" in mods:
                    deps.add(f"{mod}.{n}")
            if mod in mods:
                deps.add(mod)
        deps.discard(name)
        g[name] = deps
    return g


def _package(mod: str) -> str:
    return mod.rsplit(".", 1)[0] if mod.count(".") >= 1 else mod


def test_no_import_circles():
    g = _graph()
    # packages import their own modules from __init__; the circle check is between modules
    # other than a package's __init__ and its children
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in g.get(n, ()):
            if d.startswith(n + ".") or n.startswith(d + "."):
                continue  # a package and its own submodules
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


LOWER = ["mrkit._errors", "mrkit._sizes", "mrkit._owned", "mrkit.driver", "mrkit._stream", "mrkit._dlpack", "mrkit._resource",
         "mrkit._engine", "mrkit.resources", "mrkit.adaptors", "mrkit._spec", "mrkit._current"]


def test_lower_layers_never_import_higher_ones():
    g = _graph()

    def layer(mod):
        for i, top in enumerate(LOWER):
            if mod == top or mod.startswith(top + "."):
                return i
        return len(LOWER)  # integrations, testing, cli, front doors

    for mod, deps in g.items():
        for d in deps:
            assert layer(d) <= layer(mod), f"{mod} (layer {layer(mod)}) imports {d} (layer {layer(d)})"


def test_private_names_do_not_cross_packages():
    for name, path, is_pkg in _modules():
        for mod, names in _imports(name, path, is_pkg):
            home = name if is_pkg else name.rpartition(".")[0]
            if mod == home or mod.startswith(home + "."):
                continue
            if home.startswith(mod) and mod != "mrkit":
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")
                       and f"{mod}.{n}" not in dict(_graph())]
            assert not private, f"{name} imports private {private} from {mod}"


def test_nothing_compiles_source_text():
    for name, path, _ in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("exec", "eval", "compile"), f"{name}:{node.lineno} calls {node.func.id}"
