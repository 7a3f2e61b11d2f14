"""`slm-nightly preflight` (tasks/preflight/) and the nightly's preflight phase,
against the fake Compute Engine (driven by the real google-cloud-compute client), the GCS
emulator (prefect-gcp's GcsBucket) and the test Prefect server with prefect.yaml's
deployments deployed by the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blocks.gce import GceCompute
from flows.cli import main
from tasks.compute.gce.startup import WORKER_UNIT
from tasks.night.summary import render_text
from tasks.preflight.prefect_api import DEPLOY_ALL
from tasks.preflight.run import PreflightReport, run_preflight
from tasks.profile import load_profile
from tasks.records import RunSummary
from tasks.shared.checks import PreflightFailed
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.gcs import GcsEmulator
from tests.support.gce import PROJECT, creds
from tests.support.paths import PREFECT, ROOT
from tests.support.profiles import toml_profile

pytestmark = pytest.mark.usefixtures("prefect_api")

BUCKET_BLOCK = "preflight-gcs"
GRAPH: dict[str, int] = {}  # the real FalkorDB the profiles' [graph] names (its port)


@pytest.fixture(scope="module", autouse=True)
def _graph(falkordb: int) -> None:
    GRAPH["port"] = falkordb


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory, prefect_api: None) -> Iterator[GcsEmulator]:
    """The GCS emulator: the profiles' bucket block, and `slm-gcs`, the bucket prefect.yaml
    pushes the node's code to (the node's runs pull it from there)."""
    with GcsEmulator(tmp_path_factory.mktemp("preflight-gcs")) as emulator:
        emulator.bucket().save(BUCKET_BLOCK, overwrite=True)  # at the root, as the guide's
        emulator.bucket().save("slm-gcs", overwrite=True)
        yield emulator


@pytest.fixture(scope="module")
def deployed(gcs: GcsEmulator) -> None:
    """prefect.yaml's train/node (its code pushed to the emulated bucket), nightly/production
    and node-reaper/production, deployed with the CLI from the checkout by name, and their
    pools."""
    env = {**os.environ, "PREFECT_API_URL": _api_url(), "PWD": str(ROOT),
           "PYTHONPATH": str(ROOT), **gcs.adc()}
    for argv in (["work-pool", "create", "slm-node", "--type", "process", "--overwrite"],
                 ["work-pool", "create", "slm-orchestrator", "--type", "process", "--overwrite"],
                 ["--no-prompt", "deploy", "--name", "train/node", "--name",
                  "nightly/production", "--name", "node-reaper/production"]):
        out = subprocess.run([PREFECT, *argv], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.fixture(scope="module")
def world(deployed: None) -> Iterator[FakeComputeEngine]:
    """The fake Compute Engine with the node in two zones (the bucket: `gcs`)."""
    with FakeComputeEngine(PROJECT) as fake:
        fake.add_instance("zone-a", "node")
        fake.add_instance("zone-b", "node")
        yield fake


def profile(tmp: Path, fake: FakeComputeEngine, *, zones: tuple[str, ...] = ("zone-a", "zone-b"),
            training: dict[str, Any] | None = None, gcs: bool = True, dialect: str = "llama.cpp",
            nodes: int = 1, graph: dict[str, Any] | None = None,
            sources: dict[str, Any] | None = None, corpus: Path | None = None,
            compute: dict[str, Any] | None = None, **node: Any) -> Path:
    """A GCE profile that trains (a corpus root), on a saved GceCompute block whose node runs
    its worker from this checkout (where the test deployment changes into); its graph is the
    test FalkorDB, its documents under tmp/docs. `compute`: more GceCompute fields."""
    block = "preflight-" + tmp.name[-20:].replace("_", "-").lower()
    GceCompute(project=PROJECT, zone=zones[0], instance="node", fallback_zones=list(zones[1:]),
               api_endpoint=fake.url, gcp_credentials=creds(fake), poll_seconds=0.1,
               state_dir=str(tmp / "state"), nodes=nodes, **(compute or {}),
               node={"work_pool": "slm-node", "project_dir": str(ROOT),
                     "prefect_api_url": _api_url(), **node}).save(block, overwrite=True)
    (tmp / "docs").mkdir(exist_ok=True)
    return toml_profile(
        tmp / "gce.toml", state_dir=tmp / "state", gcs_block=BUCKET_BLOCK if gcs else None,
        compute={"type": "gce", "block": block},
        inference={"dialect": dialect, "model": "fake", "context_tokens": 2048,
                   "max_output_tokens": 256, "readiness_timeout_seconds": 60},
        graph=graph or {"type": "falkordb", "host": "127.0.0.1", "port": GRAPH["port"],
                        "graph_name": "preflight"},
        sources=sources or {"transcripts": tmp / "docs"},
        corpus={"root": corpus or ROOT / "examples" / "corpus"},
        training={"recipe": "production", **(training or {})})


def statuses(report: PreflightReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def failed(report: PreflightReport) -> dict[str, str]:
    return {c.name: f"{c.detail} — fix: {c.fix}" for c in report.failed}


def test_a_ready_project_passes_every_check(tmp_path: Path, world: FakeComputeEngine) -> None:
    report = run_preflight(load_profile(str(profile(tmp_path, world))))
    assert report.ok, failed(report)
    s = statuses(report)
    for zone in ("zone-a", "zone-b"):
        for what in ("machine type", "GPU", "scheduling"):
            assert s[f"instance {zone}/node: {what}"] == "ok"
    assert s["credentials"] == "ok"
    assert s[f"bucket {BUCKET_BLOCK}: write"] == "ok"
    assert s["deployment train/node"] == s["work pool slm-node"] == "ok"
    assert s["deployment nightly/production"] == s["deployment node-reaper/production"] == "ok"
    assert s["work pool slm-orchestrator"] == "ok"
    # the production recipe's own preflight, for a g2-standard-4, from its shipped config.json
    assert s["training recipe (sft, dpo): verification fits"] == "ok"
    assert s["training recipe (sft, dpo): base model"] == "skipped"  # the weights are on the node
    # the checks of issue 23: the graph, the folders, the quota, the subnet, the node's API URL
    assert s["graph"] == s["sources transcripts"] == s["corpus"] == "ok"
    assert s["GPU quota zone (spot)"] == s["GPU quota (all regions)"] == "ok"
    assert "GPU quota zone (on-demand)" not in s  # spot only, no on-demand fallback
    assert s["instance zone-a/node: network"] == s["instance zone-b/node: network"] == "ok"
    assert s["node Prefect API"] == "ok"
    # the probe object was removed again
    from prefect_gcp import GcsBucket

    assert [b.name for b in GcsBucket.load(BUCKET_BLOCK).list_blobs("preflight")] == []
    # nothing was started or changed on the node
    assert {c["verb"] for c in world.calls} <= {"get", "testIamPermissions"}


def test_missing_instance_pool_and_deployment_are_named_with_their_fix(
        tmp_path: Path, world: FakeComputeEngine, capsys: pytest.CaptureFixture[str]) -> None:
    path = profile(tmp_path, world, zones=("zone-a", "zone-c"), work_pool="absent-pool",
                   training={"node_deployment": "train/absent"})
    code = main(["preflight", "--profile", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["ok"] is False
    bad = {c["name"]: c for c in out["checks"] if c["status"] == "failed"}
    assert set(bad) == {"instance zone-c/node", "deployment train/absent"}
    assert bad["instance zone-c/node"]["detail"] == \
        "projects/test-project/zones/zone-c/instances/node not found"
    assert DEPLOY_ALL in bad["deployment train/absent"]["fix"]
    # the pool: train/node exists, but not on the pool the node's worker serves
    path = profile(tmp_path, world, work_pool="absent-pool")
    report = run_preflight(load_profile(str(path)))
    assert failed(report) == {
        "work pool absent-pool": "not on the Prefect server — fix: `prefect work-pool create "
                                 "absent-pool --type process`",
        "deployment train/node": "on pool slm-node, but the node's worker serves absent-pool "
                                 "— fix: set the node's work_pool to the deployment's pool, "
                                 "or redeploy"}


def test_a_night_that_trains_needs_a_bucket(tmp_path: Path, world: FakeComputeEngine,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLM_YOYO_WEIGHTS_GCS_BUCKET", raising=False)
    report = run_preflight(load_profile(str(profile(tmp_path, world, gcs=False))))
    assert list(failed(report)) == ["bucket"]
    assert "set gcs_block at the top of the profile" in report.failed[0].fix


def test_a_failing_preflight_fails_the_night_before_anything_boots(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    from prefect.client.orchestration import get_client

    from flows.nightly import nightly

    # a train/node run a dead orchestrator left Scheduled: the night cancels it first
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("train/node")
        left = client.create_flow_run_from_deployment(dep.id, parameters={
            "profile": "old", "params": {"dataset": "old.parquet", "method": "sft"}})
    path = profile(tmp_path, world, training={"node_deployment": "train/absent"})
    starts = len(world.seen("start"))
    with pytest.raises(PreflightFailed, match="deployment train/absent: not on the Prefect "
                                              "server"):
        nightly(profile=str(path))
    assert len(world.seen("start")) == starts  # no start call reached Compute
    s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert s["status"] == "failed" and "compute_up" not in s["phases"]
    assert s["phases"]["preflight"]["status"] == "failed"
    assert s["phases"]["compute_down"] == {"status": "skipped", "seconds": 0.0,
                                           "note": "nothing was booted"}
    assert s["error"].startswith("preflight: PreflightFailed: deployment train/absent")
    # the stale-run check ran on the profile's node deployment: none named train/absent
    assert s["stale_node_runs"] is None
    path = profile(tmp_path, world, work_pool="absent-pool")  # train/node, failing preflight
    with pytest.raises(PreflightFailed, match="work pool absent-pool"):
        nightly(profile=str(path))
    s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    stale = {r["id"]: r for r in s["stale_node_runs"]}
    assert stale[str(left.id)]["reason"] == ("no nightly run owns it (submitted by hand, or its "
                                             "nightly run was deleted)")
    assert (f"Node run {left.name} ({stale[str(left.id)]['was']}) cancelled at start: no "
            "nightly run owns it") in render_text(RunSummary.parse(s, "last-run.json"))
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(left.id).state
    assert state is not None and state.is_cancelled()
    assert len(world.seen("start")) == starts


def test_a_missing_permission_and_a_misbuilt_instance_are_named(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    from tests.support.gce import SA

    orchestrator = SA["client_email"]
    with FakeComputeEngine(PROJECT) as fake:
        own = fake.add_instance("zone-a", "node", service_account=orchestrator)
        bad = fake.add_instance("zone-b", "node", service_account=None)
        bad.machine_type, bad.accelerators, bad.on_host_maintenance = \
            "n1-standard-4", [], "MIGRATE"
        fake.add_instance("zone-c", "node")  # no grant at all there
        fake.enforce_iam = True
        fake.grant(orchestrator, "roles/compute.instanceAdmin.v1", own.resource())
        fake.grant(orchestrator, "roles/compute.viewer", bad.resource())  # read-only there
        report = run_preflight(load_profile(str(profile(
            tmp_path, fake, zones=("zone-a", "zone-b", "zone-c")))))
    f = failed(report)
    unread = f.pop("instance zone-c/node")  # the client's message names the request's URL
    assert unread.startswith("cannot read projects/test-project/zones/zone-c/instances/node: "
                             "Forbidden: GET ")
    assert unread.endswith("Required 'compute.instances.get' permission for 'projects/test-"
                           "project/zones/zone-c/instances/node' — fix: grant the "
                           "orchestrator's account roles/compute.instanceAdmin.v1 on the "
                           "instance")
    assert f == {
        "instance zone-a/node: service account":
            f"{orchestrator} is the orchestrator's own account — fix: give the node its own "
            "service account (docs/operator-gcp.md, section 1): the node needs the bucket and "
            "its secrets, not instance admin",
        "instance zone-b/node: machine type":
            "n1-standard-4, not g2-standard-4 — fix: stop it and `gcloud compute instances "
            "set-machine-type node --machine-type=g2-standard-4` (the recipes and memory "
            "checks assume its 16 GB RAM and one L4)",
        "instance zone-b/node: GPU":
            "accelerators none, not one nvidia-l4 — fix: recreate the instance as a "
            "g2-standard-4 (which comes with one L4)",
        "instance zone-b/node: scheduling":
            "onHostMaintenance MIGRATE — fix: `gcloud compute instances set-scheduling node "
            "--maintenance-policy=TERMINATE` (a GPU VM cannot live-migrate)",
        "instance zone-b/node: service account":
            "the instance runs without a service account — fix: `gcloud compute instances "
            "set-service-account` with the node's own account (slm-node@…; it reads the "
            "bucket and its secrets)",
        "instance zone-b/node: IAM":
            "the orchestrator lacks compute.instances.start, compute.instances.stop, "
            "compute.instances.setMetadata, compute.instances.setScheduling, "
            "compute.instances.getGuestAttributes — fix: grant the orchestrator's account "
            "roles/compute.instanceAdmin.v1 on the instance"}
    assert statuses(report)["instance zone-a/node: IAM"] == "ok"


def test_an_engine_that_cannot_load_the_model_and_the_node_worker(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    path = profile(tmp_path, world, dialect="vllm", engine="vllm", project_dir="/opt/elsewhere")
    report = run_preflight(load_profile(str(path)))
    f = failed(report)
    assert set(f) == {"engine"}  # the node's deployment runs the code it pulls, wherever
    # vLLM's GGUF loader has no olmo2 (vllm-project/vllm#30691); llama.cpp's list has it
    assert f["engine"].startswith("engine vllm cannot load /opt/models/Olmo-3-32B-Think-Q3_K_M"
                                  ".gguf: its GGUF loader (transformers ")
    assert "has no architecture 'olmo2'" in f["engine"]
    assert f["engine"].endswith('— fix: set [compute.node] engine = "llama.cpp" (it loads olmo2)')
    worker = next(c for c in report.checks if c.name == "node worker")
    assert worker.ok and worker.detail == (
        "/opt/elsewhere/.venv/bin/prefect worker start --pool slm-node --type process with "
        f"PREFECT_API_URL {_api_url()}")
    # a node without a Prefect API URL starts no worker: its training runs would wait
    report = run_preflight(load_profile(str(profile(tmp_path, world, prefect_api_url=None))))
    assert list(failed(report)) == ["node worker"]


# --- slm-nightly node smoke, on the fake node of tests/integration/test_node_path.py ---------------
def _smoke(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:
    code = main(["node", "smoke", "--profile", str(path)])
    out = capsys.readouterr().out
    # the table the CLI prints after the run: "phase  status  seconds s  detail"
    phases = dict(re.findall(
        r"^(boot|engine|request|engine down|train|environment|stop) +(ok|failed) ", out, re.M))
    return code, phases | {"verdict": out.strip().rsplit("verdict: ", 1)[-1], "_out": out}


def test_node_smoke_boots_asks_trains_one_step_and_stops_the_node(
        tmp_path: Path, world: FakeComputeEngine, gcs: GcsEmulator, base_cache: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from tasks.training.registry import ArtifactStore
    from tests.support.worker_node import WorkerNode

    node = WorkerNode(tmp_path)
    node.runtime.env.update(gcs.adc())  # the node pulls train/node's code from the bucket
    with node.fake:  # after `world`'s GCS emulator: the node's worker inherits it
        path = node.profile(tmp_path, "smoke-ok", {**base_cache, "falkordb": 1}, 50,
                            gcs_block=BUCKET_BLOCK)
        held: list[int] = []
        done = threading.Event()

        def watch_the_slot() -> None:  # what the reaper asks before it stops a node
            from tasks.shared.slots import NIGHTLY_LIMIT, active_slots

            while not done.wait(0.5):
                held.append(active_slots(NIGHTLY_LIMIT))

        watcher = threading.Thread(target=watch_the_slot, daemon=True)
        watcher.start()
        code, phases = _smoke(path, capsys)
        done.set()
        watcher.join(5)
        assert code == 0, phases["_out"] + node.log.read_text()[-3000:]
        assert {k: v for k, v in phases.items() if k != "_out"} == {
            "boot": "ok", "engine": "ok", "request": "ok", "engine down": "ok", "train": "ok",
            "environment": "ok", "stop": "ok", "verdict": "passed"}
        # the smoke held the `nightly` slot while its node was up: the reaper left it alone
        assert held and max(held) == 1, held
        from tasks.shared.slots import NIGHTLY_LIMIT, active_slots

        assert active_slots(NIGHTLY_LIMIT) == 0
        assert "fits this checkout's pyproject.toml" in phases["_out"]
        assert "step 1/1" in phases["_out"]  # one step, though the recipe says 50
        inst = node.fake.instance("zone-a", "node")
        assert inst.status == "TERMINATED" and inst.metadata["slm-engine"] == "stopped"
        # boot 600 + readiness 60 + the training step's 3600 + stop 300 + margin 1800
        assert inst.max_run_seconds == 6360
        # the node's worker (started by its rendered startup script) ended with it
        assert not node.runtime.unit_running("zone-a", "node", WORKER_UNIT)
    # the node trained on the rows pushed to the bucket; the adapter is kept, never promoted
    store = ArtifactStore(tmp_path / "state" / "artifacts", BUCKET_BLOCK)
    (m,) = store.list("smoke")
    assert m.state == "done" and m.created_by == "smoke" and not m.promoted
    assert m.step == m.steps == 1 and "node-datasets/datasets/smoke/smoke-" in (m.dataset or "")


def test_node_smoke_stops_the_node_when_a_step_fails(
        tmp_path: Path, world: FakeComputeEngine, gcs: GcsEmulator, base_cache: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.worker_node import WorkerNode

    node = WorkerNode(tmp_path)
    node.runtime.env.update(gcs.adc())
    with node.fake:
        path = node.profile(tmp_path, "smoke-fail", {**base_cache, "falkordb": 1}, 1,
                            gcs_block=BUCKET_BLOCK)
        # the engine serves `fake`; the profile asks for another model
        path.write_text(path.read_text().replace('model = "fake"', 'model = "absent"'))
        code, phases = _smoke(path, capsys)
        assert code == 1
        assert (phases["boot"], phases["engine"], phases["stop"], phases["verdict"]) == \
            ("ok", "failed", "ok", "failed")
        assert "request" not in phases and "train" not in phases
        assert "serves ['fake'], not 'absent'" in phases["_out"]
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
        assert len(node.fake.seen("stop", "zone-a", "node")) == 1
        assert not node.runtime.unit_running("zone-a", "node", WORKER_UNIT)


def test_a_saved_block_that_does_not_load_is_a_failed_check(
        tmp_path: Path, world: FakeComputeEngine, capsys: pytest.CaptureFixture[str]) -> None:
    path = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                        compute={"type": "gce", "block": "no-such-block"})
    assert main(["preflight", "--profile", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("preflight of profile " + str(path) + ": 1 of 1 checks failed\n"
                          "FAILED  profile: profile " + str(path) + ": [compute] saved block "
                          "'slm-gce-compute/no-such-block' could not be loaded")
    assert out.rstrip().endswith("— fix: fix the profile or save the block")


def test_every_node_of_a_two_node_profile_is_checked_in_every_zone(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    """nodes = 2: node 2 is the instance node-2 of each zone; missing, or misbuilt, it fails
    the preflight (the night would boot one node fewer, or a wrong one)."""
    path = str(profile(tmp_path, world, nodes=2))
    missing = failed(run_preflight(load_profile(path)))
    assert missing == {f"instance {z}/node-2": f"projects/test-project/zones/{z}/instances/"
                       "node-2 not found — fix: create it: `slm-nightly gcp nodes` "
                       "(docs/operator-gcp.md, section 6) or "
                       "fix project/zone/instance/zone_instances in the profile (nodes = 2: "
                       "node i ≥ 2 is the instance node-i, built like the first)"
                       for z in ("zone-a", "zone-b")}
    world.add_instance("zone-a", "node-2")
    world.add_instance("zone-b", "node-2").machine_type = "n1-standard-4"
    report = run_preflight(load_profile(path))
    assert list(failed(report)) == ["instance zone-b/node-2: machine type"]
    s = statuses(report)
    assert s["instance zone-a/node-2: GPU"] == s["instance zone-a/node-2: IAM"] == "ok"
    assert s["instance zone-a/node: GPU"] == "ok"


# --- issue 23: what failed only later, now checked before the night ---------------------------------
def test_the_node_api_url_is_no_placeholder_no_loopback_and_answers(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    import tomllib

    from tasks.preflight.node import PLACEHOLDER_MARKER

    shipped = tomllib.loads((ROOT / "profiles" / "gcp.toml").read_text())
    url = shipped["compute"]["node"]["prefect_api_url"]
    assert PLACEHOLDER_MARKER in url  # the shipped profile fails until the operator sets it
    fix = ("set [compute.node] prefect_api_url to the Prefect API as the node reaches it over "
           "the VPC: http://<orchestrator VPC IP>:4200/api (`hostname -I` on the orchestrator), "
           "or the Prefect Cloud workspace URL")
    report = run_preflight(load_profile(str(profile(tmp_path, world, prefect_api_url=url))))
    assert failed(report) == {"node Prefect API": f"prefect_api_url {url} is the shipped "
                              f"placeholder — fix: {fix}"}
    # nothing answers there: GET <url>/health from the orchestrator fails
    dead = f"http://127.0.0.1:{free_port()}/api"
    report = run_preflight(load_profile(str(profile(tmp_path, world, prefect_api_url=dead))))
    (bad,) = report.failed
    assert bad.name == "node Prefect API"
    assert bad.detail.startswith(f"GET {dead}/health from the orchestrator failed: ConnectError")
    assert bad.fix == ("serve the Prefect API on the orchestrator's VPC address (`prefect server "
                       "start --host 0.0.0.0`) and let the node's subnet reach port 4200 (a "
                       "firewall rule), or fix [compute.node] prefect_api_url")
    # a node with a VPC address of its own cannot reach the orchestrator's loopback (the fake's
    # nodes are on this machine's loopback: there it is allowed, as the ready world shows)
    with FakeComputeEngine(PROJECT) as fake:
        for zone in ("zone-a", "zone-b"):
            fake.add_instance(zone, "node").network_ip = "10.128.0.7"
        report = run_preflight(load_profile(str(profile(tmp_path, fake))))
    assert failed(report) == {"node Prefect API": f"prefect_api_url {_api_url()} is a loopback "
                              "address: on the node it is the node itself, not the "
                              f"orchestrator — fix: {fix}"}


def test_the_graph_is_opened_and_read_and_a_wrong_one_is_named(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    port = GRAPH["port"]
    report = run_preflight(load_profile(str(profile(tmp_path, world))))
    graph = next(c for c in report.checks if c.name == "graph")
    assert graph.ok and graph.detail == f"FalkorDB at 127.0.0.1:{port} answers a read"
    wrong = free_port()
    report = run_preflight(load_profile(str(profile(tmp_path, world, graph={
        "type": "falkordb", "host": "127.0.0.1", "port": wrong, "graph_name": "preflight"}))))
    (bad,) = report.failed
    assert bad.name == "graph"
    assert bad.detail.startswith(f"cannot open FalkorDB at 127.0.0.1:{wrong}: ConnectionError: ")
    assert bad.fix == ("start the server, or fix the graph block's host, port and password "
                       "(empty host: the embedded server)")
    # Neo4j: the URI and the user are named, never the password
    uri = f"bolt://127.0.0.1:{free_port()}"
    report = run_preflight(load_profile(str(profile(tmp_path, world, graph={
        "type": "neo4j", "uri": uri, "password": "s3cret-pw"}))))
    (bad,) = report.failed
    assert bad.name == "graph"
    assert bad.detail.startswith(f"cannot open Neo4j at {uri} as 'neo4j': ServiceUnavailable")
    assert bad.fix == ("fix the graph block's uri, user and password (docs/operator-gcp.md, "
                       "sections 0 and 4)")
    assert "s3cret-pw" not in json.dumps(report.to_dict())
    # an embedded FalkorDB is phase 1's to start
    report = run_preflight(load_profile(str(profile(tmp_path, world, graph={
        "type": "falkordb", "data_dir": tmp_path / "graph"}))))
    assert report.ok and statuses(report)["graph"] == "skipped"


def test_missing_source_folders_and_corpus_root_are_named(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    absent, corpus = tmp_path / "absent", tmp_path / "no-corpus"
    report = run_preflight(load_profile(str(profile(
        tmp_path, world, sources={"transcripts": tmp_path / "docs", "research": absent},
        corpus=corpus))))
    assert failed(report) == {
        "sources research": f"{absent} is not a directory on the orchestrator — fix: create it "
                            f"(`mkdir -p {absent}`), or fix [sources] research in the profile",
        "corpus": f"{corpus} is not a directory on the orchestrator — fix: create it "
                  f"(`mkdir -p {corpus}`), or fix [corpus] root in the profile"}
    assert statuses(report)["sources transcripts"] == "ok"


def test_the_gpu_quota_of_each_provisioning_model_and_all_regions(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    with FakeComputeEngine(PROJECT) as fake:
        fake.add_instance("zone-a", "node")
        fake.add_instance("zone-b", "node")
        # spot with no preemptible quota uses the standard L4 quota: one L4, and it is in use
        fake.set_quota("PREEMPTIBLE_NVIDIA_L4_GPUS", 0, region="zone")
        fake.set_quota("NVIDIA_L4_GPUS", 1, usage=1, region="zone")
        fake.set_quota("GPUS_ALL_REGIONS", 0)
        report = run_preflight(load_profile(str(profile(tmp_path, fake))))
        assert failed(report) == {
            "GPU quota zone (spot)":
                "NVIDIA_L4_GPUS 0 free of 1 (PREEMPTIBLE_NVIDIA_L4_GPUS is 0: spot VMs use "
                "NVIDIA_L4_GPUS), 1 needed — fix: `gcloud quotas preferences create "
                "--service=compute.googleapis.com --project=test-project "
                "--quota-id=PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region --preferred-value=1 "
                "--dimensions=region=zone` (or IAM & Admin → Quotas in the console)",
            "GPU quota (all regions)":
                "GPUS_ALL_REGIONS 0 free of 0, 1 needed — fix: `gcloud quotas preferences "
                "create --service=compute.googleapis.com --project=test-project "
                "--quota-id=GPUS-ALL-REGIONS-per-project --preferred-value=1` (or IAM & Admin "
                "→ Quotas in the console)"}
        # two nodes, spot quota for them, and the on-demand fallback without any
        for zone in ("zone-a", "zone-b"):
            fake.add_instance(zone, "node-2")
        fake.set_quota("PREEMPTIBLE_NVIDIA_L4_GPUS", 2, region="zone")
        fake.set_quota("NVIDIA_L4_GPUS", 0, region="zone")
        fake.set_quota("GPUS_ALL_REGIONS", 4, usage=1)
        report = run_preflight(load_profile(str(profile(
            tmp_path, fake, nodes=2, compute={"on_demand_fallback": True}))))
    assert failed(report) == {
        "GPU quota zone (on-demand)":
            "NVIDIA_L4_GPUS 0 free of 0, 2 needed — fix: `gcloud quotas preferences create "
            "--service=compute.googleapis.com --project=test-project "
            "--quota-id=NVIDIA-L4-GPUS-per-project-region --preferred-value=2 "
            "--dimensions=region=zone` (or IAM & Admin → Quotas in the console)"}
    c = {c.name: c for c in report.checks}
    assert c["GPU quota zone (spot)"].detail == "PREEMPTIBLE_NVIDIA_L4_GPUS 2 free of 2, 2 needed"
    assert c["GPU quota (all regions)"].detail == "GPUS_ALL_REGIONS 3 free of 4, 2 needed"


def test_a_node_without_an_external_ip_needs_private_google_access_or_a_nat(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    fix = ("`gcloud compute networks subnets update default --region=zone "
           "--enable-private-ip-google-access` (or a Cloud NAT for the subnet: `gcloud compute "
           "routers nats create`)")
    with FakeComputeEngine(PROJECT) as fake:
        fake.add_instance("zone-a", "node")
        fake.add_instance("zone-b", "node")
        fake.subnet("zone").private_ip_google_access = False
        path = str(profile(tmp_path, fake))
        report = run_preflight(load_profile(path))
        assert failed(report) == {
            f"instance {z}/node: network": "no external IP, and subnet zone/default has neither "
            "Private Google Access nor a Cloud NAT: the node cannot reach Cloud Storage or "
            f"Secret Manager (its datasets, adapters and secrets) — fix: {fix}"
            for z in ("zone-a", "zone-b")}
        fake.add_nat("zone", subnetworks=["other"])  # a NAT, but not for this subnet
        assert len(run_preflight(load_profile(path)).failed) == 2
        fake.add_nat("zone", router="nat-2", subnetworks=["default"])
        report = run_preflight(load_profile(path))
        assert report.ok, failed(report)
        assert next(c for c in report.checks if c.name == "instance zone-a/node: network"
                    ).detail == "no external IP; Cloud NAT nat-2/nat covers subnet zone/default"
        fake.routers.clear()
        fake.add_instance("zone-a", "node", external_ip="203.0.113.7")
        report = run_preflight(load_profile(path))
        assert list(failed(report)) == ["instance zone-b/node: network"]
        assert statuses(report)["instance zone-a/node: network"] == "ok"


def test_without_prefect_api_url_the_cli_says_so_before_loading_a_saved_block(
        tmp_path: Path) -> None:
    """No PREFECT_API_URL: Prefect 3 would start a temporary local server to load the saved
    blocks (which it has none of); preflight and node smoke say what to set instead."""
    path = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                        compute={"type": "gce", "block": "slm-gce"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(ROOT)}
    fix = ("`prefect config set PREFECT_API_URL=http://<orchestrator>:4200/api` on the "
           "orchestrator (Prefect Cloud: `prefect cloud login`)")
    detail = ("PREFECT_API_URL is not set: the saved blocks, the node's work pool and the "
              "deployments live on the orchestrator's Prefect server (without it Prefect would "
              "start a temporary local server that has none of them)")
    cli = str(ROOT / ".venv" / "bin" / "slm-nightly")
    out = subprocess.run([cli, "preflight", "--profile", str(path)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stdout == (f"preflight of profile {path}: 1 of 1 checks failed\n"
                          f"FAILED  Prefect API: {detail} — fix: {fix}\n")
    assert "temporary" not in out.stderr.lower() and "could not be loaded" not in out.stdout
    out = subprocess.run([cli, "node", "smoke", "--profile", str(path)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == f"slm-nightly: node smoke: {detail} — fix: {fix}"


def test_a_node_environment_that_does_not_fit_the_code_fails_preflight(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    """What a node's run recorded in the bucket (tasks/shared/environment.py) against this checkout:
    a stale image is refused with the rebuild; versions within a range are said."""
    from tasks.shared.environment import describe, record

    here = describe()
    stale = {**here, "packages": {**here["packages"], "prefect": "3.8.0", "polars": "1.1.0",
                                  "torch": "2.9.0+cu128"}, "at": "2026-12-01T00:00:00+00:00"}
    record(BUCKET_BLOCK, stale)
    report = run_preflight(load_profile(str(profile(tmp_path, world))))
    check = next(c for c in report.checks if c.name == "node environment")
    assert (check.status, check.detail, check.fix) == (
        "failed", f"the node's environment {here['digest']} (recorded "
        "2026-12-01T00:00:00+00:00) does not fit this checkout's code: prefect 3.8.0 on the "
        "node is outside ==3.9.1", "rebuild the node image from this checkout "
        "(docs/operator-gcp.md, section 3: The node image), or bring the orchestrator's venv "
        "to the image's")
    record(BUCKET_BLOCK, {**stale, "packages": {**stale["packages"], "prefect": "3.9.1"}})
    check = next(c for c in run_preflight(load_profile(str(profile(tmp_path, world)))).checks
                 if c.name == "node environment")
    assert check.status == "ok"
    assert check.detail.endswith(f"fits pyproject.toml; within its ranges: polars 1.1.0 on the "
                                 f"node, {here['packages']['polars']} here")


def test_a_bucket_block_with_the_orchestrators_own_key_is_refused(
        tmp_path: Path, world: FakeComputeEngine, gcs: GcsEmulator) -> None:
    """Finding 9: the node loads the profile's GcsBucket block; the orchestrator's key in it
    would make the node act as the orchestrator (instance admin)."""
    from prefect_gcp import GcsBucket

    from tests.support.gce import SA

    GcsBucket(bucket="slm-corpus", bucket_folder="slm", gcp_credentials=creds(world)).save(
        "preflight-orchestrator-key", overwrite=True)
    path = profile(tmp_path, world)
    path.write_text(path.read_text().replace(f'gcs_block = "{BUCKET_BLOCK}"',
                                             'gcs_block = "preflight-orchestrator-key"'))
    report = run_preflight(load_profile(str(path)))
    assert failed(report)["bucket preflight-orchestrator-key: credentials"] == (
        f"the block holds a key of {SA['client_email']}, the orchestrator's own account: the "
        "node loads this block, so it would act as the orchestrator (instance admin) instead "
        "of its own account — fix: save the GcsBucket block without gcp_credentials "
        "(docs/operator-gcp.md, section 4): each machine then uses its own service account")
    # the emulator's own test key is another account: said, not refused
    (tmp_path / "ok").mkdir()
    ready = statuses(run_preflight(load_profile(str(profile(tmp_path / "ok", world)))))
    assert ready[f"bucket {BUCKET_BLOCK}: credentials"] == "ok"


def test_a_bucket_block_with_a_folder_is_refused_where_the_node_writes(
        tmp_path: Path, world: FakeComputeEngine, gcs: GcsEmulator) -> None:
    """The node may write its results only at the bucket's root (gcp setup's IAM Condition,
    tasks/gcp/grants.py NODE_WRITES): a block with a folder would have every upload refused."""
    gcs.bucket(folder="nightly/").save("preflight-folder", overwrite=True)
    path = profile(tmp_path, world)
    path.write_text(path.read_text().replace(f'gcs_block = "{BUCKET_BLOCK}"',
                                             'gcs_block = "preflight-folder"'))
    report = run_preflight(load_profile(str(path)))
    assert failed(report)["bucket preflight-folder: node writes"] == (
        "the block writes under gs://slm-corpus/nightly/, but the node may write only "
        "artifacts/adapters/, artifacts/checkpoints/, artifacts/promoted/, "
        "records/node-environment.json at the bucket's root (gcp setup's condition "
        "slm-node-results): its adapters and checkpoints would be refused (403, "
        "storage.objects.create) — fix: save the GcsBucket block without bucket_folder "
        "(docs/operator-gcp.md, section 4)")
    assert statuses(report)["bucket preflight-folder: write"] == "ok"  # the orchestrator may
    (tmp_path / "ok").mkdir()
    ready = statuses(run_preflight(load_profile(str(profile(tmp_path / "ok", world)))))
    assert ready[f"bucket {BUCKET_BLOCK}: node writes"] == "ok"


def test_the_nodes_secrets_exist_with_an_enabled_version(
        tmp_path: Path, world: FakeComputeEngine) -> None:
    """Finding 8: a secret the node's startup script reads ([compute.node]
    prefect_api_key_secret, engine_api_key_secret) is checked before the GPU boots, against a
    fake of Secret Manager's versions.get (tests/fakes/secret_manager.py)."""
    from tests.fakes.secret_manager import FakeSecretManager
    from tests.support.gce import SA

    with FakeSecretManager(PROJECT) as sm:
        sm.add("prefect-api-key", "ENABLED", "DISABLED")

        def secrets() -> dict[str, tuple[str, str]]:
            path = profile(tmp_path, world, compute={"secret_manager_endpoint": sm.url},
                           prefect_api_key_secret="prefect-api-key",
                           engine_api_key_secret="engine-key")
            return {c.name: (c.status, f"{c.detail} — fix: {c.fix}" if c.fix else c.detail)
                    for c in run_preflight(load_profile(str(path))).checks
                    if c.name.startswith("secret ")}

        got = secrets()
        assert got == {
            "secret prefect-api-key": (
                "failed", "its latest version 2 is DISABLED: the node cannot read it — fix: "
                "`printf '%s' \"$VALUE\" | gcloud secrets versions add prefect-api-key "
                "--data-file=-` (or `gcloud secrets versions enable 2 "
                "--secret=prefect-api-key`)"),
            "secret engine-key": (
                "failed", "[compute.node] engine_api_key_secret names engine-key, which does "
                f"not exist in project {PROJECT} or has no version: the node's boot would fail "
                f"— fix: `printf '%s' \"$VALUE\" | gcloud secrets create engine-key "
                f"--data-file=- --project={PROJECT}`, or fix engine_api_key_secret")}
        sm.add("prefect-api-key", "DISABLED", "ENABLED")
        sm.add("engine-key")
        assert secrets() == {
            "secret prefect-api-key": ("ok", "version 2 ENABLED (the node's access is not "
                                       "checked)"),
            "secret engine-key": ("ok", "version 1 ENABLED (the node's access is not checked)")}
        sm.viewer = False
        assert secrets()["secret engine-key"] == (
            "failed", "the orchestrator may not read engine-key's metadata (HTTP 403) — fix: "
            "grant the orchestrator roles/secretmanager.viewer on the secret (its metadata, "
            "never its value): `gcloud secrets add-iam-policy-binding engine-key "
            f"--member=serviceAccount:{SA['client_email']} --role=roles/secretmanager.viewer`")
        assert all(p.endswith("/versions/latest") for p in sm.requests)
