"""Writes docs/reference.md from the code: the `slm-nightly` command line (the argparse
parser of flows/cli/), every profile key (the pydantic models and blocks the profile loader builds)
and the training recipe keys (the recipe model, plus TRL's and PEFT's help for their fields).

    python docs/generate.py            # rewrite docs/reference.md        (make docs)
    python docs/generate.py --check    # exit 1 when docs/reference.md is stale

tests/unit/test_docs.py fails when the file differs from what this script renders, so the
reference cannot drift from the code. Nothing here is hand-written about a key: a missing
description is fixed in the model's `Field(description=…)`, then the file is regenerated.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
COMMAND = "make docs"  # or: .venv/bin/python docs/generate.py

if str(ROOT) not in sys.path:  # run as a script from any directory
    sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------- values and types


def _cell(text: str) -> str:
    """One markdown table cell: no newlines, no bare pipes."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(tp: Any) -> str:
    from pydantic import BaseModel, SecretStr

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        name = " or ".join(_type_name(a) for a in rest)
        return name + (", optional" if len(rest) < len(args) else "")
    if origin in (list, tuple, set):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[1])}" if args else "table"
    if tp is SecretStr:
        return "secret"
    if isinstance(tp, type):
        if issubclass(tp, BaseModel) and _is_block(tp):
            return f"saved block ({tp.__name__})"
        if issubclass(tp, BaseModel):
            return "table"
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "Path": "path", "PosixPath": "path"}.get(tp.__name__, tp.__name__)
    return str(tp).replace("typing.", "")


def _is_block(tp: type) -> bool:
    return any(c.__name__ == "Block" and c.__module__.startswith("prefect.")
               for c in tp.__mro__)


def _value(v: Any) -> str:
    """A default as it is written in TOML/YAML."""
    from pydantic import BaseModel, SecretStr

    if v is None or (isinstance(v, SecretStr) and not v.get_secret_value()):
        return "empty"
    if isinstance(v, SecretStr):
        return "(a secret)"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f'`"{v}"`' if v else '`""`'
    if isinstance(v, list | tuple):
        return "`[" + ", ".join(_value(x).strip("`") for x in v) + "]`" if v else "`[]`"
    if isinstance(v, dict):
        return "`{}`" if not v else "`" + str(v) + "`"
    if isinstance(v, BaseModel):
        return "see below"
    return f"`{v}`"


def _limits(field: Any) -> str:
    words = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "at least",
             "max_length": "at most", "pattern": "matches"}
    out = []
    for m in field.metadata:
        for attr, word in words.items():
            value = getattr(m, attr, None)
            if value is not None:
                unit = " item(s)" if attr in ("min_length", "max_length") else ""
                out.append(f"{word} `{value}`{unit}" if attr == "pattern" else
                           f"{word} {value}{unit}")
    return ", ".join(out)


def _default(field: Any) -> Any:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        return field.default_factory()
    return None if field.default is PydanticUndefined else field.default


def _required(field: Any) -> bool:
    return bool(field.is_required())


def _model_rows(model: type, prefix: str = "") -> Iterator[tuple[str, list[str], type | None]]:
    """(key, row cells, nested table model or None) for each public field of a pydantic model."""
    from pydantic import BaseModel

    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        if name.startswith("_"):
            continue
        tp = field.annotation
        nested = tp if isinstance(tp, type) and issubclass(tp, BaseModel) and \
            not _is_block(tp) else None
        default = "required" if _required(field) else _value(_default(field))
        if nested is not None:
            default = "see the table below"
        kind = _type_name(tp)
        limits = _limits(field)
        desc = field.description or ""
        name = field.alias or name  # the key a profile writes (ExtractionSettings: schema)
        yield (prefix + name, [f"`{prefix}{name}`", kind + (f" ({limits})" if limits else ""),
                               default, desc], nested)


def _table(model: type, prefix: str = "", heading: str = "####") -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[str, type]] = []
    for key, cells, sub in _model_rows(model, prefix):
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        if sub is not None:
            nested.append((key, sub))
    for key, sub in nested:
        doc = (sub.__doc__ or "").strip().splitlines()
        lines += ["", f"{heading} Sub-table `{key}` ({sub.__name__})", ""]
        if doc:
            lines += [_cell(" ".join(doc)), ""]
        lines += _table(sub, "", heading)
    return lines


# ---------------------------------------------------------------- the command line


def _subcommands(parser: argparse.ArgumentParser
                 ) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _synopsis(prog: str, parser: argparse.ArgumentParser) -> str:
    parts = [prog]
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if not a.option_strings:
            name = str(a.metavar or a.dest.upper())
            parts.append(f"[{name}]" if a.nargs == "?" else name)
            continue
        flag = a.option_strings[-1]
        if a.nargs == 0:
            parts.append(f"[{flag}]")
        else:
            metavar = "{" + ",".join(a.choices) + "}" if a.choices else \
                (a.metavar or a.dest.upper())
            parts.append(f"{flag} {metavar}" if a.required else f"[{flag} {metavar}]")
    return " ".join(parts)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest.upper()}`"
        if a.nargs == 0:
            default = "off"
        elif a.default is None or a.default is argparse.SUPPRESS:
            default = "—" if a.option_strings or a.nargs == "?" else "required"
        else:
            default = f"`{a.default}`"
        help_text = a.help or ""
        if a.choices:
            help_text += f" (one of: {', '.join(a.choices)})"
        rows.append(f"| {name} | {_cell(default)} | {_cell(help_text)} |")
    if not rows:
        return []
    return ["| argument | default | what it does |", "|---|---|---|", *rows]


def render_cli() -> list[str]:
    from flows.cli import build_parser

    root = build_parser()
    lines = ["## The command line: `slm-nightly`", "",
             _cell(root.description or ""), ""]
    exit_codes = ("Exit status: 0 when the command (or the run) completed; 1 when it ended "
                  "otherwise; 2 on a configuration error (the message names the fix). "
                  "`run` stopped by a signal exits 128 + the signal number.")
    lines += [exit_codes, ""]

    def walk(prog: str, parser: argparse.ArgumentParser, help_text: str) -> None:
        subs = _subcommands(parser)
        if prog != root.prog:
            lines.extend([f"### `{prog}`", ""])
            if help_text:
                lines.extend([_cell(help_text[0].upper() + help_text[1:]) + ".", ""])
            if not subs or _arguments(parser):  # a command with options of its own too
                lines.extend(["```", _synopsis(prog, parser), "```", ""])
            lines.extend([*_arguments(parser), ""])
        for name, sub_help, sub in subs:
            walk(f"{prog} {name}", sub, sub_help)

    walk(root.prog, root, "")
    return lines


# ---------------------------------------------------------------- the profile


def _profile_module() -> Any:
    """The profile loader (tasks/profile.py; blocks/profile.py before the move)."""
    for name in ("tasks.profile", "blocks.profile"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    raise ModuleNotFoundError("no profile loader: tasks/profile.py or blocks/profile.py")


def _sections(mod: Any) -> list[tuple[str, dict[str, type]]]:
    """(section, {type value: model}) in the loader's order: block sections by their `type`,
    then the settings sections (a single model, no `type`)."""
    from pydantic import BaseModel

    kinds: dict[str, dict[str, type]] = dict(getattr(mod, "SECTIONS", None) or mod._KINDS)
    hints = typing.get_type_hints(mod.Profile, vars(mod))
    out = list(kinds.items())
    for name, tp in hints.items():
        if name in kinds:
            continue
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out.append((name, {"": tp}))
    return out


def render_profile() -> list[str]:
    mod = _profile_module()
    lines = ["## Profile keys (`profiles/*.toml`)", "",
             "A profile is one TOML file: `slm-nightly run --profile NAME` reads "
             "`profiles/NAME.toml` (or a path). Each section builds one block or settings "
             "model below; a section with `block = \"NAME\"` loads that saved Prefect block "
             "instead of the inline keys (secrets then stay in the block). An unknown key or "
             "section, or a value outside its limits, fails before anything starts, naming "
             "the key and the fix. The shipped profiles: `profiles/local.toml` (everything on "
             "this machine) and `profiles/gcp.toml` (the GCE node; see "
             "[operator-gcp.md](operator-gcp.md)).", ""]
    top = getattr(mod, "TOP_LEVEL_KEYS", None)
    if top is not None:
        lines += ["### Top-level keys", "", *_table(top, "", "####"), ""]
    for section, kinds in _sections(mod):
        for kind, model in kinds.items():
            title = f"[{section}]" + (f" type = \"{kind}\"" if len(kinds) > 1 else "")
            lines += [f"### `{title}` — {model.__name__}", ""]
            doc = " ".join((model.__doc__ or "").split())
            if doc:
                lines += [_cell(doc), ""]
            if _is_block(model):
                lines += [f"Saved block type: `{model.get_block_type_slug()}`"  # type: ignore[attr-defined]
                          f" (load one with `block = \"NAME\"`).", ""]
            if len(kinds) > 1 and kind == next(iter(kinds)):
                lines += [f"`type` may be omitted: `\"{kind}\"` is the default.", ""]
            lines += _table(model, "", "####") + [""]
    from tasks.gcp.spec import GcpSpec

    lines += ["### `[gcp]` — GcpSpec", "", "Read only by `slm-nightly gcp …` (setup, check, "
              "teardown), before any block exists: project and zones come from `[compute]` "
              "unless given here.", "", *_table(GcpSpec, "", "####"), ""]
    return lines


# ---------------------------------------------------------------- training recipes


def _library_fields() -> dict[str, dict[str, tuple[Any, str]]]:
    """TRL's and PEFT's own config fields: config class → field → (library default, help)."""
    out: dict[str, dict[str, tuple[Any, str]]] = {}
    try:
        from peft import LoraConfig
        from trl import DPOConfig, SFTConfig
    except ImportError:  # the training extra is not installed: no library help
        return out
    for cls in (LoraConfig, SFTConfig, DPOConfig):
        fields = out.setdefault(cls.__name__, {})
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            fields[f.name] = (default, f.metadata.get("help", ""))
    return out


def _recipe_keys(sections: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """(section, key) → the shipped recipes that set it; section "" is the top level."""
    import yaml

    seen: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key, value in data.items():
            if key in sections and isinstance(value, dict):
                for sub in value:
                    seen.setdefault((key, sub), []).append(path.stem)
            elif key not in sections:
                seen.setdefault(("", key), []).append(path.stem)
    return seen


def render_recipes() -> list[str]:
    mod = importlib.import_module("tasks.training.params")
    model = mod.RECIPE_MODEL
    lines = ["## Training recipe keys (`recipes/*.yaml`)", "",
             _cell(" ".join((mod.__doc__ or "").split())), "",
             "`slm-nightly train --recipe NAME` (or the profile's `[training] recipe`) reads "
             "`recipes/NAME.yaml`; the shipped recipes are `recipes/local.yaml` (SmolLM2-135M on "
             "the CPU) and `recipes/production.yaml` (OLMo 3 7B Think, QLoRA on an L4).", "",
             f"### The project's own keys ({model.__name__})", "",
             _cell(" ".join((model.__doc__ or "").split())), "", *_table(model, "", "####"), ""]
    own = set(model.model_fields)
    libs = _library_fields()
    sections = tuple(getattr(mod, "SECTIONS", ("description", "peft", "sft", "dpo")))
    defaults = {"": dict(getattr(mod, "TRL_DEFAULTS", {})),
                "peft": dict(getattr(mod, "PEFT_DEFAULTS", {})),
                **{m: dict(v) for m, v in getattr(mod, "METHOD_DEFAULTS", {}).items()}}
    used = {k: v for k, v in _recipe_keys(sections).items()
            if k[1] not in own and k != ("", "description")}
    project_defaults = {(sec, key) for sec, d in defaults.items() for key in d}
    rows = sorted(set(used) | project_defaults, key=lambda k: (k[0] != "", k[0], k[1]))
    if rows:
        lines += ["### TRL and PEFT keys", "",
                  "Every other key is a field of TRL's `SFTConfig` / `DPOConfig` (at the top "
                  "level for both methods, or under `sft:` / `dpo:` for one), or of PEFT's "
                  "`LoraConfig` under `peft:`, under its own name. These are the ones the "
                  "shipped recipes set and the ones the project gives a default of its own; "
                  "help text from the installed TRL and PEFT.", "",
                  "| key | config | default | set in | help |", "|---|---|---|---|---|"]
        for sec, key in rows:
            cls = "LoraConfig" if sec == "peft" else "DPOConfig" if sec == "dpo" else "SFTConfig"
            lib_default, help_text = libs.get(cls, {}).get(key, (None, ""))
            if not help_text and cls == "SFTConfig":  # a DPO-only field at the top level
                cls = "DPOConfig"
                lib_default, help_text = libs.get(cls, {}).get(key, (None, ""))
            mine = defaults.get(sec, {}) if key in defaults.get(sec, {}) else \
                defaults[""] if sec in ("sft", "dpo") and key in defaults[""] else {}
            if mine:
                default = f"{_value(mine[key])} (project; library: {_value(lib_default)})"
            else:
                default = _value(lib_default)
            name = f"{sec}.{key}" if sec else key
            lines.append(f"| `{name}` | {cls} | {_cell(default)} | "
                         f"{', '.join(used.get((sec, key), [])) or '—'} | {_cell(help_text)} |")
        lines.append("")
    fixed = {**getattr(mod, "FIXED_TRL", {}),
             **{f"peft.{k}": v for k, v in getattr(mod, "FIXED_PEFT", {}).items()}}
    if fixed:
        lines += ["### Keys a recipe may not set", "",
                  "The code sets these from where the run happens; a recipe that sets one is "
                  "refused.", "", "| key | set to |", "|---|---|"]
        lines += [f"| `{k}` | {_cell(v)} |" for k, v in fixed.items()]
        lines.append("")
    return lines


# ---------------------------------------------------------------- the file


# ---------------------------------------------------------------- environment variables

# Every variable the code reads (tests/unit/test_docs.py checks the SLM_ names against the
# code): name, what it does, who reads it.
ENVIRONMENT = (
    ("SLM_NIGHTLY_PROFILE", "the default of every `slm-nightly … --profile` (a name or a "
     "path); an explicit `--profile` wins. `gcp` on an orchestrator.", "flows/cli/parsing.py"),
    ("SLM_YOYO_WEIGHTS_GCS_BUCKET", "the bucket (`bucket`, `bucket/folder` or "
     "`gs://bucket/folder`, application-default credentials) where a profile names no "
     "`gcs_block`: corpus sync, datasets, adapters, records.", "tasks/shared/gcs_sync.py"),
    ("SLM_BUILD_CACHE", "where the llama.cpp build (the wheel, its libraries and llama-server) "
     "is kept (default `~/.cache/slm-nightly`).", "tasks/engine/llama_build.py"),
    ("SLM_PORT_LOCKS", "the folder of machine-wide port reservations for the servers the "
     "project starts (default `<tmp>/slm-nightly-ports`; one folder for every process that "
     "must not share a port).", "tasks/shared/processes.py"),
    ("SLM_LLAMA_SERVER", "a llama-server binary to run instead of `<venv>/bin/llama-server`.",
     "tasks/engine/llama_cpp.py"),
    ("SLM_LLAMA_CPP_TOOLS", "a folder holding llama.cpp's converters, instead of the "
     "environment's `share/slm-nightly`.", "tasks/engine/llama_cpp.py"),
    ("SLM_LEASE_SECONDS", "the concurrency slots' lease (at least 60 s, the server's minimum).",
     "tasks/shared/slots.py"),
    ("SLM_TEMPORARY_PREFECT_API", "set by the CLI itself: the API URL of the temporary Prefect "
     "server a local run starts (never set it by hand).", "tasks/runtime/prefect_env.py"),
    ("SLM_PROFILE", "the notebook's profile.", "notebooks/debug_document.ipynb"),
    ("SLM_DOCUMENT", "the notebook's document.", "notebooks/debug_document.ipynb"),
    ("SLM_BASE_URL", "the notebook's running endpoint (else it starts the profile's local "
     "server).", "notebooks/debug_document.ipynb"),
    ("PREFECT_API_URL", "the Prefect server (or Cloud workspace) every command, worker and "
     "flow talks to; `prefect config set PREFECT_API_URL=…` on an orchestrator. Without it "
     "`preflight` and `node smoke` stop at once.", "Prefect"),
    ("SLM_GCP_API_ENDPOINTS", "JSON, API name → endpoint URL, for `slm-nightly gcp …`: a "
     "private endpoint (or a local fake in tests) instead of Google's; names: compute, storage, "
     "iam, resourcemanager, serviceusage, secretmanager, cloudquotas.", "tasks/gcp/clients.py"),
    ("GOOGLE_APPLICATION_CREDENTIALS", "application-default credentials outside Google Cloud "
     "(a VM uses its service account without it).", "google-auth"),
)


def render_environment() -> list[str]:
    lines = ["## Environment variables", "", "| variable | what | read by |", "|---|---|---|"]
    lines += [f"| `{name}` | {_cell(what)} | `{who}` |" for name, what, who in ENVIRONMENT]
    return lines + [""]


def render_module_map() -> list[str]:
    """Every module of flows/, tasks/ and blocks/ with what it holds and imports
    (docs/module_map.py)."""
    spec = importlib.util.spec_from_file_location("docs_module_map",
                                                  Path(__file__).with_name("module_map.py"))
    assert spec and spec.loader
    module_map = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_map)
    return ["## Module map", "",
            "Every module of `flows/`, `tasks/` and `blocks/`, the first sentence of its "
            "docstring, and the project packages it imports (all of its imports, those inside "
            "functions included). docs/architecture.md says how they fit together.", "",
            module_map.render(), ""]


def render() -> str:
    lines = ["# Reference", "",
             f"<!-- Generated by docs/generate.py from the code; do not edit by hand. "
             f"Regenerate: {COMMAND} -->", "",
             "Generated from the code: the command line from `flows/cli/`, the profile keys "
             "from the blocks and settings models the profile loader builds, the recipe keys "
             f"from the training parameter model. `{COMMAND}` regenerates it; "
             "`tests/unit/test_docs.py` fails when it is stale.", "",
             "- [The command line](#the-command-line-slm-nightly)",
             "- [Profile keys](#profile-keys-profilestoml)",
             "- [Training recipe keys](#training-recipe-keys-recipesyaml)",
             "- [Environment variables](#environment-variables)",
             "- [Module map](#module-map)", ""]
    lines += render_cli() + render_profile() + render_recipes() + render_environment()
    lines += render_module_map()
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate docs/reference.md from the code.")
    ap.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else ""
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is stale — run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text, encoding="utf-8")
    print(f"wrote {REFERENCE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
