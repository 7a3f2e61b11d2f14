"""The reaper flow against the Prefect test server and the fake Compute Engine: the saved
GceCompute block (with its GcpCredentials) is loaded from the API, as in production."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.states import Cancelled, Running

from blocks.gce import GceCompute
from flows.nightly import nightly
from flows.reaper import reaper
from tests.fakes.compute_engine import FakeComputeEngine
from tests.support.gce import PROJECT, creds
from tests.support.profiles import toml_profile

pytestmark = pytest.mark.usefixtures("prefect_api")


@pytest.fixture
def fake() -> Iterator[FakeComputeEngine]:
    with FakeComputeEngine(PROJECT) as f:
        yield f


def profile(fake: FakeComputeEngine, tmp: Path) -> str:
    GceCompute(project=PROJECT, zone="zone-a", instance="node", fallback_zones=["zone-b"],
               api_endpoint=fake.url, gcp_credentials=creds(fake), poll_seconds=0.1,
               state_dir=str(tmp / "state")).save("reaper-node", overwrite=True)
    path = toml_profile(tmp / "gcp.toml", state_dir=tmp / "state",
                        compute={"type": "gce", "block": "reaper-node"})
    return str(path)


def test_reaper_stops_a_node_left_running(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node", status="RUNNING")  # a fallback-zone node left up
    out = reaper(profile=profile(fake, tmp_path))
    assert out.action == "stopped" and out.stopped_zones == ["zone-b"]
    assert out.found == {"zone-b": "RUNNING"}
    assert len(fake.seen("stop", "zone-b", "node")) == 1
    assert fake.instance("zone-b", "node").status == "TERMINATED"
    again = reaper(profile=profile(fake, tmp_path))
    assert again.action == "none" and len(fake.seen("stop")) == 1


def test_reaper_leaves_the_node_to_an_active_nightly_run(fake: FakeComputeEngine,
                                                         tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node", status="RUNNING")
    fake.add_instance("zone-b", "node")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(nightly, parameters={"profile": "gcp"}, state=Running())
    try:
        out = reaper(profile=profile(fake, tmp_path))
        assert out.action == "skipped" and str(run.id) in [r.id for r in out.active_runs]
        assert fake.seen("stop") == [] and fake.instance("zone-a", "node").status == "RUNNING"
        # a RUNNING run older than max_run_hours is a dead process, not a user of the node
        stale = reaper(profile=profile(fake, tmp_path), max_run_hours=0)
        assert stale.action == "stopped" and str(run.id) in [r.id for r in stale.stale_runs]
        assert fake.instance("zone-a", "node").status == "TERMINATED"
    finally:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelled(), force=True)


def test_gcp_profile_loads_with_its_saved_graph_block() -> None:
    from pydantic import SecretStr

    from blocks.graph import Neo4jGraph
    from tasks.profile import load_profile
    from tests.support.paths import ROOT

    Neo4jGraph(uri="neo4j://graph.internal:7687", password=SecretStr("pw-gcp")).save(
        "slm-neo4j", overwrite=True)
    p = load_profile(str(ROOT / "profiles" / "gcp.toml"))
    assert isinstance(p.compute, GceCompute) and p.compute.zones()[0] == "us-central1-a"
    assert p.compute.state_dir == str(ROOT / ".slm-nightly-gcp") and p.inference.dialect == "llama.cpp"
    assert isinstance(p.graph, Neo4jGraph) and p.graph.uri == "neo4j://graph.internal:7687"
    assert "pw-gcp" not in repr(p.graph)
    # one GCS bucket for everything, training on the node with the production recipe
    assert p.gcs_block == p.training.gcs_block == p.corpus.gcs_block == "slm-gcs"
    assert p.training.recipe == "production" and p.training.node_deployment == "train/node"


def test_reaper_stops_the_node_of_a_dead_run_but_not_of_a_live_one(fake: FakeComputeEngine,
                                                                   tmp_path: Path) -> None:
    """A RUNNING nightly run past its start-up grace without the `nightly` slot is a dead
    process (kill -9): its node is stopped. While the slot is held, nothing is touched."""
    from tasks.shared.slots import NIGHTLY_LIMIT, active_slots, nightly_slot

    fake.add_instance("zone-a", "node", status="RUNNING")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(nightly, parameters={"profile": "gcp"}, state=Running())
    try:
        with nightly_slot(timeout_seconds=30):  # a live nightly run holds the slot
            assert active_slots(NIGHTLY_LIMIT) == 1
            live = reaper(profile=profile(fake, tmp_path), startup_grace_seconds=0)
        assert live.action == "skipped" and live.nightly_slot_held
        assert "slot is held" in live.reason and fake.seen("stop") == []
        assert active_slots(NIGHTLY_LIMIT) == 0
        dead = reaper(profile=profile(fake, tmp_path), startup_grace_seconds=0)
        assert dead.action == "stopped" and dead.stopped_zones == ["zone-a"]
        assert str(run.id) in [r.id for r in dead.orphaned_runs]
        assert fake.instance("zone-a", "node").status == "TERMINATED"
    finally:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelled(), force=True)
