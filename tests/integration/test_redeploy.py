"""`slm-nightly deploy` (tasks/deploy.py: redeploy) against a real Prefect server and the real
`prefect deploy` of prefect.yaml, as docs/operator-gcp.md §5 deploys the production set.

The finding first: a plain redeploy replaces a deployment's schedules with prefect.yaml's
(prefect/server/models/deployments.py, update_deployment), so a resumed nightly is paused again
by the next deploy. Then redeploy(): a first deploy takes the yaml's state (paused), a resumed
schedule stays active, a paused one stays paused. Every state asserted is read from the
server's REST API, not from redeploy()'s report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tasks.deploy import DeployError, redeploy
from tests.support.prefect import prefect_cli
from tests.support.prefect import prefect_server as start_server

NIGHTLY, REAPER = "nightly/production", "node-reaper/production"


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    with start_server(tmp_path / "prefect-home") as env:
        prefect_cli(["work-pool", "create", "slm-orchestrator", "--type", "process"], env)
        yield env


def _schedules(api: str, name: str) -> list[dict]:
    r = httpx.get(f"{api}/deployments/name/{name}", timeout=10)
    r.raise_for_status()
    return list(r.json()["schedules"])


def _states(api: str, name: str) -> list[tuple[str, str, bool]]:
    return [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"])
            for s in _schedules(api, name)]


def _resume(api: str, name: str) -> None:
    """What `prefect deployment schedule resume` does: PATCH the schedule active."""
    dep = httpx.get(f"{api}/deployments/name/{name}", timeout=10).json()
    for s in dep["schedules"]:
        httpx.patch(f"{api}/deployments/{dep['id']}/schedules/{s['id']}",
                    json={"active": True}, timeout=10).raise_for_status()
    assert {s["active"] for s in _schedules(api, name)} == {True}


def test_a_redeploy_keeps_each_schedule_active_or_paused(prefect_server: dict) -> None:
    env = prefect_server
    api = env["PREFECT_API_URL"]

    # (c) a first deploy: the yaml's state, paused; reported as new
    report = redeploy([NIGHTLY], env=env)
    assert _states(api, NIGHTLY) == [("0 1 * * *", "UTC", False)]
    assert [s.line() for s in report] == \
        [f"{NIGHTLY}  0 1 * * * (UTC)  new: paused (as prefect.yaml says)"]

    # (a) the finding: resumed, then a plain `prefect deploy` pauses it again
    _resume(api, NIGHTLY)
    prefect_cli(["--no-prompt", "deploy", "--name", NIGHTLY, "--name", REAPER], env)
    assert _states(api, NIGHTLY) == [("0 1 * * *", "UTC", False)]
    assert _states(api, REAPER) == [("30 * * * *", "UTC", False)]

    # (b) resumed again; redeploy() keeps it active and the reaper paused
    _resume(api, NIGHTLY)
    ids = {n: [s["id"] for s in _schedules(api, n)] for n in (NIGHTLY, REAPER)}
    report = redeploy([NIGHTLY, REAPER], env=env)
    assert _states(api, NIGHTLY) == [("0 1 * * *", "UTC", True)]
    assert _states(api, REAPER) == [("30 * * * *", "UTC", False)]
    assert [s.line() for s in report] == [
        f"{NIGHTLY}  0 1 * * * (UTC)  kept active (matched by schedule)",
        f"{REAPER}  30 * * * * (UTC)  kept paused (matched by schedule)"]
    # the deploy did replace them (new rows), so the state was restored, not left alone
    for name, old in ids.items():
        assert {s["id"] for s in _schedules(api, name)}.isdisjoint(old), name

    # a name prefect.yaml does not define: `prefect deploy` skips it and exits 0 (deploying
    # the rest); redeploy() fails with the deploy's output, after restoring what it replaced
    with pytest.raises(DeployError) as failed:
        redeploy([NIGHTLY, "nightly/no-such-deployment"], env=env)
    assert "(exit 0, not deployed: nightly/no-such-deployment)" in str(failed.value)
    assert "no-such-deployment" in str(failed.value).split("\n", 1)[1]  # prefect's own words
    assert f"{NIGHTLY}  0 1 * * * (UTC)  kept active" in str(failed.value)
    assert _states(api, NIGHTLY) == [("0 1 * * *", "UTC", True)]
