"""`make mutation`'s settings hold together: every test file pyproject.toml's [tool.mutmut]
selects exists, and every module the Makefile's MUTATE patterns score is mutated and imported
by one of them — a module no selected test imports scores 0 % ("no tests"), as
tasks/compute/kv_budget.py did until its test joined the selection."""

from __future__ import annotations

import re
import tomllib

from tests.support.paths import ROOT


def _config() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def test_every_mutated_module_is_imported_by_a_selected_test() -> None:
    cfg = _config()
    selected = cfg["pytest_add_cli_args_test_selection"]
    missing = [t for t in selected if not (ROOT / t).is_file()]
    assert not missing, f"the mutation selection names test files that are not there: {missing}"
    text = "\n".join((ROOT / t).read_text() for t in selected)
    untested = []
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    patterns = " ".join(re.findall(r"^MUTATE\w* :=(.*)$", makefile, re.M))
    scored = sorted({re.sub(r"\.(x_?\w*|\*)$", "", re.sub(r"\.x[_*].*$", "", p))
                     for p in patterns.split() if p.startswith("tasks.")})
    assert "tasks.extraction.capacity" in scored and "tasks.extraction.plan" in scored, scored
    not_mutated = [m for m in scored if f"{m.replace('.', '/')}.py" not in cfg["only_mutate"]]
    assert not not_mutated, f"scored but not in only_mutate: {not_mutated}"
    for module in scored:
        path = f"{module.replace('.', '/')}.py"
        package, _, name = module.rpartition(".")
        if not re.search(rf"from {re.escape(module)} import|import {re.escape(module)}\b|"
                         rf"from {re.escape(package)} import (\(|[^\n]*\b{name}\b)", text):
            untested.append(path)
    assert not untested, (f"mutated, but imported by no test in the selection (0 % in make "
                          f"mutation): {untested} — add their unit tests to "
                          "pytest_add_cli_args_test_selection in pyproject.toml")
