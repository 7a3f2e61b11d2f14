"""blocks/ configures: no module in it imports from tasks/ or flows/ (at the top or inside a
function), so a block is fields, validators, secrets and client factories, and the work
lives in tasks/."""

import ast
from pathlib import Path

from tests.support.paths import ROOT


def imported_modules(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_blocks_import_nothing_from_tasks_or_flows() -> None:
    files = sorted((ROOT / "blocks").glob("*.py"))
    assert len(files) >= 6  # the package is where this test thinks it is
    wrong = [f"{f.name}: import {m}" for f in files for m in imported_modules(f)
             if m.split(".")[0] in {"tasks", "flows"}]
    assert wrong == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    f = tmp_path / "b.py"
    f.write_text("def open():\n    from tasks.graph import falkordb_server\n    import flows.cli\n")
    assert imported_modules(f) == ["tasks.graph", "flows.cli"]
