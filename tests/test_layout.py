"""The package's shape stays easy to see: at most 16 entries at the top of ``codechat/`` and no import
circle between its modules (imports inside functions count too: a circle hidden in a lazy import is
still one concept split across two modules)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "codechat"
MAX_TOP_ENTRIES = 16


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: the codechat modules it imports}`` (``from pkg import mod`` counts as ``pkg.mod``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for t in found:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_between_codechat_modules():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_at_most_16_entries_at_the_top_of_the_package():
    entries = sorted(p.name for p in PACKAGE.iterdir()
                     if p.name not in ("__init__.py", "__main__.py") and (p.suffix == ".py" or (p / "__init__.py").exists()))
    assert len(entries) <= MAX_TOP_ENTRIES, entries
