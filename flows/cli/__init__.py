"""`slm-nightly`: run the pipeline and look at the graph from a shell."""

from __future__ import annotations

import argparse
import sys

from flows.cli import adapters, deploy, evaluation, gcp, graph, node, run, train
from flows.cli.parsing import PROFILE_ENV, Parser, describe, env_profile_defaults
from tasks.runtime import prefect_env
from tasks.shared.errors import SlmNightlyError


def build_parser() -> argparse.ArgumentParser:
    """The `slm-nightly` command line; docs/generate.py renders docs/reference.md from it."""
    parser = Parser(prog="slm-nightly", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # in this order in `slm-nightly --help` and docs/reference.md
    for add in (run.add_run, graph.add_graph, train.add_scorecard, train.add_train,
                node.add_preflight, node.add_node, deploy.add_deploy, adapters.add_adapters,
                run.add_status, run.add_alerts, evaluation.add_eval, gcp.add_gcp):
        add(sub)
    env_profile_defaults(parser)
    describe(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    prefect_env.apply()  # the CLI is a program: it sets its defaults; importing it sets nothing
    args = build_parser().parse_args(argv)

    if getattr(args, "profile_from_env", False):
        from tasks.profile import PROFILE_DIR, profile_path

        if not profile_path(args.profile).is_file():
            known = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
            print(f"slm-nightly: {PROFILE_ENV}={args.profile!r} names no profile "
                  f"({profile_path(args.profile).resolve()} not found) — set it to one of "
                  f"{known} or a path to a .toml file, unset it, or pass --profile",
                  file=sys.stderr)
            return 2
    try:
        return int(args.func(args))
    except SlmNightlyError as e:
        print(f"slm-nightly: {e}", file=sys.stderr)
        return 2
