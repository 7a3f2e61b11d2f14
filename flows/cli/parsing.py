"""What every `slm-nightly` command's parser shares: $SLM_NIGHTLY_PROFILE for --profile, the
common options, the descriptions, and the rows the inspecting commands print."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

# The default of every `--profile` that has one (run, graph, train, adapters, status: local;
# preflight, node smoke, node prepare-weights: gcp) when set: `export SLM_NIGHTLY_PROFILE=gcp`
# on the orchestrator. An explicit --profile wins. scorecard's and train preflight's --profile
# have no default (without one they apply the production rules) and it leaves them so.
PROFILE_ENV = "SLM_NIGHTLY_PROFILE"


class _ShippedDefault(str):
    """A --profile default as written in the parser ("local", "gcp"): its own type, so that a
    parsed value that is still this object was not typed on the command line."""


class Parser(argparse.ArgumentParser):
    """argparse, then $SLM_NIGHTLY_PROFILE for a --profile left at its default (the parser
    keeps the shipped default, so the help and docs/reference.md do not depend on the shell)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = super().parse_known_args(args, namespace)
        if isinstance(getattr(ns, "profile", None), _ShippedDefault):
            env = os.environ.get(PROFILE_ENV, "").strip()
            ns.profile_from_env = bool(env)
            ns.profile = env or str(ns.profile)
        return ns, rest


def env_profile_defaults(parser: argparse.ArgumentParser) -> None:
    """Every --profile with a default, in every subcommand: the default becomes a
    _ShippedDefault (which $SLM_NIGHTLY_PROFILE replaces) and the help says so."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                env_profile_defaults(sub)
        elif action.dest == "profile" and isinstance(action.default, str) and \
                not isinstance(action.default, _ShippedDefault):
            action.default = _ShippedDefault(action.default)
            action.help = (f"{action.help or 'profiles/NAME.toml or a path'} (default: "
                           f"${PROFILE_ENV} when set, else {action.default})")


def add_profile(parser: argparse.ArgumentParser, default: str = "local") -> None:
    parser.add_argument("--profile", default=default, help="profiles/NAME.toml or a path")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str) -> Any:
    """A command that `func` runs (`run`, `status`, `train preflight`, …); its parser."""
    parser = sub.add_parser(name, help=help)
    parser.set_defaults(func=func)
    return parser


def command_group(sub: Any, name: str, help: str,
                  func: Callable[[argparse.Namespace], int]) -> Any:
    """A command of subcommands (`graph stats`, `adapters list`, …): `func` runs them all and
    reads which from `<name>_command`."""
    group = sub.add_parser(name, help=help)
    group.set_defaults(func=func)
    return group.add_subparsers(dest=f"{name}_command", required=True)


def print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))


def describe(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's own --help opens with the line its parent lists it with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    sub.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
                describe(sub)
