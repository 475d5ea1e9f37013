"""The package's import graph, read with `ast`: every import runs down the layers
(common -> device -> codegen -> policy -> dispatch -> api -> dask -> tools), and no modules import
each other in a circle, so the layout cannot quietly decay."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "coopmat"

# Lowest first; a module may import its own layer and those below it.
LAYERS = ("common", "device", "codegen", "policy", "dispatch", "api", "dask", "tools")
# The package's own __init__ (the public names) sits with the API; `python -m coopmat.info`,
# `python -m coopmat.bench` and `python -m coopmat.codegen` are entry points beside the tools.
ROOT_MODULES = {"coopmat": "api", "coopmat.info": "tools", "coopmat.bench": "tools",
                "coopmat.codegen.__main__": "tools"}
# `Array @ x` calls matmul and matmul returns Arrays: the one circle allowed, imported late.
ALLOWED_CIRCLES = [{"coopmat.api.array", "coopmat.api.matmul"}]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The coopmat modules `name` imports, anywhere in its body (late imports count)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` imports the module; `from mod import name` the module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def layer(name: str) -> str:
    if name in ROOT_MODULES:
        return ROOT_MODULES[name]
    return name.split(".")[1]


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def test_every_module_is_in_a_layer() -> None:
    assert {layer(m) for m in modules()} <= set(LAYERS)


def test_imports_run_down_the_layers() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if rank[layer(b)] > rank[layer(a)])
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


def strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module (the circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_circles() -> None:
    circles = [c for c in strongly_connected(graph()) if c not in ALLOWED_CIRCLES]
    assert not circles, "modules that import each other: " + "; ".join(
        " <-> ".join(sorted(c)) for c in circles)


def test_the_checks_catch_what_they_look_for() -> None:
    """The circle finder sees a circle of three and ignores a chain."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        {"a", "b", "c"}]
    assert strongly_connected({"a": {"b"}, "b": {"c"}}) == []
