"""tasks/deploy.py without a server: the default deployment set against prefect.yaml and the
operator guide, and how a redeployed schedule is matched to the one it replaces. The real
server: tests/integration/test_redeploy.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import yaml

from tasks.deploy import PRODUCTION, _match

ROOT = Path(__file__).resolve().parents[2]


def _yaml_deployments() -> set[str]:
    """flow/deployment for every deployment of prefect.yaml (the flow's @flow(name=…))."""
    found = set()
    for d in yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]:
        path, func = d["entrypoint"].split(":")
        source = (ROOT / path).read_text(encoding="utf-8")
        flow = re.search(r'@flow\(name="([^"]+)"[^\n]*\)\s*\ndef ' + func + r"\(", source)
        assert flow, d["entrypoint"]
        found.add(f"{flow.group(1)}/{d['name']}")
    return found


def test_every_default_name_is_a_deployment_of_prefect_yaml() -> None:
    assert set(PRODUCTION) - _yaml_deployments() == set()
    assert len(set(PRODUCTION)) == len(PRODUCTION)


def test_the_default_is_what_the_operator_guide_deploys() -> None:
    text = (ROOT / "docs" / "operator-gcp.md").read_text(encoding="utf-8")
    cmd = re.search(r"^prefect --no-prompt deploy (.*?)\n(?!  )", text.replace("\\\n", ""),
                    re.M | re.S)
    assert cmd, "docs/operator-gcp.md: no `prefect --no-prompt deploy` command"
    args = shlex.split(cmd.group(1))
    assert args[::2] == ["--name"] * len(args[::2])
    assert args[1::2] == PRODUCTION


def _s(id: str, cron: str, slug: str | None = None, active: bool = False) -> SimpleNamespace:
    return SimpleNamespace(id=id, schedule=("cron", cron, "UTC"), slug=slug, active=active)


def test_a_schedule_is_matched_by_slug_then_by_schedule_then_by_position() -> None:
    old = [_s("o1", "0 1 * * *", "nightly"), _s("o2", "30 * * * *")]
    new = [_s("n1", "0 3 * * *", "nightly"), _s("n2", "30 * * * *")]
    got = {n: (o.id, how) for n, (o, how) in _match(old, new).items()}
    assert got == {"n1": ("o1", "slug"), "n2": ("o2", "schedule")}
    got = {n: (o.id, how) for n, (o, how) in
           _match([_s("o1", "0 1 * * *")], [_s("n1", "0 2 * * *")]).items()}
    assert got == {"n1": ("o1", "position")}  # a cron edited in place


def test_an_added_schedule_is_new() -> None:
    old = [_s("o1", "0 1 * * *")]
    new = [_s("n1", "0 2 * * *"), _s("n2", "0 1 * * *")]
    assert {n: o.id for n, (o, _) in _match(old, new).items()} == {"n2": "o1"}
