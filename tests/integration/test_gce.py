"""The GCE node (tasks/compute/gce/ on a GceCompute block) driven through the real
google-cloud-compute client (REST transport, service
account credentials) against tests/fakes/compute_engine.py."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.shared.errors import ConfigError, NodeBootTimeout, NodePreempted, NodeUnavailable
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import NODE_SA, FakeComputeEngine, FakeInstance
from tests.support.gce import PROJECT, SA, creds, gce


@pytest.fixture
def fake() -> Iterator[FakeComputeEngine]:
    with FakeComputeEngine(PROJECT) as f:
        yield f


def test_start_waits_for_running_and_reads_the_ip(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node", boot_seconds=0.5)
    node = gce(fake, tmp_path)
    desc = node.start()
    assert desc == "GCE test-project/zone-a/node (spot, g2-standard-4) at 127.0.0.1"
    assert fake.instance("zone-a", "node").status == "RUNNING"
    assert len(fake.seen("start")) == 1 and fake.seen("wait")
    # every call was authenticated with the service account (self-signed JWT or token)
    assert all(c["auth"] and c["auth"].startswith("Bearer ") for c in fake.calls)
    node.check_running()  # RUNNING: no NodePreempted
    record = json.loads((tmp_path / "state" / "gce-node.json").read_text())
    assert record["node"] == {"zone": "zone-a", "instance": "node", "ip": "127.0.0.1",
                              "model": "SPOT"}


def test_start_when_already_running_reuses_it(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node", status="RUNNING")
    desc = gce(fake, tmp_path).start()
    assert desc.endswith("at 127.0.0.1, already running (reused)")
    assert fake.seen("start") == []


def test_running_node_in_a_fallback_zone_is_reused_not_duplicated(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node", status="RUNNING")
    desc = gce(fake, tmp_path, fallback_zones=["zone-b"]).start()
    assert "zone-b/node" in desc and "reused" in desc
    assert fake.seen("start") == [] and fake.instance("zone-a", "node").status == "TERMINATED"


def test_stop_and_stop_when_already_stopped(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    node = gce(fake, tmp_path)
    node.start()
    assert node.stop() == ["zone-a"]
    assert fake.instance("zone-a", "node").status == "TERMINATED"
    assert len(fake.seen("stop", "zone-a", "node")) == 1
    assert node.stop() == []  # idempotent: no second stop call
    assert len(fake.seen("stop")) == 1


def test_missing_instance_names_project_zone_and_instance(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    node = gce(fake, tmp_path, instance="nope")
    for call in (node.start, node.stop):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "projects/test-project/zones/zone-a/instances/nope not found" in msg
        assert "fix project/zone/instance" in msg
    with pytest.raises(ConfigError, match="permission denied"):
        gce(fake, tmp_path, project="other-project").start()


def test_stockout_falls_back_to_the_next_zone(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node-b")
    fake.stock_out("zone-a", "SPOT")
    node = gce(fake, tmp_path, fallback_zones=["zone-b"], zone_instances={"zone-b": "node-b"})
    desc = node.start()
    assert desc.startswith("GCE test-project/zone-b/node-b (spot, g2-standard-4) at 127.0.0.1")
    assert "zone-a spot: stocked out (ZONE_RESOURCE_POOL_EXHAUSTED)" in desc
    assert fake.instance("zone-a", "node").status == "TERMINATED"
    assert fake.instance("zone-b", "node-b").status == "RUNNING"
    assert node.stop() == ["zone-b"]  # stop finds the node in whichever zone it runs


def test_stockout_everywhere_falls_back_to_on_demand_then_back_to_spot(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    fake.stock_out("zone-a", "SPOT")
    fake.stock_out("zone-b", "SPOT")
    node = gce(fake, tmp_path, fallback_zones=["zone-b"], on_demand_fallback=True)
    desc = node.start()
    assert desc.startswith("GCE test-project/zone-a/node (on-demand, g2-standard-4)")
    assert "zone-a spot: stocked out" in desc and "zone-b spot: stocked out" in desc
    # every start set the whole scheduling: spot (stocked out), then on-demand with the same
    # self-stop — nothing of the spot settings left behind (STOP on STANDARD needs a duration)
    assert [c["body"]["provisioningModel"] for c in fake.seen("setScheduling", "zone-a")] == \
        ["SPOT", "STANDARD"]
    assert fake.instance("zone-a", "node").scheduling() == scheduling("STANDARD", 18000)
    node.stop()
    fake.restock("zone-a")
    assert "(spot," in node.start(max_run_seconds=3600.4)  # the next night is spot again
    assert fake.instance("zone-a", "node").scheduling() == scheduling("SPOT", 3601)
    node.stop()


def test_stockout_without_on_demand_fails_clearly(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    fake.stock_out("zone-a", "SPOT")
    fake.stock_out("zone-b", "SPOT")
    with pytest.raises(NodeUnavailable) as e:
        gce(fake, tmp_path, fallback_zones=["zone-b"]).start()
    msg = str(e.value)
    assert "zone-a spot: stocked out" in msg and "zone-b spot: stocked out" in msg
    assert "on_demand_fallback = true" in msg and "fallback_zones" in msg
    assert {c["body"]["provisioningModel"] for c in fake.seen("setScheduling")} == {"SPOT"}


def scheduling(model: str, seconds: int) -> dict[str, Any]:
    """What a start must leave on the instance, as Compute shows it: the placement's model,
    no restart, no live migration (an L4 cannot), self-stop after `seconds` RUNNING."""
    return {"provisioningModel": model, "preemptible": model == "SPOT",
            "automaticRestart": False, "onHostMaintenance": "TERMINATE",
            "instanceTerminationAction": "STOP", "maxRunDuration": {"seconds": str(seconds)}}


# each start error as Compute returns it → what the attempt is called in the description
START_ERRORS = {
    "stockout-details": "stocked out (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS)",
    "quota": "quota exceeded (QUOTA_EXCEEDED: Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  "
             "Limit: 0.0 in region us-central1.)",
    "unsupported": "unsupported (UNSUPPORTED_OPERATION: ",
    "503": "server error (503 backendError: Internal error.",
    "429": "rate limited (429 rateLimitExceeded: Quota exceeded for quota metric 'Queries'",
    "rate-limit": "rate limited (403 rateLimitExceeded: Rate Limit Exceeded)",
    "quota-http": "quota exceeded (403 quotaExceeded: Quota 'NVIDIA_L4_GPUS' exceeded.",
    "preempted": "preempted while booting (compute (gce): projects/test-project/zones/"
                 "us-central1-a/instances/node went TERMINATED while booting",
}


@pytest.mark.parametrize("kind", sorted(START_ERRORS))
def test_each_start_error_moves_on_to_the_next_zone(
        fake: FakeComputeEngine, tmp_path: Path, kind: str) -> None:
    fake.add_instance("us-central1-a", "node", boot_seconds=0.2)
    fake.add_instance("us-east4-c", "node", boot_seconds=0.1)
    fake.fail_start("us-central1-a", "SPOT", kind)
    node = gce(fake, tmp_path, zone="us-central1-a", fallback_zones=["us-east4-c"])
    desc = node.start()
    assert desc.startswith("GCE test-project/us-east4-c/node (spot, g2-standard-4) at 127.0.0.1; "
                           f"fell back after: us-central1-a spot: {START_ERRORS[kind]}")
    assert fake.instance("us-central1-a", "node").status == "TERMINATED"
    assert fake.instance("us-east4-c", "node").status == "RUNNING"
    node.stop()


def test_quota_skips_the_region_then_on_demand_and_failing_everywhere_names_each_attempt(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    for zone in ("us-central1-a", "us-central1-b"):
        fake.add_instance(zone, "node", boot_seconds=0.1)
    fake.fail_start("us-central1-a", "SPOT", "quota")  # the spot L4 quota of the region is 0
    node = gce(fake, tmp_path, zone="us-central1-a", fallback_zones=["us-central1-b"],
               on_demand_fallback=True)
    desc = node.start()
    assert desc.startswith("GCE test-project/us-central1-a/node (on-demand,")
    assert "us-central1-b spot: skipped (quota exceeded in region us-central1)" in desc
    assert [c["zone"] for c in fake.seen("start")] == ["us-central1-a", "us-central1-a"]
    node.stop()
    fake.fail_start("us-central1-a", "STANDARD", "unsupported")
    fake.fail_start("us-central1-b", "STANDARD", "503")
    with pytest.raises(NodeUnavailable) as e:
        node.start()
    msg = str(e.value)
    assert msg.startswith("compute (gce): could not start node in any zone (us-central1-a spot: "
                          "quota exceeded (QUOTA_EXCEEDED: Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS'")
    for attempt in ("us-central1-b spot: skipped (quota exceeded in region us-central1)",
                    "us-central1-a on-demand: unsupported (UNSUPPORTED_OPERATION",
                    "us-central1-b on-demand: server error (503 backendError"):
        assert attempt in msg
    assert "raise the GPU quota" in msg and "accelerator-types list" in msg


def test_a_refusal_no_zone_would_change_ends_the_start_at_once_with_the_fix(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    fake.enforce_iam = True
    fake.grant("sync@test-project.iam.gserviceaccount.com", "roles/compute.viewer")
    with pytest.raises(ConfigError) as e:
        gce(fake, tmp_path, fallback_zones=["zone-b"]).start()
    assert str(e.value) == (
        "compute (gce): setScheduling on projects/test-project/zones/zone-a/instances/node "
        "refused: 403 forbidden: Required 'compute.instances.setScheduling' permission for "
        "'projects/test-project/zones/zone-a/instances/node' — grant "
        "sync@test-project.iam.gserviceaccount.com roles/compute.instanceAdmin.v1 on the "
        "instance: gcloud compute instances add-iam-policy-binding node --zone=zone-a "
        "--project=test-project "
        "--member=serviceAccount:sync@test-project.iam.gserviceaccount.com "
        "--role=roles/compute.instanceAdmin.v1")
    assert fake.seen("setScheduling", "zone-b") == [] and fake.seen("start") == []


def test_transient_errors_while_booting_and_watching_are_retried(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    from google.api_core import exceptions as gexc

    fake.add_instance("zone-a", "node", boot_seconds=0.3)
    node = gce(fake, tmp_path)
    fake.fail_next("get", 429, "rateLimitExceeded", kind="instances")
    fake.fail_next("setScheduling", 0)  # connection reset
    fake.fail_next("wait", 503, times=2)
    fake.fail_next("wait", 403, "rateLimitExceeded")
    assert node.start().startswith("GCE test-project/zone-a/node (spot,")
    assert fake.faults == []  # every injected error was met, and survived
    for status, reason in ((0, ""), (503, "backendError"), (429, "rateLimitExceeded"),
                           (403, "rateLimitExceeded")):  # the watch's check of the node
        fake.fail_next("get", status, reason, times=2, kind="instances")
        node.check_running()
    assert fake.faults == []
    # an error that outlasts the retries is raised (429: the client itself retries only 503 on
    # get, for up to 600 s — google-cloud-compute's default retry)
    fake.fail_next("get", 429, "rateLimitExceeded", times=99, kind="instances")
    with pytest.raises(gexc.TooManyRequests):
        node.check_running()
    fake.faults.clear()
    node.stop()


@pytest.mark.serial  # sub-second windows of the fake's clock (issue 36)
def test_the_node_stops_itself_at_its_max_run_duration(tmp_path: Path) -> None:
    """The orchestrator died after the start (no stop call): Compute stops the node after
    maxRunDuration RUNNING. The fake runs 1 s of the duration as 10 ms."""
    with FakeComputeEngine(PROJECT, run_duration_scale=0.01) as fake:
        fake.add_instance("zone-a", "node", boot_seconds=0.1)
        node = gce(fake, tmp_path)
        with pytest.raises(ConfigError, match="max run 10 s is outside Compute's maxRunDuration"):
            node.start(max_run_seconds=10)
        node.start(max_run_seconds=30)  # 0.3 s here
        assert fake.instance("zone-a", "node").scheduling()["maxRunDuration"] == {"seconds": "30"}
        deadline = time.monotonic() + 5
        while fake.instance("zone-a", "node").status != "TERMINATED":
            assert time.monotonic() < deadline, "the node did not stop itself"
            time.sleep(0.05)
        assert fake.seen("stop") == [] and fake.instance("zone-a", "node").max_run_stops == 1
        assert 0.3 <= fake.running_seconds("zone-a", "node") < 0.6
        with pytest.raises(NodePreempted,
                           match=r"stopped by Compute at its max run duration \(30 s RUNNING"):
            node.check_running()
        node.start(max_run_seconds=60)  # a restart gets the whole duration again
        time.sleep(0.3)
        assert fake.instance("zone-a", "node").status == "RUNNING"
        node.stop()


def test_set_metadata_without_service_account_user_names_role_accounts_and_command(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")  # runs as NODE_SA, as the node must (GCS, secrets)
    fake.enforce_iam = True
    orchestrator = "sync@test-project.iam.gserviceaccount.com"
    fake.grant(orchestrator, "roles/compute.instanceAdmin.v1")
    node = gce(fake, tmp_path)
    node.start()
    node_sa = NODE_SA.format(project=PROJECT)
    with pytest.raises(ConfigError) as e:
        node.stop_inference()  # inference_down: the 403 that skipped training
    assert str(e.value) == (
        "compute (gce): setMetadata on projects/test-project/zones/zone-a/instances/node refused: "
        "403 forbidden: Required 'iam.serviceAccounts.actAs' permission for "
        f"'projects/test-project/serviceAccounts/{node_sa}' — the instance runs as {node_sa}, "
        "so writing its metadata needs roles/iam.serviceAccountUser on that account for "
        f"{orchestrator}: gcloud iam service-accounts add-iam-policy-binding {node_sa} "
        f"--project=test-project --member=serviceAccount:{orchestrator} "
        "--role=roles/iam.serviceAccountUser")
    fake.grant(orchestrator, "roles/iam.serviceAccountUser",
               f"projects/{PROJECT}/serviceAccounts/{node_sa}")
    assert node.stop_inference() is False  # now allowed (no server was up)
    assert fake.instance("zone-a", "node").metadata["slm-engine"] == "stopped"
    node.stop()


def test_fake_set_scheduling_keeps_absent_fields_and_refuses_what_compute_refuses(
        fake: FakeComputeEngine) -> None:
    """The semantics the start relies on, through the real client: a setScheduling body's
    absent fields are kept (gcloud set-scheduling sends only the flags given), so the old
    switch to on-demand — model, restart and maintenance only — was refused."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    fake.add_instance("zone-a", "node")  # SPOT, preemptible, STOP
    client, _ = GceCompute(project=PROJECT, zone="zone-a", instance="node",
                           api_endpoint=fake.url, gcp_credentials=creds(fake)
                           ).get_compute_clients()

    def set_(**kw: Any) -> None:
        client.set_scheduling_unary(project=PROJECT, zone="zone-a", instance="node",
                                    scheduling_resource=compute_v1.Scheduling(**kw))

    with pytest.raises(gexc.BadRequest, match="For preemptible, only allowed provisioning_model "
                                              "value is SPOT"):
        set_(provisioning_model="STANDARD", automatic_restart=False,
             on_host_maintenance="TERMINATE")
    with pytest.raises(gexc.BadRequest, match="You cannot specify a termination action for a VM "
                                              "instance that has the standard provisioning"):
        set_(provisioning_model="STANDARD", preemptible=False, automatic_restart=False)
    with pytest.raises(gexc.BadRequest, match="do not support live migration"):
        set_(on_host_maintenance="MIGRATE")
    set_(max_run_duration=compute_v1.Duration(seconds=600))  # only this field changes
    assert fake.instance("zone-a", "node").scheduling() == {
        "provisioningModel": "SPOT", "preemptible": True, "automaticRestart": False,
        "onHostMaintenance": "TERMINATE", "instanceTerminationAction": "STOP",
        "maxRunDuration": {"seconds": "600"}}


@pytest.mark.serial  # sub-second windows of the fake's clock (issue 36)
def test_slow_boot_respects_boot_timeout_and_requests_a_stop(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node", boot_seconds=60)
    node = gce(fake, tmp_path, boot_timeout_seconds=1.5)
    t = time.monotonic()
    with pytest.raises(NodeBootTimeout, match="not RUNNING after 2 s .*a stop was requested"):
        node.start()
    assert time.monotonic() - t < 8
    assert len(fake.seen("stop", "zone-a", "node")) == 1
    time.sleep(0.5)
    assert fake.instance("zone-a", "node").status == "TERMINATED"


def test_preemption_mid_run_is_detected(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    node = gce(fake, tmp_path)
    node.start()
    fake.preempt("zone-a", "node")
    with pytest.raises(NodePreempted, match="is TERMINATED while the run uses it "
                                            r"\(spot preemption at "):
        node.check_running()
    endpoint = InferenceEndpoint(model="fake", readiness_timeout_seconds=30)
    with pytest.raises(NodePreempted):
        node.start_inference(endpoint)
    assert node.stop() == []  # nothing left running


@pytest.mark.serial  # sub-second windows of the fake's clock (issue 36)
def test_usage_and_cost_come_from_running_time(fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    node = gce(fake, tmp_path, spot_usd_per_hour=3600.0)  # $1 per second, to see it
    node.start()
    time.sleep(1.0)
    node.stop()
    used = node.usage()
    truth = fake.running_seconds("zone-a", "node")
    # lastStart → lastStop also spans STOPPING: the estimate errs high by at most the stop time
    slack = fake.op_pending_seconds + fake.stop_seconds + 0.15
    assert truth >= 1.0 and truth <= used.running_seconds <= truth + slack
    assert used.estimated_usd == pytest.approx(used.running_seconds, abs=1e-3)
    assert used.zones["zone-a"].provisioning == "spot"
    assert node.usage(since=time.time() + 60).running_seconds == 0


def test_start_inference_waits_for_the_server_the_node_starts_and_stop_kills_it(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    port = free_port()

    def vllm(inst: FakeInstance) -> list[str]:
        return [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port), "--latency", "0"]

    fake.on_start = vllm
    fake.agent_log = tmp_path / "agent.log"
    fake.add_instance("zone-a", "node")
    node = gce(fake, tmp_path, inference_port=port)
    endpoint = InferenceEndpoint(model="fake", readiness_timeout_seconds=30)
    node.start()
    url = node.start_inference(endpoint)
    assert url == f"http://127.0.0.1:{port}"
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "fake"
    assert node.inference_running()
    assert node.stop_inference() is True  # metadata slm-engine=stopped → the watcher kills it
    assert not node.inference_running() and not fake.agent_running("zone-a", "node")
    url = node.start_inference(endpoint)  # slm-engine=running brings it back
    assert node.inference_running()
    node.stop_inference()
    node.stop()
    assert not fake.agent_running("zone-a", "node") and not node.inference_running()
    node.start()  # the next night: start() resets slm-engine so vLLM comes up at boot
    assert fake.instance("zone-a", "node").metadata["slm-engine"] == "running"
    assert fake.agent_running("zone-a", "node")
    node.stop()


def test_credentials_stay_out_of_logs_reprs_and_descriptions(
        fake: FakeComputeEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    fake.stock_out("zone-a", "SPOT")
    node = gce(fake, tmp_path, fallback_zones=["zone-b"])
    with caplog.at_level(logging.DEBUG):
        desc = node.start()
        node.usage()
        node.stop()
    key = SA["private_key"].splitlines()[1]
    bearer = {c["auth"].split()[1] for c in fake.calls if c["auth"]}
    assert bearer, "the client sent no credentials"
    text = "\n".join([caplog.text, desc, repr(node), str(node.block.model_dump()),
                      *(p.read_text() for p in (tmp_path / "state").glob("*"))])
    for secret in (key, *bearer):
        assert secret not in text
    assert "SecretDict('**********')" in repr(node)


def test_no_credentials_anywhere_is_a_clear_error(fake: FakeComputeEngine, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="no Google credentials — set the block's gcp_credentials"):
        gce(fake, tmp_path, gcp_credentials=None).start()


def test_startup_script_is_written_into_instance_metadata(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    inst = fake.instance("zone-a", "node")
    inst.metadata = {"enable-oslogin": "TRUE"}
    node = gce(fake, tmp_path, fallback_zones=["zone-b"],
               node={"engine": "vllm", "prefect_api_url": "https://prefect.internal/api",
                     "work_pool": "gpu-node"})
    endpoint = InferenceEndpoint(model="olmo-3-32b-think", context_tokens=8192,
                                 max_output_tokens=3072)
    assert node.install_startup_script(endpoint, {"today": "/opt/adapters/2026-11-30"}) == \
        ["zone-a", "zone-b"]
    for zone in ("zone-a", "zone-b"):
        script = fake.instance(zone, "node").metadata["startup-script"]
        assert "--lora-modules today=/opt/adapters/2026-11-30" in script
        assert '--host "$VPC_IP" --port 9080' in script
        assert ("ExecStart=/opt/slm-nightly/.venv/bin/prefect worker start --pool gpu-node "
                "--type process") in script
        assert fake.instance(zone, "node").metadata["enable-guest-attributes"] == "TRUE"
    assert fake.instance("zone-a", "node").metadata["enable-oslogin"] == "TRUE"  # kept


def test_prepare_writes_the_profiles_script_only_where_it_differs(
        fake: FakeComputeEngine, tmp_path: Path) -> None:
    """Before each start the nightly brings every zone's startup script in line with the
    profile (no manual install step that can go stale); an unchanged one is not rewritten."""
    fake.add_instance("zone-a", "node")
    fake.add_instance("zone-b", "node")
    kw: dict[str, Any] = dict(fallback_zones=["zone-b"],
                              node={"prefect_api_url": "https://prefect.internal/api"})
    endpoint = InferenceEndpoint(model="olmo-3-32b-think", dialect="llama.cpp")
    assert gce(fake, tmp_path, **kw).prepare(endpoint) == ["zone-a", "zone-b"]
    writes = len(fake.seen("setMetadata"))
    assert gce(fake, tmp_path, **kw).prepare(endpoint) == []
    assert len(fake.seen("setMetadata")) == writes
    fake.instance("zone-b", "node").metadata["startup-script"] = "#!/bin/bash\nold"
    kw["node"] = {**kw["node"], "work_pool": "gpu-node"}
    assert gce(fake, tmp_path, **kw).prepare(endpoint) == ["zone-a", "zone-b"]
    assert "--pool gpu-node" in fake.instance("zone-b", "node").metadata["startup-script"]
    keyed = InferenceEndpoint(model="m", dialect="llama.cpp", api_key="k-123")
    with pytest.raises(ConfigError, match="engine_api_key_secret"):
        gce(fake, tmp_path, **kw).prepare(keyed)


def test_readiness_reports_progress_and_checks_the_served_model(
        fake: FakeComputeEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    served = {"model": "olmo-3-32b-think"}

    def vllm(inst: FakeInstance) -> list[str]:  # listens only after 'loading weights'
        return [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port),
                "--load-seconds", "2", "--model", served["model"]]

    fake.on_start = vllm
    fake.agent_log = tmp_path / "agent.log"
    fake.add_instance("zone-a", "node")
    node = gce(fake, tmp_path, inference_port=port, progress_seconds=0.5)
    node.start()
    endpoint = InferenceEndpoint(model="olmo-3-32b-think", readiness_timeout_seconds=30)
    with caplog.at_level(logging.INFO, logger="slm_nightly.gce"):
        assert node.start_inference(endpoint) == f"http://127.0.0.1:{port}"
    waits = [r.message for r in caplog.records if r.message.startswith("waiting for the engine")]
    assert waits and "down (no answer on the port yet" in waits[0]
    assert any("engine ready at" in r.message and "serving olmo-3-32b-think" in r.message
               for r in caplog.records)
    # a node whose vLLM serves another name: a clear error, not requests that 404 later
    node.stop_inference()
    served["model"] = "some-other-model"
    with pytest.raises(ConfigError, match=r"serves \['some-other-model'\], not "
                                          "'olmo-3-32b-think' — set the inference block's model"):
        node.start_inference(endpoint)
    node.stop()


def test_start_timeout_caps_the_boot_wait_below_the_blocks(fake: FakeComputeEngine,
                                                           tmp_path: Path) -> None:
    """The nightly passes what is left of the night's budget: a node slower to boot than that
    is given up on then (and a stop requested), not after boot_timeout_seconds (10 s here)."""
    fake.add_instance("zone-a", "node", boot_seconds=8)
    node = gce(fake, tmp_path)
    assert node.running() == {}  # the clients and their token first: not part of the boot
    began = time.monotonic()
    with pytest.raises(NodeBootTimeout, match=r"not RUNNING after [12] s .*the night's budget "
                       "left no more time for the boot"):
        node.start(timeout_seconds=2)
    assert 2 <= time.monotonic() - began < 5
    assert len(fake.seen("stop", "zone-a", "node")) == 1  # the stop was requested
    with pytest.raises(NodeBootTimeout, match="no time left to boot node"):
        node.start(timeout_seconds=0)
    assert len(fake.seen("start")) == 1  # nothing started without time
