"""N = 2 GCE nodes (GceCompute.nodes) through the fake Compute Engine with the real GceNode
lifecycle: both boot, each serves on its own internal IP, both stop — after a success, after a
second node that cannot start, and through the teardown hook and the reaper."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute.gce.lifecycle import GceNode
from tasks.compute.protocol import nodes_for
from tasks.shared.errors import NodeUnavailable
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import AGENT_KEY, FakeComputeEngine, FakeInstance
from tests.fakes.openai_server import FakeOpenAI
from tests.support.gce import PROJECT, creds
from tests.support.profiles import toml_profile

# Each fake VM's internal IP (tests/fakes/compute_engine.py: one loopback address a VM).
IPS = {"node": "127.0.0.2", "node-2": "127.0.0.3"}


class Engines:
    """The fake Compute Engine's node runtime (its NodeRuntime protocol): on each instance, an
    OpenAI-compatible server (tests/fakes/openai_server.py, standing in for vLLM) on the instance's own
    address and the block's inference port, up while the instance is RUNNING and its metadata
    does not say slm-engine=stopped — as the node's startup script and watcher run vLLM."""

    def __init__(self, port: int, latency: float = 0.0) -> None:
        self.port = port
        self.latency = latency
        self.up: dict[str, FakeOpenAI] = {}
        self.served: dict[str, int] = {}  # instance → requests its engine answered, all boots

    def boot(self, inst: FakeInstance) -> None:
        if inst.metadata.get(AGENT_KEY) != "stopped":
            self._start(inst)

    def power_off(self, inst: FakeInstance) -> None:
        self._stop(inst)

    def metadata_changed(self, inst: FakeInstance) -> None:
        if inst.metadata.get(AGENT_KEY) == "stopped":
            self._stop(inst)
        elif inst.name not in self.up:
            self._start(inst)

    def _start(self, inst: FakeInstance) -> None:
        engine = FakeOpenAI(latency=self.latency, port=self.port, host=inst.network_ip)
        threading.Thread(target=engine.http.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.up[inst.name] = engine

    def _stop(self, inst: FakeInstance) -> None:
        engine = self.up.pop(inst.name, None)
        if engine is not None:
            self.served[inst.name] = self.served.get(inst.name, 0) + engine.calls
            engine.http.server.shutdown()
            engine.http.server.server_close()

    def requests(self, name: str) -> int:
        """Requests the instance's engine answered, over every boot so far."""
        live = self.up.get(name)
        return self.served.get(name, 0) + (live.calls if live else 0)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def engines(port: int) -> Engines:
    return Engines(port)


@pytest.fixture
def fake(engines: Engines) -> Iterator[FakeComputeEngine]:
    with FakeComputeEngine(PROJECT, node_runtime=engines) as f:
        yield f


def block(fake: FakeComputeEngine, tmp: Path, port: int, **kw: object) -> GceCompute:
    fields: dict[str, object] = dict(
        project=PROJECT, zone="zone-a", instance="node", fallback_zones=["zone-b"], nodes=2,
        api_endpoint=fake.url, gcp_credentials=creds(fake), state_dir=str(tmp / "state"),
        poll_seconds=0.1, boot_timeout_seconds=10, stop_timeout_seconds=10,
        retry_base_seconds=0.01, retry_max_seconds=0.05, inference_port=port)
    fields.update(kw)
    return GceCompute(**fields)


def add_nodes(fake: FakeComputeEngine, status: dict[tuple[str, str], str] | None = None) -> None:
    """node and node-2 in zone-a and zone-b, each VM on its own address."""
    for zone in ("zone-a", "zone-b"):
        for name, ip in IPS.items():
            fake.add_instance(zone, name, network_ip=ip, boot_seconds=0.2,
                              status=(status or {}).get((zone, name), "TERMINATED"))


def chat(url: str) -> int:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
        "model": "fake", "messages": [{"role": "user", "content": "Ann Lee met Bob Stone."}]})
    return r.status_code


def test_two_nodes_boot_serve_on_their_own_addresses_and_both_stop(
        fake: FakeComputeEngine, engines: Engines, tmp_path: Path, port: int) -> None:
    add_nodes(fake)
    nodes = nodes_for(block(fake, tmp_path, port))
    assert [type(n) for n in nodes] == [GceNode, GceNode]
    assert [n.block.instance for n in nodes] == ["node", "node-2"]  # type: ignore[attr-defined]
    described = [n.start(max_run_seconds=3600) for n in nodes]
    assert described == [f"GCE test-project/zone-a/{name} (spot, g2-standard-4) at {ip}"
                         for name, ip in IPS.items()]
    endpoint = InferenceEndpoint(model="fake", dialect="vllm", readiness_timeout_seconds=10)
    urls = [n.start_inference(endpoint) for n in nodes]
    assert urls == [f"http://127.0.0.2:{port}", f"http://127.0.0.3:{port}"]
    assert [chat(u) for u in urls] == [200, 200] and chat(urls[1]) == 200
    assert (engines.requests("node"), engines.requests("node-2")) == (1, 2)
    # each node keeps its own record, so a later process stops the right VM of each
    assert (tmp_path / "state" / "gce-node.json").is_file()
    assert (tmp_path / "state" / "gce-node-2.json").is_file()
    assert [n.stop() for n in nodes] == [["zone-a"], ["zone-a"]]
    for name in IPS:
        assert fake.instance("zone-a", name).status == "TERMINATED"
        assert len(fake.seen("stop", "zone-a", name)) == 1
        assert fake.instance("zone-a", name).max_run_seconds == 3600
    assert fake.seen("start", "zone-b") == []  # no fallback was needed
    assert engines.up == {}


def test_a_second_node_stocked_out_everywhere_fails_and_the_first_is_still_stopped(
        fake: FakeComputeEngine, tmp_path: Path, port: int) -> None:
    """There was one L4 in the region tonight: node 1 took it, node 2 finds every zone
    stocked out. Node 2's start fails naming its own instance; stopping both leaves both down
    and node 1 saw its stop."""
    add_nodes(fake)
    first, second = nodes_for(block(fake, tmp_path, port))
    first.start()
    fake.stock_out("zone-a", "SPOT")
    fake.stock_out("zone-b", "SPOT")
    with pytest.raises(NodeUnavailable, match=r"could not start node-2 in any zone \(zone-a "
                       r"spot: stocked out .*zone-b spot: stocked out"):
        second.start()
    assert len(fake.seen("start", "zone-b", "node-2")) == 1
    assert first.stop() == ["zone-a"] and second.stop() == []
    for zone in ("zone-a", "zone-b"):
        for name in IPS:
            assert fake.instance(zone, name).status == "TERMINATED"
    assert len(fake.seen("stop", "zone-a", "node")) == 1


@pytest.mark.usefixtures("prefect_api")
def test_the_teardown_hook_stops_every_node_even_when_one_stop_fails(
        fake: FakeComputeEngine, tmp_path: Path, port: int) -> None:
    """The nightly's cancellation/crash hook (tasks/night/fleet.py): node 1's stop is refused (400), node 2 is
    stopped all the same."""
    from tasks.night.fleet import stop_nodes_hook

    add_nodes(fake, {("zone-a", "node"): "RUNNING", ("zone-b", "node-2"): "RUNNING"})
    block(fake, tmp_path, port).save("nodes-hook", overwrite=True)
    profile = toml_profile(tmp_path / "nodes.toml", state_dir=tmp_path / "state",
                           compute={"type": "gce", "block": "nodes-hook"})
    fake.fail_next("stop", 400, "badRequest")  # the first stop call: node 1's
    stop_nodes_hook(None, SimpleNamespace(parameters={"profile": str(profile)}), None)
    assert fake.instance("zone-a", "node").status == "RUNNING"  # its stop was refused
    assert fake.instance("zone-b", "node-2").status == "TERMINATED"
    assert len(fake.seen("stop", "zone-b", "node-2")) == 1


@pytest.mark.usefixtures("prefect_api")
def test_the_reaper_stops_a_second_node_left_running(
        fake: FakeComputeEngine, tmp_path: Path, port: int) -> None:
    from flows.reaper import reaper

    add_nodes(fake, {("zone-b", "node-2"): "RUNNING"})  # a dead run's node 2, in its fallback
    block(fake, tmp_path, port).save("nodes-reaper", overwrite=True)
    profile = toml_profile(tmp_path / "nodes.toml", state_dir=tmp_path / "state",
                           compute={"type": "gce", "block": "nodes-reaper"})
    out = reaper(profile=str(profile))
    assert out.action == "stopped"
    assert out.found == {"zone-b (node 2)": "RUNNING"}
    assert out.stopped_zones == ["zone-b (node 2)"]
    assert fake.instance("zone-b", "node-2").status == "TERMINATED"
    assert [c["instance"] for c in fake.seen("stop")] == ["node-2"]
    assert reaper(profile=str(profile)).action == "none"


@pytest.mark.usefixtures("prefect_api")
def test_a_two_node_night_spreads_phase_1_over_both_and_stops_both(
        tmp_path: Path, falkordb: int) -> None:
    """The nightly on nodes = 2: both nodes boot and serve, phase 1's requests go to both
    endpoints, and both nodes end TERMINATED, each after one stop."""
    from flows.nightly import nightly
    from tests.support.gce import VLLM_NODE, gce_profile

    port = free_port()
    engines = Engines(port, latency=0.2)  # answers overlap: the client has two to choose from
    profile = gce_profile(tmp_path, "nodes-nightly", falkordb, "nodes_nightly",
                          inference={"max_concurrent_requests": 2})
    for i in range(6):
        (tmp_path / "docs" / "transcripts" / f"t{i}.md").write_text(
            f"Ann Lee met Bob Stone on day {i}.")
    with FakeComputeEngine(PROJECT, node_runtime=engines) as fake:
        add_nodes(fake)
        block(fake, tmp_path, port, node=VLLM_NODE).save("nodes-nightly", overwrite=True)
        s = nightly(profile=str(profile)).to_dict()
        assert s["status"] == "completed", s.get("error")
        assert s["extraction"]["documents"]["transcripts"]["seen"] == 6
        assert "127.0.0.2" in s["node"] and "127.0.0.3" in s["node"]
        served = {name: engines.requests(name) for name in IPS}
        assert all(n > 0 for n in served.values()), served
        assert sum(served.values()) == 6  # one request a document (each is one chunk)
        for name in IPS:
            assert fake.instance("zone-a", name).status == "TERMINATED"
            assert len(fake.seen("stop", "zone-a", name)) == 1
        assert fake.seen("start", "zone-b") == []
