"""The orchestrator → node path: the nightly (this process, the orchestrator) boots the GCE
node on the fake Compute Engine, whose 'startup script' starts what the real one does — an
OpenAI-compatible server standing in for vLLM, and a real `prefect worker` on the node's pool
`slm-node`. Phase 1 calls the server over the 'VPC'; phase 2 trains each passing bucket on the
node through the `train/node` deployment (deployed from prefect.yaml with the CLI) and
`run_deployment`; stopping the node ends both.

Real: Prefect server, the CLI deploy, the node's worker and its flow-run processes, FalkorDB,
the training (SmolLM2-135M, a few LoRA steps on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blocks.gce import GceCompute
from flows.nightly import nightly
from tasks.compute.gce.startup import ENGINE_UNIT, WORKER_UNIT
from tasks.shared.errors import NodePreempted
from tasks.training.registry import ArtifactStore
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.gcs import GcsEmulator
from tests.support.gce import PROJECT, creds
from tests.support.paths import PREFECT, ROOT
from tests.support.worker_node import WorkerNode, harness_api_url

pytestmark = pytest.mark.usefixtures("prefect_api")

ENG, APPR = "engineering-pointsav", "apprenticeship-pointsav"


@pytest.fixture(scope="module")
def node_deployment(prefect_api: None) -> str:
    """The node's pool on the harness server; each test deploys prefect.yaml's train/node into
    its own GCS emulator (`deploy_node`): the deploy pushes the code there and the node's runs
    pull it from there."""
    env = {**os.environ, "PREFECT_API_URL": harness_api_url()}
    out = subprocess.run([PREFECT, "work-pool", "create", "slm-node", "--type", "process",
                          "--overwrite"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return "train/node"


def deploy_node(gcs: GcsEmulator, node: WorkerNode | None = None) -> None:
    """`prefect --no-prompt deploy --name train/node` from this checkout, as the guide runs it:
    the code goes to the bucket of the saved GcsBucket block `slm-gcs` (prefect.yaml), with
    application-default credentials — which the node gets too (its own service account)."""
    gcs.bucket(folder="slm").save("slm-gcs", overwrite=True)
    env = {**os.environ, "PREFECT_API_URL": harness_api_url(), "PWD": str(ROOT),
           "PYTHONPATH": str(ROOT), **gcs.adc()}
    out = subprocess.run([PREFECT, "--no-prompt", "deploy", "--name", "train/node"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if node is not None:
        node.runtime.env.update(gcs.adc())


@pytest.fixture(autouse=True)
def free_gpu_slot() -> Any:
    """A node run killed with its node (preemption) keeps its `gpu` lease: a real server frees
    it when the 60 s lease runs out (tests/integration/test_teardown.py), the test harness's server never
    does. Release it after each test the way an operator would (`prefect gcl update gpu
    --active-slots 0`)."""
    yield
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.update_global_concurrency_limit("gpu",
                                                   GlobalConcurrencyLimitUpdate(active_slots=0))
        except ObjectNotFound:  # no run has created it yet
            pass


def _child_runs(parent_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["node"])))
        return [r for r in runs if r.parameters.get("profile") == parent_id]


def test_nightly_trains_on_the_node_through_its_deployment(
        tmp_path: Path, falkordb: int, base_cache: dict[str, Any], node_deployment: str) -> None:
    node = WorkerNode(tmp_path)
    with GcsEmulator(tmp_path) as gcs, node.fake:  # the emulator first: the node inherits it
        gcs.bucket().save("node-path-gcs", overwrite=True)
        deploy_node(gcs, node)
        profile = node.profile(tmp_path, "node-path", {**base_cache, "falkordb": falkordb}, 2,
                               gcs_block="node-path-gcs")
        injected = threading.Event()

        def flaky_api_during_the_watch() -> None:  # the first node run exists: the watch is on
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not _child_runs(str(profile)):
                time.sleep(0.2)
            node.fake.fail_next("get", 429, "rateLimitExceeded", times=2, kind="instances")
            node.fake.fail_next("get", 0, kind="instances")  # a connection reset
            injected.set()

        t = threading.Thread(target=flaky_api_during_the_watch, daemon=True)
        t.start()
        s = nightly(profile=str(profile)).to_dict()
        assert s["status"] == "completed", (s.get("error"), node.log.read_text()[-4000:])
        # the node booted the script the nightly rendered from the profile into its metadata
        md = node.fake.instance("zone-a", "node").metadata
        assert md["enable-guest-attributes"] == "TRUE"
        assert "--pool slm-node --type process" in md["startup-script"]
        # the watch's checks of the node met 429, 429 and a reset, and the phase went on
        assert injected.is_set() and node.fake.faults == []
        phases = {k: v["status"] for k, v in s["phases"].items()}
        assert phases["inference_down"] == "completed"
        assert phases[f"train:{ENG}"] == phases[f"train:{APPR}"] == "completed"
        # each bucket trained in a flow run of train/node, picked up by the node's worker
        runs = {r.parameters["params"]["bucket"]: r for r in _child_runs(str(profile))}
        assert set(runs) == {ENG, APPR}
        for bucket, run in runs.items():
            assert run.state.is_completed() and run.work_pool_name == "slm-node"
            assert run.parent_task_run_id is not None  # a subflow of the nightly in the UI
            t = s["training"][bucket]
            assert t["state"] == "done" and t["flow_run_id"] == str(run.id)
            assert t["node_run"] == {"id": str(run.id), "name": run.name}
            assert t["step"] == t["steps"] == (2 if bucket == ENG else 1)
            # the node read its dataset from GCS (uploaded by the nightly), not this disk
            key = run.parameters["dataset_gcs_key"]
            assert key.startswith(f"datasets/{bucket}/") and key.endswith(".parquet")
            assert t["dataset"] == str(tmp_path / "state" / "node-datasets" / key)
        # what the node wrote: a PEFT adapter for vLLM (no GGUF on this path), the manifest
        store = ArtifactStore(tmp_path / "state" / "artifacts")
        m = store.manifest(s["training"][ENG]["name"])
        assert m.created_by == "nightly" and m.files is not None and m.files["peft"] == "peft"
        assert (store.adapter_dir(m.name) / "peft" / "adapter_model.safetensors").is_file()
        # GCS holds the adapters, the datasets and the run records
        names = {b.name for b in gcs.bucket().list_blobs("")}  # at the root: the node's grant
        assert f"artifacts/adapters/{m.name}/manifest.json" in names
        assert f"artifacts/adapters/{m.name}/peft/adapter_model.safetensors" in names
        assert runs[ENG].parameters["dataset_gcs_key"] in names
        assert {"records/runs/last-run.json", "records/scorecards/latest.json"} <= names
        # the node is down and everything it ran is gone
        inst = node.fake.instance("zone-a", "node")
        assert inst.status == "TERMINATED" and inst.metadata["slm-engine"] == "stopped"
        assert not node.runtime.unit_running("zone-a", "node", ENGINE_UNIT)
        assert not node.runtime.unit_running("zone-a", "node", WORKER_UNIT)
        assert node.runtime.unit_user("zone-a", "node", WORKER_UNIT) == "slm"
        assert len(node.fake.seen("stop", "zone-a", "node")) == 1


def test_a_node_preempted_mid_training_fails_the_phase_and_its_node_run_crashes(
        tmp_path: Path, falkordb: int, base_cache: dict[str, Any], node_deployment: str) -> None:
    node = WorkerNode(tmp_path)
    with GcsEmulator(tmp_path) as gcs, node.fake:  # the emulator first: the node inherits it
        gcs.bucket().save("node-preempt-gcs", overwrite=True)
        deploy_node(gcs, node)
        profile = node.profile(tmp_path, "node-preempt", {**base_cache, "falkordb": falkordb},
                               400, gcs_block="node-preempt-gcs")
        store = ArtifactStore(tmp_path / "state" / "artifacts")

        def preempt_when_training() -> None:  # the first adapter manifest says "running"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if any(m.state == "running" and m.step >= 3
                       for m in store.list()):
                    node.fake.preempt("zone-a", "node")
                    return
                time.sleep(0.2)

        t = threading.Thread(target=preempt_when_training, daemon=True)
        t.start()
        with pytest.raises(NodePreempted, match="training failed for .*preempted"):
            nightly(profile=str(profile))
        t.join(5)
        s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
        first, second = s["training"][ENG], s["training"][APPR]
        assert first["state"] == "preempted" and "spot preemption at" in first["message"]
        assert second["state"] == "not run" and "preempted" in second["message"]
        assert s["phases"][f"train:{ENG}"]["status"] == "preempted"
        assert f"train:{APPR}" not in s["phases"] and s["status"] == "preempted"
        # the node run went down with its node: Crashed, not left Running
        (run,) = _child_runs(str(profile))
        assert run.state.is_crashed() and "the node went away" in run.state.message
        # the checkpoint it saved is where the next run resumes (tests/integration/test_train.py)
        assert list((tmp_path / "state" / "artifacts" / "checkpoints").glob("*/checkpoint-*"))
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
        assert not node.runtime.unit_running("zone-a", "node", WORKER_UNIT)


def test_a_phase2_timeout_cancels_the_node_run_and_the_node_worker_ends_it(
        tmp_path: Path, falkordb: int, base_cache: dict[str, Any], node_deployment: str) -> None:
    node = WorkerNode(tmp_path)
    with GcsEmulator(tmp_path) as gcs, node.fake:
        gcs.bucket().save("node-timeout-gcs", overwrite=True)
        deploy_node(gcs, node)
        profile = node.profile(tmp_path, "node-timeout", {**base_cache, "falkordb": falkordb},
                               400, gcs_block="node-timeout-gcs")
        with pytest.raises(Exception, match="training failed"):
            nightly(profile=str(profile), phase2_timeout_seconds=25)
        s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
        assert s["phases"][f"train:{ENG}"]["status"] == "timed_out"
        assert "did not finish within 25 s" in s["training"][ENG]["message"]
        (first, *_) = [r for r in _child_runs(str(profile))
                       if r.parameters["params"]["bucket"] == ENG]
        # the nightly asked for the cancel; the node's worker carried it out before the stop
        assert first.state.is_cancelled(), first.state
        assert first.state.message != "cancelled by the nightly; the node stop ends its process"
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
        assert not node.runtime.unit_running("zone-a", "node", WORKER_UNIT)


def test_no_worker_on_the_node_fails_fast_and_cancels_the_waiting_run(
        tmp_path: Path, node_deployment: str) -> None:
    """A node whose worker never comes up (bad image, wrong API URL): the nightly does not
    keep the GPU running until the phase timeout; it fails after the pickup time, naming where
    to look, and the run it submitted is cancelled."""
    from prefect import flow

    from tasks.compute.gce.lifecycle import GceNode
    from tasks.compute.node import Watch, run_on_node
    from tasks.shared.errors import PhaseFailed

    fake = FakeComputeEngine(PROJECT)  # boots, but starts no worker
    with GcsEmulator(tmp_path) as gcs, fake:
        deploy_node(gcs)
        fake.add_instance("zone-a", "node")
        compute = GceNode(GceCompute(project=PROJECT, zone="zone-a", instance="node",
                                     api_endpoint=fake.url, gcp_credentials=creds(fake),
                                     poll_seconds=0.1, state_dir=str(tmp_path / "state")))
        compute.start()

        @flow
        def orchestrator() -> None:
            run_on_node(compute, node_deployment, {"params": {"dataset": "x.parquet", "method": "sft"},
                                                   "profile": "no-worker"},
                        3600, label="train:x", watch=Watch(poll_seconds=0.2, pickup_seconds=3))

        t = time.monotonic()
        with pytest.raises(PhaseFailed, match="no worker on the node's pool took node run .* "
                                              "within 3 s — check the node's Prefect worker"):
            orchestrator()
        assert time.monotonic() - t < 30
        (run,) = _child_runs("no-worker")
        assert run.state.is_cancelled() and "before the node's worker took it" in run.state.message
        compute.stop()


def test_half_nights_extract_only_then_retrain_one_bucket(
        tmp_path: Path, falkordb: int, base_cache: dict[str, Any], node_deployment: str) -> None:
    """prefect.yaml's nightly/extract and nightly/retrain (phases = extract | train): phase 1
    alone trains nothing; phase 2 alone asks the engine nothing, trains only the bucket named,
    and trains it again with retrain though the data did not change."""
    from tasks.shared.errors import ConfigError

    node = WorkerNode(tmp_path)
    with GcsEmulator(tmp_path) as gcs, node.fake:
        gcs.bucket().save("node-half-gcs", overwrite=True)
        deploy_node(gcs, node)
        profile = node.profile(tmp_path, "node-half", {**base_cache, "falkordb": falkordb}, 1,
                               gcs_block="node-half-gcs")
        with pytest.raises(ConfigError, match=r"buckets \['nope'\] are not the profile's "
                                              "corpus buckets"):
            nightly(profile=str(profile), phases="train", buckets=["nope"])
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"  # nothing booted

        s = nightly(profile=str(profile), phases="extract").to_dict()
        assert s["status"] == "completed", s.get("error")
        assert s["phases"]["extract"]["status"] == "completed"
        assert s["extraction"]["documents"]["transcripts"]["seen"] == 1
        assert (s["phases"]["scorecard"]["status"], s["phases"]["scorecard"]["note"]) == (
            "skipped", "phases = extract")
        assert s["phases"]["train"]["status"] == "skipped" and not _child_runs(str(profile))

        firsts = []
        for _ in range(2):
            s = nightly(profile=str(profile), phases="train", buckets=[ENG], retrain=True).to_dict()
            assert s["status"] == "completed", (s.get("error"), node.log.read_text()[-3000:])
            assert (s["phases"]["extract"]["status"], s["phases"]["extract"]["note"]) == (
                "skipped", "phases = train")
            assert "inference_up" not in s["phases"]  # the engine was only stopped
            assert s["phases"]["inference_down"]["status"] == "completed"
            assert set(s["training"]) == {ENG} and s["training"][ENG]["state"] == "done"
            assert not s["training"][ENG].get("reused")  # retrain: trained again
            firsts.append(s["training"][ENG]["name"])
        assert firsts[0] != firsts[1]
        # the other passing bucket's marker stays for the next night
        assert (tmp_path / "state" / "training-pending" / f"{APPR}.json").is_file()
        runs = _child_runs(str(profile))
        assert [r.parameters["retrain"] for r in runs] == [True, True]
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
