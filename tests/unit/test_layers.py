"""The layers, read from every `import` and `from … import` in flows/, tasks/ and blocks/ —
inside functions and under TYPE_CHECKING too, since an import hidden in a function is still a
dependency (issue 25 found three package cycles and one module cycle behind such imports).

From the bottom up:
- blocks/ configures and imports nothing of tasks/ or flows/ (test_blocks_configure.py);
- shared modules: tasks/shared/ (errors, files, paths, waiting, processes, checks, the GCS
  copies, the code and environment digests, the slots), tasks/records and tasks/runtime (but
  its interrupts, composition): they import blocks and each other only, each module a unit of
  its own in the package graph;
- the domains (DOMAINS): they import blocks, shared modules and each other, without a cycle;
- composition (COMPOSITION): what reads a whole Profile and so may import every domain;
- flows/ on top; a flow imports another flow's @flow (a subflow), never its helpers, and the
  CLI (flows/cli/, the package and its modules) may import any flow module.

Fails, naming file:line and the module imported, on a cycle between packages (a domain, or a
module directly in tasks/, counts as one package), a cycle between modules, and any import
that goes up a layer.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache

from tests.support.paths import ROOT, project_modules

DOMAINS = frozenset({"tasks.compute", "tasks.training", "tasks.extraction", "tasks.graph",
                     "tasks.corpus", "tasks.evaluation", "tasks.engine", "tasks.gcp"})
COMPOSITION = frozenset({"tasks.profile", "tasks.preflight", "tasks.image",
                         "tasks.debug_document", "tasks.status", "tasks.night", "tasks.eval_command",
                         "tasks.runtime.interrupts", "tasks.deploy"})
RANKS = {"blocks": 0, "shared": 1, "domain": 2, "composition": 3, "flows": 4}
# Upward imports let through for now (none: issue 25 removed the last). An entry no longer
# imported fails the test, so the list only shrinks.
KNOWN: frozenset[tuple[str, str]] = frozenset()

Edge = tuple[str, str, str]  # importer, imported, "file:line"


MODULES = project_modules()


def _resolve(name: str) -> str | None:
    """The project module `name` is, or is inside (a name imported from it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@cache
def _flows_in(module: str) -> frozenset[str]:
    """The functions of a flow module decorated with @flow (subflows another flow may call)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if getattr(target, "id", None) == "flow" or getattr(target, "attr", None) == "flow":
                    names.add(node.name)
    return frozenset(names)


def _imports() -> list[Edge]:
    edges: list[Edge] = []
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                           for a in node.names]
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            for target in targets:
                resolved = _resolve(target)
                if resolved and resolved != module:
                    edges.append((module, resolved, where))
                    if module.startswith("flows.") and resolved.startswith("flows.") and \
                            isinstance(node, ast.ImportFrom):
                        names = {a.name for a in node.names}
                        edges.append((module, f"{resolved}:{','.join(sorted(names))}", where))
    return edges


EDGES = _imports()


def package_of(module: str) -> str:
    """The unit of the package graph: blocks, flows, a domain, or a module directly in tasks/."""
    if module.startswith(("blocks", "flows")):
        return module.split(".")[0]
    if module.startswith("tasks.shared."):  # each shared helper is a unit of its own
        return ".".join(module.split(".")[:3])
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> str:
    unit = package_of(module)
    if unit in ("blocks", "flows"):
        return unit
    if unit in DOMAINS:
        return "domain"
    return "composition" if unit in COMPOSITION or module in COMPOSITION else "shared"


def _cycles(edges: list[tuple[str, str, str]]) -> list[list[tuple[str, str, str]]]:
    """Each strongly connected set of more than one node, as one cycle through it (edges with
    the file:line of their first import)."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for a, b, where in edges:
        if a != b:
            graph[a].setdefault(b, where)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in sorted(list(graph)):
        if v not in index:
            visit(v)
    cycles = []
    for group in found:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # the shortest way round from `start` back to it, inside the group
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    path = paths[v] + [start]
                    cycles.append([(x, y, graph[x][y]) for x, y in zip(path, path[1:],
                                                                       strict=False)])
                    queue = []
                    break
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return cycles


def _say(cycles: list[list[tuple[str, str, str]]]) -> str:
    return "\n".join(" → ".join([c[0][0], *(b for _, b, _ in c)]) + "\n" +
                     "".join(f"    {where}: {a} imports {b}\n" for a, b, where in c)
                     for c in cycles)


def _module_edges() -> list[Edge]:
    return [e for e in EDGES if ":" not in e[1]]


def test_the_scan_sees_imports_inside_functions_and_under_type_checking() -> None:
    assert len(MODULES) > 100
    seen = {(a, b) for a, b, _ in _module_edges()}
    assert ("tasks.night.clock", "tasks.profile") in seen  # under TYPE_CHECKING
    assert ("flows.cli.node", "tasks.preflight.run") in seen  # inside a function


def test_no_cycle_between_packages() -> None:
    edges = [(package_of(a), package_of(b), w) for a, b, w in _module_edges()
             if package_of(a) != package_of(b)]
    cycles = _cycles(edges)
    assert not cycles, "packages import each other in a cycle:\n" + _say(cycles)


def test_no_cycle_between_modules() -> None:
    cycles = _cycles(_module_edges())
    assert not cycles, "modules import each other in a cycle:\n" + _say(cycles)


def test_no_import_goes_up_a_layer() -> None:
    wrong = []
    for a, b, where in EDGES:
        module, _, names = b.partition(":")
        if names:  # one flow's names from another flow module
            if a == "flows.cli" or a.startswith("flows.cli.") or (a, module) in KNOWN:
                continue
            helpers = set(names.split(",")) - _flows_in(module)
            if helpers:
                wrong.append(f"{where}: {a} imports {', '.join(sorted(helpers))} from {module}, "
                             "another flow's helpers (only its @flow, as a subflow)")
            continue
        if (a, b) in KNOWN:
            continue
        la, lb = layer_of(a), layer_of(b)
        if RANKS[lb] > RANKS[la]:
            wrong.append(f"{where}: {a} ({la}) imports {b} ({lb}), a layer above it")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


def test_only_composition_is_left_directly_in_tasks() -> None:
    loose = sorted(m for m, path in MODULES.items() if m.count(".") == 1 and
                   m.startswith("tasks.") and path.name != "__init__.py")
    assert [m for m in loose if m not in COMPOSITION] == [], (
        "a module directly in tasks/ is composition; move a shared helper to tasks/shared/ "
        "and a piece of a domain into its domain")


def test_the_layers_name_real_modules_and_live_exceptions() -> None:
    for unit in DOMAINS | COMPOSITION:
        assert unit in MODULES, f"{unit} is named in test_layers.py but is not a module"
    imported = {(a, b.partition(":")[0]) for a, b, _ in EDGES}
    for a, b in KNOWN:
        assert (a, b) in imported, f"KNOWN lets {a} import {b}, which it no longer does: drop it"
