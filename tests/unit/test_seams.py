"""The seams between flows/ and tasks/, read from the source (issue 40):

- control runs flow → task only: no callable made in flows/ is passed into tasks/ — a lambda,
  a def (nested or not, or a flow imported from another flow module), a functools.partial, a
  bound method, an instance of a flows/ class with __call__. The flows call tasks/ and hand
  them data; tasks/ never calls back up.

The rule is checked on a sample that breaks it (the check must fail there) and on the tree.
(Issue 51 retired the limits on parameters and flow-body lines this file also held: numbers
turned into tests shaped code toward the number, not toward clarity.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOGGER_METHODS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})


def _is_flow(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if getattr(target, "id", None) == "flow" or getattr(target, "attr", None) == "flow":
            return True
    return False


def _root(expr: ast.expr) -> str | None:
    """The name an expression starts from: `a` of a.b(c).d[0]."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Attribute | ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call):
            expr = expr.func
        else:
            return None


def _targets(node: ast.AST) -> list[str]:
    """The names an assignment, a `with … as` or a `for` binds."""
    found: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
        found = [node.target]
    elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        found = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        found = [node.optional_vars]
    return [n.id for t in found for n in ast.walk(t) if isinstance(n, ast.Name)]


def _value(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
        return node.value
    if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        return node.iter
    if isinstance(node, ast.withitem):
        return node.context_expr
    return None


def _is_partial(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and (
        getattr(expr.func, "id", None) == "partial" or getattr(expr.func, "attr", None) == "partial")


def callables_into_tasks(source: str, where: str, method_names: frozenset[str]) -> list[str]:
    """`where:line what` for every callable made here and passed to something of tasks/.
    `method_names`: the methods classes define in flows/ and tasks/ (an attribute of that
    name, not called, is a bound method)."""
    tree = ast.parse(source)
    from_tasks: set[str] = set()  # names bound to tasks/ modules, or to what they made
    made: set[str] = set()  # names bound to callables made here
    callable_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(
        isinstance(b, ast.FunctionDef) and b.name == "__call__" for b in n.body)}
    factories = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and any(
        isinstance(r, ast.Return) and r.value is not None and (
            isinstance(r.value, ast.Lambda) or _is_partial(r.value) or (
                isinstance(r.value, ast.Name) and r.value.id in {
                    d.name for d in ast.walk(n) if isinstance(d, ast.FunctionDef) and d is not n}))
        for r in ast.walk(n))}  # functions that return a closure, a lambda or a partial
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            names = {a.asname or a.name for a in node.names}
            if top == "tasks":
                from_tasks |= names
            elif top == "flows":
                made |= names  # a flow (or a helper) of another flow module
        elif isinstance(node, ast.Import):
            from_tasks |= {(a.asname or a.name).split(".")[0] for a in node.names
                           if a.name.split(".")[0] == "tasks"}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            made.add(node.name)
    for _ in range(3):  # what those make, and what that makes (a night → its turns → a turn)
        for node in ast.walk(tree):
            value = _value(node)
            if value is None:
                continue
            if isinstance(value, ast.Lambda) or _is_partial(value) or (
                    isinstance(value, ast.Call) and _root(value.func) in callable_classes):
                made |= set(_targets(node))
            elif _root(value) in from_tasks:
                from_tasks |= set(_targets(node))

    def made_here(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Starred):
            arg = arg.value
        if isinstance(arg, ast.Lambda):
            return "a lambda"
        if _is_partial(arg):
            return "a partial"
        if isinstance(arg, ast.Call) and _root(arg.func) in callable_classes:
            return f"an instance of {_root(arg.func)} (it has __call__)"
        if isinstance(arg, ast.Call) and _root(arg.func) in factories:
            return f"the closure {_root(arg.func)}(…) returns"
        if isinstance(arg, ast.Name) and arg.id in made:
            return f"{arg.id} (made here)"
        if isinstance(arg, ast.Attribute) and (arg.attr in method_names or
                                               arg.attr in LOGGER_METHODS):
            return f"the bound method .{arg.attr}"
        return None

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _root(node.func) in from_tasks:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                why = made_here(arg)
                if why:
                    out.append(f"{where}:{node.lineno} {ast.unparse(node.func)}(…) gets {why}")
    return out


def _method_names() -> frozenset[str]:
    """The names classes of flows/ and tasks/ define methods by and never hold data by (a
    field, a property, `self.name = …`): such an attribute, not called, is a bound method."""
    methods, data = set(), set()
    for top in ("flows", "tasks"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    for b in node.body:
                        if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                            data.add(b.target.id)
                        elif isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef):
                            wrapped = any(getattr(d, "id", getattr(d, "attr", "")) in (
                                "property", "cached_property", "setter") for d in b.decorator_list)
                            (data if wrapped else methods).add(b.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    data.add(node.attr)
    return frozenset(methods - data)


BAD_FLOW = '''
from functools import partial
from tasks.night.stages import NightlyRun, run_all
from tasks.extraction.run import run_batches
from flows.extract import extract


class Hook:
    def __call__(self) -> None: ...


def helper(x): return x


def factory(n):
    def run(): return n
    return run


def nightly(profile):
    night = NightlyRun(profile)
    def inner(): return 1
    run_all(lambda: 1)
    run_all(inner)
    run_all(helper)
    run_batches(partial(helper, 1))
    step = partial(helper, 2)
    night.score(step)
    night.score(extract)
    night.score(Hook())
    hook = Hook()
    night.train(hook)
    night.train(night.summary)
    night.train(night.score)
    run_all(say=print, n=3, urls=[night.urls], log=night.logger.info)
    night.extract(factory(3), helper(4))
'''


def test_each_kind_of_callable_made_in_a_flow_and_passed_into_tasks_is_named() -> None:
    found = callables_into_tasks(BAD_FLOW, "sample.py", frozenset({"score", "train"}))
    assert found == [
        "sample.py:23 run_all(…) gets a lambda",
        "sample.py:24 run_all(…) gets inner (made here)",
        "sample.py:25 run_all(…) gets helper (made here)",
        "sample.py:26 run_batches(…) gets a partial",
        "sample.py:28 night.score(…) gets step (made here)",
        "sample.py:29 night.score(…) gets extract (made here)",
        "sample.py:30 night.score(…) gets an instance of Hook (it has __call__)",
        "sample.py:32 night.train(…) gets hook (made here)",
        "sample.py:34 night.train(…) gets the bound method .score",
        "sample.py:35 run_all(…) gets the bound method .info",
        "sample.py:36 night.extract(…) gets the closure factory(…) returns",
    ]


def test_no_callable_made_in_flows_goes_into_tasks() -> None:
    methods = _method_names()
    found = [hit for path in sorted((ROOT / "flows").rglob("*.py"))
             for hit in callables_into_tasks(path.read_text(encoding="utf-8"),
                                             str(path.relative_to(ROOT)), methods)]
    assert found == []
