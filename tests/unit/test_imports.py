"""Imports go at the file head (issue 40), read from the source of flows/, tasks/ and blocks/.

An import inside a function is let through only when it is one of (docs/architecture.md,
"Layers", names them):
- a heavy optional ML package (HEAVY), a package slow to import that one path alone needs
  (SLOW), or a project module whose head imports reach one of those, transitively;
- in a module `import flows.cli` loads (the CLI's head), something that head does not load:
  each command imports Prefect and the rest of the project itself, after
  tasks/runtime/prefect_env.apply() has set Prefect's defaults, and `slm-nightly --help` stays
  fast;
- an import with a comment right above or beside it saying why.
Imports under `if TYPE_CHECKING:` are not run and are not looked at. Each rule is checked on a
sample that breaks it (the check must fail there) and on the tree.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache

from tests.support.paths import project_modules

CLI = "flows.cli"
# Heavy optional ML packages: the training and GPU stack, and llama-cpp-python's bindings.
HEAVY = frozenset({"torch", "transformers", "peft", "trl", "bitsandbytes", "datasets",
                   "accelerate", "vllm", "llama_cpp", "safetensors", "gguf"})
# Slow to import, and only one path needs them (measured on top of `import tasks.profile`).
SLOW = frozenset({
    "google.cloud.compute_v1",  # ≈1 s: the GCE node and `slm-nightly gcp` only
    "huggingface_hub",  # ≈0.3 s with httpx2, tqdm, filelock: training only
    "matplotlib",  # ≈0.35 s: the training loss curve only, after matplotlib.use("Agg")
    "neo4j",  # ≈0.1 s (≈0.45 s alone): the Neo4j graph backend only
})

Sources = dict[str, str]  # module name → its source


def tree_sources() -> Sources:
    return {m: path.read_text(encoding="utf-8") for m, path in project_modules().items()}


def _names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """What `node` imports, dotted: `from pkg import name` is pkg.name (a module or not)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [f"{node.module}.{a.name}" for a in node.names]


def _project(name: str, modules: Sources) -> str | None:
    """The project module `name` is, or is inside; None for a third-party or stdlib name."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _head_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: outside functions and TYPE_CHECKING."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _function_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports inside functions (and not under TYPE_CHECKING)."""
    def walk(node: ast.AST, inside: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if inside and isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            yield from walk(child, inside or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))
    return walk(tree, False)


class Imports:
    """The head imports of a set of modules, and what importing one of them loads."""

    def __init__(self, modules: Sources) -> None:
        self.modules = modules
        self.trees = {m: ast.parse(src) for m, src in modules.items()}
        self.head: dict[str, tuple[set[str], set[str]]] = {}  # module → (project, other)
        for m, tree in self.trees.items():
            project: set[str] = set()
            other: set[str] = set()
            parts = m.split(".")
            project.update(".".join(parts[:i]) for i in range(1, len(parts))
                           if ".".join(parts[:i]) in modules)  # its parent packages
            for node in _head_imports(tree):
                for name in _names(node):
                    p = _project(name, modules)
                    if p:
                        project.add(p)
                    else:
                        other.add(name)
            project.discard(m)
            self.head[m] = (project, other)
        self.loads = cache(self._loads)

    def _loads(self, module: str) -> tuple[frozenset[str], frozenset[str]]:
        """(project modules, other dotted names) that `import module` loads, itself included."""
        seen: set[str] = set()
        other: set[str] = set()
        stack = [module]
        while stack:
            m = stack.pop()
            if m in seen:
                continue
            seen.add(m)
            project, names = self.head[m]
            other |= names
            stack.extend(project)
        return frozenset(seen), frozenset(other)


def _lazy_package(name: str) -> bool:
    """Whether `name` (dotted) is a HEAVY or SLOW package or inside one."""
    return name.split(".")[0] in HEAVY or any(name == s or name.startswith(s + ".") for s in SLOW)


def _reached(imports: Imports, name: str) -> str | None:
    """The HEAVY or SLOW package that importing `name` loads (through the project's head
    imports when `name` is a project module), or None."""
    p = _project(name, imports.modules)
    if p is None:
        return name if _lazy_package(name) else None
    return next((o for o in sorted(imports.loads(p)[1]) if _lazy_package(o)), None)


def imports_not_at_the_head(modules: Sources) -> list[str]:
    """`module:line: statement` for each import inside a function that none of the rules in the
    module docstring lets through."""
    imports = Imports(modules)
    cli_modules, cli_other = imports.loads(CLI) if CLI in modules else (frozenset(), frozenset())
    cli_tops = {o.split(".")[0] for o in cli_other}
    wrong = []
    for module, tree in imports.trees.items():
        lines = modules[module].splitlines()
        for node in _function_imports(tree):
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if above.startswith("#") or "#" in lines[node.lineno - 1]:
                continue  # it says why
            reasons = []
            for name in _names(node):
                p = _project(name, modules)
                if _reached(imports, name):
                    reasons.append(True)
                elif module in cli_modules:  # the CLI's head loads only what it loads today
                    reasons.append(p not in cli_modules if p else
                                   name.split(".")[0] not in cli_tops)
                else:
                    reasons.append(False)
            if not all(reasons):
                wrong.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return wrong


SAMPLE: Sources = {
    "tasks": "",
    "tasks.light": "import json\n\nVALUE = 1\n",
    "tasks.trainer": "import torch\n\n\ndef fit() -> None:\n    torch.zeros(1)\n",
    "tasks.via": "from tasks.trainer import fit\n",
    "tasks.user": (
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from tasks.light import VALUE\n\n\n"
        "def ok() -> None:\n"
        "    from tasks.via import fit\n"
        "    import transformers\n"
        "    from google.cloud import compute_v1\n"
        "    # Prefect reads its settings when it loads: after the environment is set.\n"
        "    import prefect\n\n\n"
        "def wrong() -> None:\n"
        "    from tasks.light import VALUE\n"
        "    import polars\n"
        "    import os\n"),
    "flows": "",
    "flows.cli": "import argparse\n\nfrom tasks.light import VALUE\n\n\n"
                 "def run() -> None:\n"
                 "    from tasks.user import ok\n"
                 "    import prefect\n"
                 "    import argparse\n"
                 "    from tasks.light import VALUE\n",
}


def test_the_check_fails_on_imports_that_belong_at_the_head() -> None:
    assert imports_not_at_the_head(SAMPLE) == [
        "tasks.user:16: from tasks.light import VALUE",
        "tasks.user:17: import polars",
        "tasks.user:18: import os",
        "flows.cli:9: import argparse",
        "flows.cli:10: from tasks.light import VALUE",
    ]


def test_a_project_module_is_lazy_only_when_its_head_imports_reach_a_heavy_package() -> None:
    imports = Imports(SAMPLE)
    assert _reached(imports, "tasks.via") == "torch"
    assert _reached(imports, "tasks.light") is None
    assert _reached(imports, "google.cloud.compute_v1") == "google.cloud.compute_v1"
    assert _reached(imports, "google.cloud.storage") is None


def test_imports_inside_functions_have_a_reason() -> None:
    wrong = imports_not_at_the_head(tree_sources())
    assert not wrong, ("imports inside functions that belong at the file head (or name a "
                       "package in HEAVY/SLOW, or say why in a comment):\n" + "\n".join(wrong))


def test_the_cli_head_and_the_flows_load_no_heavy_package() -> None:
    imports = Imports(tree_sources())
    for module in (CLI, "flows.nightly", "tasks.profile"):
        heavy = sorted(o for o in imports.loads(module)[1] if _lazy_package(o))
        assert not heavy, f"import {module} loads {heavy}"
