"""Node runs left by a dead orchestrator are cancelled at nightly start, before the node's
worker can take them (tasks/compute/stale_runs.py, issue 13 item 7).

Real: the Prefect server (the session's test harness), run_deployment's parent link from the
nightly's flow run, a nightly process killed with SIGKILL (its run stays Running in the API, as
when the orchestrator VM dies), and the worker's own poll (`get_scheduled_flow_runs` on the
pool) to show what a node worker booting now would take. The deployments are created through
the API on a pool of their own (not prefect.yaml's train/node), so no other test's worker or
runs are touched; the nightlies are flows named `stale-test-nightly`, not `nightly`, so the
reaper's tests never count them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate, WorkPoolCreate
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists
from prefect.runtime import flow_run as current_run
from prefect.states import Crashed, Running

from tasks.compute.stale_runs import cancel_stale_node_runs
from tasks.shared.slots import NIGHTLY_LIMIT, ensure_limit
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("prefect_api")

POOL = "stale-test-node"
NIGHTLY = "stale-test-nightly"


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


@pytest.fixture(scope="module")
def deployments(prefect_api: None) -> dict[str, str]:
    """Two `train/…` deployments on a process pool no worker serves (one per test)."""
    with get_client(sync_client=True) as c:
        try:
            c.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        except ObjectAlreadyExists:
            pass
        flow_id = c.create_flow_from_name("train")
        for name in ("stale-a", "stale-b"):
            c.create_deployment(flow_id=flow_id, name=name, work_pool_name=POOL,
                                entrypoint="flows/train.py:train")
    return {"a": "train/stale-a", "b": "train/stale-b"}


@flow(name=NIGHTLY)
def finished_nightly(deployment: str) -> str:
    """A nightly that submitted a node run and ended (Completed) without waiting for it."""
    return str(run_deployment(name=deployment, timeout=0, tags=["slm-node"]).id)


@flow(name="stale-test-train")
def training_subflow(deployment: str) -> str:
    return str(run_deployment(name=deployment, timeout=0, tags=["slm-node"]).id)


@flow(name=NIGHTLY)
def live_nightly(deployment: str) -> tuple[str, list[str], list[dict[str, str]]]:
    """The nightly at its start, as flows/nightly.py calls it (holding the `nightly` slot):
    submits node runs of its own first — one directly, one from a subflow — so the test shows
    its runs are left alone."""
    own = [str(run_deployment(name=deployment, timeout=0, tags=["slm-node"]).id),
           training_subflow(deployment)]
    me = str(current_run.get_id())
    return me, own, cancel_stale_node_runs(deployment, exclude={me}, holding_slot=True)


ZOMBIE = textwrap.dedent("""
    import sys, time
    from prefect import flow
    from prefect.deployments import run_deployment

    @flow(name=sys.argv[2])
    def nightly(deployment: str) -> None:
        from prefect.runtime import flow_run
        child = run_deployment(name=deployment, timeout=0, tags=["slm-node"])
        print(flow_run.get_id(), child.id, flush=True)
        time.sleep(600)

    nightly(sys.argv[1])
""")


@pytest.fixture
def zombie() -> Iterator[Any]:
    """start(deployment) → (nightly run id, node run id): a nightly in its own process that
    submits a node run and is killed with SIGKILL, so its run stays Running in the API."""
    parents: list[str] = []

    def start(deployment: str) -> tuple[str, str]:
        env = {**os.environ, "PREFECT_API_URL": _api_url(), "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-c", ZOMBIE, deployment, NIGHTLY], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
        finally:
            proc.kill()
            proc.wait(timeout=30)
        assert len(line) == 2, "the nightly process did not submit its node run"
        parents.append(line[0])
        return line[0], line[1]

    yield start
    with get_client(sync_client=True) as c:  # leave no Running nightly behind in the session
        for p in parents:
            c.set_flow_run_state(p, Crashed(message="killed by the test"), force=True)


def _state(run_id: str) -> str:
    with get_client(sync_client=True) as c:
        state = c.read_flow_run(run_id).state
    assert state is not None
    return state.name


def _worker_would_take() -> set[str]:
    """What a worker polling the pool now gets (its own request, scheduled up to an hour on)."""
    with get_client(sync_client=True) as c:
        return {str(r.flow_run.id) for r in c.get_scheduled_flow_runs_for_work_pool(
            POOL, scheduled_before=datetime.now(UTC) + timedelta(hours=1))}


def test_runs_of_dead_nightlies_are_cancelled_and_the_live_nightlys_run_is_left(
        deployments: dict[str, str], zombie: Any) -> None:
    dep = deployments["a"]
    done = finished_nightly(dep)
    killed_parent, killed_scheduled = zombie(dep)
    _, killed_running = zombie(dep)
    with get_client(sync_client=True) as c:  # a node worker had taken it when the node died
        c.set_flow_run_state(killed_running, Running(), force=True)
    assert _worker_would_take() >= {done, killed_scheduled}

    me, own, cancelled = live_nightly(dep)

    by_id = {r.id: r for r in cancelled}
    assert set(by_id) == {done, killed_scheduled, killed_running}
    assert {k: by_id[k].was for k in by_id} == {done: "Scheduled", killed_scheduled:
                                                   "Scheduled", killed_running: "Running"}
    assert by_id[done].reason.endswith("is Completed")
    assert f"({killed_parent}) is still Running" in by_id[killed_scheduled].reason
    assert "does not hold the nightly slot" in by_id[killed_scheduled].reason
    assert all(_state(k) == "Cancelled" for k in by_id)
    assert [_state(k) for k in own] == ["Scheduled", "Scheduled"]
    assert _worker_would_take() == set(own)  # the node's worker, booting now, takes tonight's
    assert me not in by_id


def test_without_the_slot_a_running_nightlys_runs_are_left_while_the_slot_is_held(
        deployments: dict[str, str], zombie: Any) -> None:
    dep = deployments["b"]
    _, node_run = zombie(dep)
    ensure_limit(NIGHTLY_LIMIT)
    with get_client(sync_client=True) as c:
        before = c.read_global_concurrency_limit_by_name(NIGHTLY_LIMIT).active_slots
        try:  # someone holds the slot: the Running nightly may be that someone
            c.update_global_concurrency_limit(NIGHTLY_LIMIT,
                                              GlobalConcurrencyLimitUpdate(active_slots=1))
            assert cancel_stale_node_runs(dep) == []
            assert _state(node_run) == "Scheduled"
        finally:
            c.update_global_concurrency_limit(NIGHTLY_LIMIT,
                                              GlobalConcurrencyLimitUpdate(active_slots=before))
    assert before == 0, "another run holds the nightly slot: this test needs it free"
    (cancelled,) = cancel_stale_node_runs(dep)
    assert (cancelled.id, cancelled.was) == (node_run, "Scheduled")
    assert "no run holds the nightly slot" in cancelled.reason
    assert _state(node_run) == "Cancelled"


def test_no_such_deployment_is_nothing_to_cancel(prefect_api: None) -> None:
    assert cancel_stale_node_runs("train/not-deployed-here") == []
