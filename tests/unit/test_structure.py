"""The package's structure: no import cycles between tfdist's modules.

The graph counts every import, at module level and inside functions: a lazy import that closes
a cycle is still a cycle in the design, only one that Python tolerates.
"""

import ast

from helpers.paths import ROOT


def _modules() -> dict:
    found = {}
    for path in (ROOT / "tfdist").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph() -> dict:
    """module -> the tfdist modules it imports (`from pkg import mod` counts as pkg.mod)."""
    modules = _modules()

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.append(full if full in modules else node.module)
            for target in targets:
                target = resolve(target) if target.startswith("tfdist") else ""
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_leaves_import_no_other_tfdist_module():
    graph = import_graph()
    for leaf in ("tfdist.releases", "tfdist.settings", "tfdist.fixes.record"):
        allowed = {"tfdist.releases"} if leaf == "tfdist.fixes.record" else set()
        assert graph[leaf] <= allowed, (leaf, graph[leaf])


def package_graph(graph: dict) -> dict:
    """The same graph with each module folded into its top-level part of tfdist
    (tfdist.strategy.factory -> tfdist.strategy): the rooms a newcomer sees."""

    def room(name):
        return ".".join(name.split(".")[:2])

    folded = {room(name): set() for name in graph}
    for name, targets in graph.items():
        folded[room(name)] |= {room(t) for t in targets if room(t) != room(name)}
    return folded


def test_the_packages_import_each_other_one_way():
    """No two packages (or top-level modules) import each other, even through different
    modules: tfdist.strategy importing tfdist.launcher while the launcher imports the strategy
    would make them one concept in two places."""
    graph = import_graph()
    del graph["tfdist"]  # the package's own __init__ re-exports every part
    for targets in graph.values():
        targets.discard("tfdist")
    assert cycles(package_graph(graph)) == []
