"""The docs stay true: the reference is what the code generates, and the README and docs/
name only Makefile targets, CLI subcommands, files and profile keys that exist."""

from __future__ import annotations

import difflib
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REGENERATE = "make docs   (or: .venv/bin/python docs/generate.py)"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated() -> str:
    return str(_generator().render())


def test_the_reference_is_what_the_code_generates(generated: str) -> None:
    current = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    if current != generated:
        diff = "".join(list(difflib.unified_diff(
            current.splitlines(keepends=True), generated.splitlines(keepends=True),
            "docs/reference.md (committed)", "docs/reference.md (generated)"))[:60])
        pytest.fail(f"docs/reference.md is stale — regenerate it: {REGENERATE}\n{diff}")


def test_every_cli_option_is_in_the_reference(generated: str) -> None:
    """Independently of the generator's walk: every option string argparse knows appears."""
    import argparse

    from flows.cli import build_parser

    missing = []

    def walk(prog: str, parser: argparse.ArgumentParser) -> None:
        if f"### `{prog}`" not in generated and prog != "slm-nightly":
            missing.append(prog)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prog} {name}", sub)
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and f"`{flag}`" not in generated:
                    missing.append(f"{prog} {flag}")

    walk("slm-nightly", build_parser())
    assert missing == []


def _keys(table: dict, prefix: str = "") -> set[str]:
    """Dotted keys of a TOML or YAML mapping: `compute.node.model_path`, `peft.r`."""
    out = set()
    for k, v in table.items():
        if isinstance(v, dict):
            out |= _keys(v, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_every_key_of_the_shipped_profiles_and_recipes_is_documented(generated: str) -> None:
    """A key someone writes in a shipped file must have a row in the reference."""
    import yaml

    undocumented = []
    for path in sorted((ROOT / "profiles").glob("*.toml")):
        for key in _keys(tomllib.loads(path.read_text(encoding="utf-8"))):
            leaf = key.split(".")[-1]
            if leaf not in ("type", "block") and f"| `{leaf}` |" not in generated:
                undocumented.append(f"{path.name}: {key}")
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        for key in _keys(yaml.safe_load(path.read_text(encoding="utf-8"))):
            if key != "description" and f"| `{key}` |" not in generated:
                undocumented.append(f"{path.name}: {key}")
    assert undocumented == [], f"not in docs/reference.md — give the field a description and " \
                               f"run {REGENERATE}"


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


def _code(text: str) -> list[str]:
    """The fenced blocks and inline code spans of a markdown text: where commands are."""
    fenced = re.findall(r"```.*?```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def test_the_docs_name_only_make_targets_that_exist() -> None:
    targets = _make_targets()
    wrong = [f"{p.relative_to(ROOT)}: make {t}" for p in DOCS
             for span in _code(p.read_text(encoding="utf-8"))
             for t in re.findall(r"(?:^|\s|;)make ([a-z][\w-]*)", span)
             if t not in targets]
    assert wrong == [], f"Makefile targets: {sorted(targets)}"


def test_the_docs_name_only_subcommands_that_exist() -> None:
    import argparse

    from flows.cli import build_parser

    known: dict[str, set[str]] = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                known[name] = {n for a in sub._actions
                               if isinstance(a, argparse._SubParsersAction) for n in a.choices}
    wrong = []
    for p in DOCS:
        code = "\n".join(_code(p.read_text(encoding="utf-8")))
        # the command, not a path that ends in its name (/opt/slm-nightly install …)
        for cmd, sub in re.findall(r"(?<![\w/.-])slm-nightly ([a-z][\w-]*)(?: ([a-z][\w-]*))?",
                                   code):
            if cmd not in known or (known[cmd] and sub and sub not in known[cmd]):
                wrong.append(f"{p.relative_to(ROOT)}: slm-nightly {cmd} {sub}".rstrip())
    assert wrong == [], f"subcommands: { {k: sorted(v) for k, v in known.items()} }"


def test_relative_links_and_backticked_paths_exist() -> None:
    """A moved or deleted file shows up here: every relative markdown link, and every
    backticked path under a top-level folder of the project, must exist."""
    folders = ("flows/", "tasks/", "blocks/", "tests/", "bench/", "profiles/", "recipes/",
               "docs/", "examples/", "notebooks/")
    missing = []
    for p in DOCS:
        text = p.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in link and not (p.parent / link).exists():
                missing.append(f"{p.relative_to(ROOT)}: link {link}")
        for path in re.findall(r"`((?:" + "|".join(folders) + r")[\w./-]+?)(?:[:`]| )", text):
            placeholder = re.search(r"(^|/)[A-Z_]+(\.\w+)?$", path)  # recipes/NAME.yaml
            if not placeholder and "*" not in path and "<" not in path and \
                    not (ROOT / path).exists():
                missing.append(f"{p.relative_to(ROOT)}: {path}")
    assert missing == []


def test_the_docs_name_only_deployments_that_prefect_yaml_defines() -> None:
    """`prefect deployment run 'nightly/production'` must name a flow and a deployment of it."""
    import yaml

    deployments = set()
    for d in yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]:
        path, func = d["entrypoint"].split(":")
        source = (ROOT / path).read_text(encoding="utf-8")
        flow = re.search(r'@flow\(name="([^"]+)"[^\n]*\)\s*\ndef ' + func + r"\(", source)
        assert flow, f"prefect.yaml: {d['entrypoint']} is not a @flow(name=…) function"
        deployments.add(f"{flow.group(1)}/{d['name']}")
    flows = {d.split("/")[0] for d in deployments}
    wrong = []
    for p in DOCS:
        for span in _code(p.read_text(encoding="utf-8")):
            named = re.findall(r"deployment run '([^']+)'", span)
            if re.fullmatch(r"[a-z-]+/[a-z-]+", span) and span.split("/")[0] in flows:
                named.append(span)  # a table cell such as `train/node`
            wrong += [f"{p.relative_to(ROOT)}: {n}" for n in named if n not in deployments]
    assert wrong == [], f"prefect.yaml defines {sorted(deployments)}"


def test_every_slm_environment_variable_the_code_reads_is_in_the_reference() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", ROOT / "docs" / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    documented = {name for name, _, _ in generate.ENVIRONMENT if name.startswith("SLM_")}
    read = set()
    for folder in ("flows", "tasks", "blocks", "notebooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".ipynb"):
                read |= set(re.findall(r"\bSLM_[A-Z_]+\b", path.read_text(encoding="utf-8")))
    assert read == documented


EXTENDING = ROOT / "docs" / "extending.md"
FILE_TYPES = ("py", "toml", "yaml", "yml", "md", "sh", "java", "json", "jsonl", "ipynb", "jinja")


def _names_a_path(span: str) -> bool:
    """A backticked span that names a file or folder of the project: no spaces, options,
    variables, URLs or issue references; a slash, or a file's extension. Placeholders
    (`recipes/NAME.yaml`, `<state_dir>/runs`) name no one file."""
    if re.search(r"\s|://|#|\[|<|\*", span) or span.startswith(("-", "$", "~", ".")):
        return False
    if re.search(r"(^|/)[A-Z_]+(\.\w+)?$", span):
        return False
    return "/" in span or re.fullmatch(r"[\w.-]+\.(?:" + "|".join(FILE_TYPES) + ")", span) \
        is not None


def test_extending_names_files_that_exist_and_names_that_are_in_them() -> None:
    """docs/extending.md is lists of files to change: every file it names in backticks exists,
    and every name in brackets after a file (`tasks/profile.py` (`_KINDS`, `Profile`)) occurs
    in that file, or in a file under that folder, as a whole word."""
    text = EXTENDING.read_text(encoding="utf-8")
    missing = [span for span in re.findall(r"`([^`\n]+)`", text)
               if _names_a_path(span) and not (ROOT / span).exists()]
    absent, checked = [], 0
    for path, names in re.findall(r"`([^`\n]+)` \(((?:`[^`\n]+`(?:,\s+)?)+)\)", text):
        target = ROOT / path
        if not _names_a_path(path) or not target.exists():
            continue
        files = [target] if target.is_file() else sorted(f for f in target.rglob("*")
                                                           if f.is_file())
        source = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
        for name in re.findall(r"`([^`\n]+)`", names):
            checked += 1
            if not re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", source):
                absent.append(f"{path}: {name}")
    assert missing == [], "docs/extending.md names files that do not exist"
    assert absent == [], "docs/extending.md names what its file does not hold"
    assert checked >= 40, f"only {checked} names checked: has the list format changed?"
