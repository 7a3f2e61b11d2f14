"""`slm-nightly preflight` and `node …`: the GPU node of a GCE profile — check everything a
night needs, smoke-test the node, prepare its image's weights."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flows.cli.parsing import add_json, add_profile, command, command_group
from tasks.shared.errors import ConfigError


def _node_preflight(args: argparse.Namespace) -> int:
    """Everything a night on a GCE profile needs, checked without booting the node."""
    from tasks.preflight.prefect_api import api_url_unset
    from tasks.preflight.run import PreflightReport, run_preflight
    from tasks.profile import load_profile
    from tasks.shared.checks import Check

    unset = api_url_unset(args.profile)  # before a saved block loads: no temporary server
    if unset is not None:
        report = PreflightReport(args.profile, [unset])
    else:
        try:
            cfg = load_profile(args.profile)
        except ConfigError as e:  # a saved block that does not load is a failed check too
            report = PreflightReport(args.profile, [Check("profile", False, str(e),
                                                          "fix the profile or save the block")])
        else:
            report = run_preflight(cfg)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1


def _node(args: argparse.Namespace) -> int:
    if args.node_command == "smoke":
        from flows.smoke import node_smoke
        from tasks.preflight.prefect_api import api_url_unset

        unset = api_url_unset()  # the node's worker and its deployment live there
        if unset is not None:
            raise ConfigError(f"node smoke: {unset.detail} — fix: {unset.fix}")

        result = node_smoke(profile=args.profile, train_timeout_seconds=args.train_timeout)
        print("\n".join(f"{p.phase:12} {p.status:7} {p.seconds or 0:>7} s  {p.detail}"
                        for p in result.phases))
        print(f"verdict: {result.verdict}")
        return 0 if result.verdict == "passed" else 1
    raise ConfigError(f"node: unknown command {args.node_command!r}")


def add_preflight(sub: Any) -> None:
    pf = command(sub, "preflight", _node_preflight,
                 help="check a GCE profile before a night: IAM, the instances, the bucket, blocks and "
                 "secrets, work pools and deployments, the engine and the node's worker, the training "
                 "recipe (prints each check; exit 1 when one fails; boots nothing)")
    add_profile(pf, default="gcp")
    add_json(pf)


def add_node(sub: Any) -> None:
    nsub = command_group(sub, "node", "the GPU node", _node)
    n_smoke = nsub.add_parser("smoke", help="boot the node, wait for its engine, send one "
                              "structured request and one training step, stop the node "
                              "(always); exit 1 unless every phase passed")
    add_profile(n_smoke, default="gcp")
    n_smoke.add_argument("--train-timeout", type=int, default=3600,
                         help="seconds for the training step on the node (default 3600)")
    from tasks.image import cli as weights

    n_weights = command(nsub, "prepare-weights", weights.cli_main,
                        help="build (or with --check only check) the node image's model "
                        "folder: the GGUF, its tokenizer, the training base in the HF cache; "
                        "run when the image is built, never at boot")
    weights.add_arguments(n_weights)
