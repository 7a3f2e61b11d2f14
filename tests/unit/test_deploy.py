"""tasks/deploy.py without a server: the default deployment set against prefect.yaml and the
operator guide, and how a redeployed schedule is matched to the one it replaces. The real
server: tests/integration/test_redeploy.py."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import yaml

from tasks.deploy import PRODUCTION, _match

ROOT = Path(__file__).resolve().parents[2]


def _yaml_deployments(pools: tuple[str, ...] | None = None) -> set[str]:
    """flow/deployment for every deployment of prefect.yaml (the flow's @flow(name=…)), or for
    those on `pools`."""
    found = set()
    for d in yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]:
        if pools is not None and d["work_pool"]["name"] not in pools:
            continue
        path, func = d["entrypoint"].split(":")
        source = (ROOT / path).read_text(encoding="utf-8")
        flow = re.search(r'@flow\(name="([^"]+)"[^\n]*\)\s*\ndef ' + func + r"\(", source)
        assert flow, d["entrypoint"]
        found.add(f"{flow.group(1)}/{d['name']}")
    return found


def test_the_default_is_every_production_deployment_of_prefect_yaml() -> None:
    # production: the deployments on the orchestrator's and the node's pools
    assert set(PRODUCTION) == _yaml_deployments(("slm-orchestrator", "slm-node"))
    assert len(set(PRODUCTION)) == len(PRODUCTION)
    assert set(PRODUCTION) < _yaml_deployments()


def test_the_operator_guide_names_the_set_it_deploys() -> None:
    text = (ROOT / "docs" / "operator-gcp.md").read_text(encoding="utf-8")
    assert "\nslm-nightly deploy\n" in text
    listed = re.search(r"for\s+the\s+production\s+set\s+\(([^;]+);", text)
    assert listed, "docs/operator-gcp.md: the production set is not listed"
    assert re.findall(r"`([^`]+)`", listed.group(1)) == PRODUCTION


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
