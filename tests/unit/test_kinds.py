"""No module asks which kind of compute or settings block it holds, except the two factories
(tasks/compute/protocol.py: node_for, nodes_for, gce_block; tasks/graph/open.py: STORES, keyed by
the graph block's type): everything else asks the node (tasks/compute/protocol.py's Node), the
block (FalkorDBGraph.embedded) or the store (GraphStore.missing_keys). Read from every
`isinstance`, `issubclass`, `hasattr`, `getattr` and `is`/`==` comparison in flows/, tasks/
and blocks/ (issue 25)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = frozenset({"LocalCompute", "GceCompute", "FalkorDBGraph", "Neo4jGraph",
                   "NodeServeSettings", "FalkorDBStore", "Neo4jStore"})
FACTORIES = frozenset({"tasks/compute/protocol.py", "tasks/graph/open.py"})
# what a block is read through: `hasattr(block, "nodes")` asks the kind too
HOLDERS = frozenset({"compute", "graph", "block", "node_serve"})
# Switches let through, by expression (none today). An entry no longer found fails the test,
# so the list only shrinks.
KNOWN: frozenset[str] = frozenset()


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, ast.Name | ast.Attribute)}


def _holder(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None
    return name in HOLDERS


def kind_switches(source: str, where: str) -> list[str]:
    """where:line and the expression of each question about a block's kind in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            fn = node.func.id
            if fn in {"isinstance", "issubclass"} and len(node.args) == 2:
                hit = bool(_names(node.args[1]) & KINDS)
            elif fn in {"hasattr", "getattr"}:
                hit = _holder(node.args[0])
        elif isinstance(node, ast.Compare) and all(
                isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops):
            hit = any(isinstance(side, ast.Name) and side.id in KINDS
                      for side in [node.left, *node.comparators])
        if hit:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_factories_ask_a_block_its_kind() -> None:
    found = [hit for top in ("flows", "tasks", "blocks")
             for path in sorted((ROOT / top).rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in FACTORIES
             for hit in kind_switches(path.read_text(encoding="utf-8"),
                                      path.relative_to(ROOT).as_posix())]
    assert sorted({hit.split(": ", 1)[1] for hit in found} & KNOWN) == sorted(KNOWN), \
        "a switch let through is gone: take it out of KNOWN"
    found = [hit for hit in found if hit.split(": ", 1)[1] not in KNOWN]
    assert found == [], ("ask the node (tasks/compute/protocol.py: Node) or the block "
                         "(e.g. FalkorDBGraph.embedded), or add to a factory, instead of:\n"
                         + "\n".join(found))


def test_the_scan_sees_each_form_of_switch() -> None:
    probe = (
        "def f(cfg, block, compute):\n"
        "    a = isinstance(cfg.compute, LocalCompute)\n"
        "    b = isinstance(cfg.graph, (FalkorDBGraph, Neo4jGraph))\n"
        "    c = isinstance(block, blocks.gce.GceCompute | None)\n"
        "    d = getattr(compute, 'nodes', 1)\n"
        "    e = hasattr(cfg.graph, 'host')\n"
        "    g = type(block) is NodeServeSettings\n"
        "    h = getattr(cfg.sources, 'research'), isinstance(cfg, dict), getattr(block_, 'x')\n"
        "    return a, b, c, d, e, g, h\n")
    assert [hit.split(": ", 1)[0] for hit in kind_switches(probe, "probe.py")] == [
        f"probe.py:{n}" for n in range(2, 8)]


def test_the_graph_blocks_say_whether_they_are_embedded() -> None:
    from blocks.graph import FalkorDBGraph, Neo4jGraph

    assert FalkorDBGraph().embedded and not FalkorDBGraph(host="db").embedded
    assert FalkorDBGraph(host="").embedded  # the field's "empty = embedded"
    assert not Neo4jGraph().embedded
    # a property, not a field: saved block documents load as they were written
    assert "embedded" not in FalkorDBGraph.model_fields
    assert FalkorDBGraph.model_validate({"host": None}).embedded


def test_the_eval_starts_an_engine_only_where_the_node_runs_it_here(tmp_path: Path) -> None:
    import pytest

    from tasks.evaluation.runner import engine
    from tasks.profile import load_profile
    from tasks.shared.errors import ConfigError
    from tests.support.profiles import toml_profile

    gce = load_profile(str(toml_profile(tmp_path / "gce.toml", state_dir=tmp_path, compute={
        "type": "gce", "project": "p", "zone": "z", "instance": "n"})))
    with pytest.raises(ConfigError, match="runs on a GCE node, which the eval does not boot — "
                                          "pass --base-url"), engine(gce, None, print):
        pass
    with engine(gce, "http://127.0.0.1:9/v1", print) as given:  # an endpoint: nothing starts
        assert (given.base_url, given.started_here) == ("http://127.0.0.1:9/v1", False)
