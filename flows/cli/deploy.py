"""`slm-nightly deploy`: `prefect deploy` by name that keeps each schedule's active state
(tasks/deploy.py) — a resumed nightly stays resumed across a redeploy."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli.parsing import command
from tasks.deploy import PRODUCTION, redeploy
from tasks.shared.errors import ConfigError


def _deploy(args: argparse.Namespace) -> int:
    from tasks.preflight.prefect_api import api_url_unset

    unset = api_url_unset()  # without it each side would start a temporary server of its own
    if unset is not None:
        raise ConfigError(f"deploy: {unset.detail} — fix: {unset.fix}")
    names = args.name or PRODUCTION
    report = redeploy(names)
    print(f"deployed {', '.join(names)}")
    for s in report:
        print(s.line())
    for name in names:
        if not any(s.deployment == name for s in report):
            print(f"{name}  no schedule")
    return 0


def add_deploy(sub: Any) -> None:
    dp = command(sub, "deploy", _deploy,
                 help="`prefect --no-prompt deploy` of prefect.yaml's deployments by name, "
                 "keeping each existing schedule active or paused as it was (a plain deploy "
                 "resets them to the yaml's `active: false`); a new deployment or schedule "
                 "takes the yaml's state. Prints each schedule's state")
    dp.add_argument("--name", action="append", metavar="FLOW/DEPLOYMENT",
                    help="a deployment to deploy; repeat for more (default: the production "
                    f"set, {' '.join(PRODUCTION)})")
