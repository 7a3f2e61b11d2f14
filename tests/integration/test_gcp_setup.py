"""`slm-nightly gcp setup / check / teardown` on an empty project, through Google's client
libraries against the wire fakes of tests/support/gcp_world.py: what setup makes, that a
second setup only reads, that a drift is repaired exactly, that a missing permission stops it
naming the permission, and the findings of issue 38 it answers (NAT, the bucket's
storage.buckets.get, the APIs before the quota)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.gcp.code import Checkout
from tasks.gcp.reconcile import GcpError
from tasks.gcp.setup import ApplyOptions, apply
from tests.support.gcp_world import BUCKET, PROJECT, World, empty_project, gcp_profile, spec_of
from tests.support.paths import ROOT

ORCH = f"slm-orchestrator@{PROJECT}.iam.gserviceaccount.com"
NODE = f"slm-node@{PROJECT}.iam.gserviceaccount.com"
KEY = b"pnu_not-a-real-prefect-key"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with empty_project(tmp_path) as w:
        yield w


def setup(world: World, mode: str = "setup", member: str | None = None, **kw: object):
    spec = spec_of(gcp_profile(world.tmp / "p.toml"))
    said: list[str] = []
    kw.setdefault("values", {"prefect-api-key": KEY})
    result = apply(spec, world.clients(member), mode, state_dir=world.tmp / "state",  # type: ignore[arg-type]
                   options=ApplyOptions(**kw), say=said.append)  # type: ignore[arg-type]
    return result, said


def states(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {o.resource: o.state for o in result.outcomes}


EVERYTHING = ["apis 8 services", f"service account {ORCH}", f"service account {NODE}",
              "network slm-net", "subnet slm-subnet", "router+nat slm-router",
              "firewall slm-allow-iap-ssh", "firewall slm-allow-iap-prefect",
              "firewall slm-allow-prefect", "firewall slm-allow-engine", "inbound other rules on slm-net",
              "address slm-orchestrator-ip", f"grants projects/{PROJECT}", f"grants {NODE}",
              f"bucket {BUCKET}", f"grants gs://{BUCKET}", "secret slm-prefect-auth",
              "grants secret slm-prefect-auth", "secret prefect-api-key",
              "grants secret prefect-api-key"]


def test_a_bucket_name_another_project_holds_is_named_as_such(world: World) -> None:
    """Bucket names are global: GCS answers a 403 for another project's bucket, not a 404, and
    setup says to pick another name instead of asking for an owner's credentials it has."""
    status, _, _ = world.storage.forward(
        "POST", "/storage/v1/b?project=someone-else", json.dumps({"name": BUCKET}).encode(),
        {"Content-Type": "application/json"})
    assert status == 200
    world.gcp.adopt(f"projects/_/buckets/{BUCKET}", "projects/someone-else")
    with pytest.raises(GcpError) as e:
        setup(world)
    assert f"gs://{BUCKET} most likely belongs to another project; set another [gcp] bucket" \
        in str(e.value)
    assert "storage.buckets.get" in str(e.value)  # GCS's own 403 kept before the fix


def test_setup_makes_the_project_and_a_second_setup_only_reads(world: World) -> None:
    result, said = setup(world)
    assert list(states(result)) == EVERYTHING
    assert states(result) == {
        **{r: "created" for r in EVERYTHING},
        "apis 8 services": "repaired", "inbound other rules on slm-net": "ok",
        f"grants projects/{PROJECT}": "repaired", f"grants {NODE}": "repaired",
        f"grants gs://{BUCKET}": "repaired", "grants secret prefect-api-key": "repaired",
        "grants secret slm-prefect-auth": "repaired"}
    gcp = world.gcp
    # the grants, exactly (tasks/gcp/grants.py), read from the fakes' policies
    def bound(resource: str) -> dict[str, set[str]]:
        return {r: m for r, m in gcp.policies[resource].bindings.items() if m}

    assert bound(f"projects/{PROJECT}") == {
        "roles/owner": {gcp.owner},
        "roles/compute.viewer": {f"serviceAccount:{ORCH}"},  # start/stop: on each node only
        "roles/logging.logWriter": {f"serviceAccount:{ORCH}", f"serviceAccount:{NODE}"}}
    assert bound(f"projects/{PROJECT}/serviceAccounts/{NODE}") == {
        "roles/iam.serviceAccountUser": {f"serviceAccount:{ORCH}"}}
    both = {f"serviceAccount:{ORCH}", f"serviceAccount:{NODE}"}
    # a new bucket's own policy (the project's convenience members), plus the two accounts
    p = PROJECT
    assert bound(f"projects/_/buckets/{BUCKET}") == {
        "roles/storage.legacyBucketOwner": {f"projectOwner:{p}", f"projectEditor:{p}"},
        "roles/storage.legacyObjectOwner": {f"projectOwner:{p}", f"projectEditor:{p}"},
        "roles/storage.legacyObjectReader": {f"projectViewer:{p}"},
        "roles/storage.objectAdmin": {f"serviceAccount:{ORCH}"},
        "roles/storage.objectViewer": {f"serviceAccount:{NODE}"},
        "roles/storage.legacyBucketReader": {f"projectViewer:{p}", *both}}
    at = f"projects/_/buckets/{BUCKET}/objects/"
    assert gcp.policies[f"projects/_/buckets/{BUCKET}"].conditional == [{
        "role": "roles/storage.objectAdmin", "members": [f"serviceAccount:{NODE}"],
        "condition": {"title": "slm-node-results", "description": "the objects a node run writes",
                      "expression": f'resource.name.startsWith("{at}artifacts/adapters/") || '
                                    f'resource.name.startsWith("{at}artifacts/checkpoints/") || '
                                    f'resource.name.startsWith("{at}artifacts/promoted/") || '
                                    f'resource.name == "{at}records/node-environment.json"'}},
        {"role": "roles/storage.objectCreator", "members": [f"serviceAccount:{NODE}"],
         "condition": {"title": "slm-node-weights", "description": "the weights an image build "
                       "converted, created once",
                       "expression": f'resource.name.startsWith("{at}weights/")'}}]
    assert bound(f"projects/{PROJECT}/secrets/prefect-api-key") == {
        "roles/secretmanager.secretAccessor": {f"serviceAccount:{NODE}"},
        "roles/secretmanager.viewer": {f"serviceAccount:{ORCH}"}}
    assert bound(f"projects/{PROJECT}/secrets/slm-prefect-auth") == {
        "roles/secretmanager.secretAccessor": both,
        "roles/secretmanager.viewer": {f"serviceAccount:{ORCH}"}}
    assert world.secrets.payload("prefect-api-key") == KEY
    auth = world.secrets.payload("slm-prefect-auth").decode()
    assert re.fullmatch(r"slm:[A-Za-z0-9_-]{43}", auth)  # user:32 random bytes, base64url
    assert KEY.decode() not in "\n".join(said) and auth not in "\n".join(said)
    # the GPU quota of a new project is 0 project-wide: the request is written, not filed
    assert [(q.quota_id, q.have, q.short) for q in result.quotas] == [
        ("GPUS-ALL-REGIONS-per-project", 0.0, True),
        ("PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", 1.0, False),
        ("NVIDIA-L4-GPUS-per-project-region", 1.0, False)]
    assert result.quota_request == world.tmp / "state" / "gcp-quota-request.json"

    before = len(gcp.calls)
    again, _ = setup(world)
    assert set(states(again).values()) == {"ok"}
    assert gcp.mutations(before) == []


def test_a_drift_is_repaired_and_nothing_else_is_touched(world: World) -> None:
    setup(world)
    owner = world.clients()
    from google.cloud import compute_v1

    subnets = owner.compute("SubnetworksClient")
    subnets.set_private_ip_google_access_unary(
        project=PROJECT, region="us-central1", subnetwork="slm-subnet",
        subnetworks_set_private_ip_google_access_request_resource=(
            compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(
                private_ip_google_access=False)))
    owner.compute("FirewallsClient").delete_unary(project=PROJECT, firewall="slm-allow-engine")
    world.gcp.revoke(f"serviceAccount:{NODE}", "roles/storage.legacyBucketReader",
                     f"projects/_/buckets/{BUCKET}")
    import time
    time.sleep(0.3)  # the fakes' operations finish

    check, said = setup(world, "check")
    assert {r: s for r, s in states(check).items() if s != "ok"} == {
        "subnet slm-subnet": "drifted", "firewall slm-allow-engine": "missing",
        f"grants gs://{BUCKET}": "drifted"}
    assert f"  drifted       grants gs://{BUCKET} — {NODE} lacks " \
           "roles/storage.legacyBucketReader" in said

    before = len(world.gcp.calls)
    fixed, _ = setup(world)
    assert {r: s for r, s in states(fixed).items() if s != "ok"} == {
        "subnet slm-subnet": "repaired", "firewall slm-allow-engine": "created",
        f"grants gs://{BUCKET}": "repaired"}
    assert [(c["api"], c["method"], c["path"].split("?")[0]) for c in
            world.gcp.mutations(before)] == [
        ("compute", "POST", f"/compute/v1/projects/{PROJECT}/regions/us-central1/subnetworks/"
                            "slm-subnet/setPrivateIpGoogleAccess"),
        ("compute", "POST", f"/compute/v1/projects/{PROJECT}/global/firewalls"),
        ("storage", "PUT", f"/storage/v1/b/{BUCKET}/iam")]


def test_dry_run_on_an_empty_project_changes_nothing_and_says_each_call(world: World) -> None:
    result, said = setup(world, "dry-run")
    assert world.gcp.mutations() == []
    assert said[0] == "  would repair  apis 8 services — disabled: compute.googleapis.com, " \
                      "iam.googleapis.com, secretmanager.googleapis.com, iap.googleapis.com, " \
                      "cloudquotas.googleapis.com"
    # finding 6: the quota cannot be read before setup enables Cloud Quotas
    assert said[-1] == ("  unknown       GPU quota — its API is not enabled yet (setup enables "
                        "it, then reads the quota)")
    assert said[1] == (f"  would create  service account {ORCH} — its API is not enabled yet")
    assert "  would create  network slm-net — its API is not enabled yet" in said
    # once the APIs are on, the dry run says which call each step makes
    world.gcp.enabled |= {"compute.googleapis.com", "iam.googleapis.com"}
    _, said = setup(world, "dry-run")
    assert "  would create  network slm-net — networks.insert (custom mode: no subnets of its " \
           "own)" in said
    assert "  would create  firewall slm-allow-engine — firewalls.insert tcp:9080 from " \
           f"{ORCH} to {NODE} (the orchestrator reaches the node's engine)" in said
    assert world.gcp.mutations() == []
    assert not result.quotas


def test_a_caller_without_the_permission_is_stopped_naming_it(world: World) -> None:
    with pytest.raises(GcpError) as e:
        setup(world, member="user:intern@example.com")
    assert "serviceusage.services.get" in str(e.value)
    assert world.gcp.mutations() == []


def test_without_billing_setup_stops_at_the_apis_and_says_to_link_it(world: World) -> None:
    world.gcp.billing_enabled = False
    with pytest.raises(GcpError) as e:
        setup(world)
    assert "Billing" in str(e.value)
    assert f"gcloud billing projects link {PROJECT} --billing-account=" in str(e.value)


def test_teardown_removes_what_setup_made_and_keeps_the_bucket_unless_named(
        world: World) -> None:
    setup(world)
    down, _ = setup(world, "teardown")
    assert states(down)[f"bucket {BUCKET}"] == "kept"
    assert [r for r, s in states(down).items() if s == "deleted"] == [
        "secret prefect-api-key", "secret slm-prefect-auth", "address slm-orchestrator-ip",
        "firewall slm-allow-engine", "firewall slm-allow-prefect", "firewall slm-allow-iap-prefect",
        "firewall slm-allow-iap-ssh",
        "router+nat slm-router",
        "subnet slm-subnet", "network slm-net", f"service account {NODE}",
        f"service account {ORCH}"]
    check, _ = setup(world, "check")
    assert states(check)[f"bucket {BUCKET}"] == "ok"
    with pytest.raises(GcpError, match="teardown deletes a bucket only when named exactly"):
        setup(world, "teardown", delete_bucket="another-bucket")
    gone, _ = setup(world, "teardown", delete_bucket=BUCKET)
    assert states(gone)[f"bucket {BUCKET}"] == "deleted"


def test_the_command_line_reads_the_profile_and_secrets_from_stdin(world: World) -> None:
    """`slm-nightly gcp setup` as an operator types it: application-default credentials (a key
    of an owner account here), the value piped in, then `gcp check` exits 0."""
    profile = gcp_profile(world.tmp / "op.toml")
    admin = f"admin@{PROJECT}.iam.gserviceaccount.com"
    world.iam.seed("admin")  # an account of the project, allowed in its policy
    world.gcp.grant(f"serviceAccount:{admin}", "roles/owner")
    env = {**os.environ, **world.env(admin)}
    cli = [sys.executable, "-m", "flows.cli", "gcp"]
    done = subprocess.run([*cli, "setup", "--profile", str(profile), "--secret-stdin",
                           "prefect-api-key"], input=KEY, capture_output=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert KEY not in done.stdout + done.stderr
    assert world.secrets.payload("prefect-api-key") == KEY
    check = subprocess.run([*cli, "check", "--profile", str(profile)], capture_output=True,
                           env=env, cwd=ROOT, timeout=120, text=True)
    # the GPU quota is still short: check exits 1 and says so
    assert check.returncode == 1, check.stderr
    assert check.stdout.splitlines()[-1] == (
        "0 missing or drifted, GPU quota short — `slm-nightly gcp setup` repairs the rest")


def test_orchestrator_vm_runs_as_its_account_on_the_static_address(world: World) -> None:
    """`gcp orchestrator` after setup: Debian 12 from debian-cloud's family, the orchestrator's
    account (the operator acts as it: actAs, which owner holds), no external address, the
    address setup reserved, the install script as its startup-script."""
    from tasks.gcp import orchestrator
    from tasks.gcp.reconcile import run

    world.compute.network.add_image("debian-12-bookworm-v20261201", "debian-12",
                                    project="debian-cloud")
    setup(world)
    spec = spec_of(gcp_profile(world.tmp / "p.toml"))
    text = orchestrator.script(spec, Checkout(spec.bucket, ("Makefile",), b"v1"))
    vm = orchestrator.OrchestratorVm(spec, world.clients(), text)
    assert [o.state for o in run([vm], "setup", lambda _: None)] == ["created"]
    inst = world.clients().compute("InstancesClient").get(
        project=PROJECT, zone="us-central1-a", instance="slm-orchestrator")
    address = world.clients().compute("AddressesClient").get(
        project=PROJECT, region="us-central1", address="slm-orchestrator-ip").address
    nic = inst.network_interfaces[0]
    assert (nic.network_i_p, list(nic.access_configs)) == (address, [])
    assert nic.subnetwork.endswith(f"projects/{PROJECT}/regions/us-central1/subnetworks/"
                                   "slm-subnet")
    assert [a.email for a in inst.service_accounts] == [ORCH]
    assert {i.key: i.value for i in inst.metadata.items} == {"startup-script": text}
    before = len(world.gcp.calls)
    assert [o.state for o in run([vm], "setup", lambda _: None)] == ["ok"]
    assert world.gcp.mutations(before) == []
    # another checkout (an upgrade): its script replaces the old one in the VM's metadata,
    # the other items kept (setMetadata replaces them all: gcloud compute ssh's keys)
    world.compute.instances[("us-central1-a", "slm-orchestrator")].metadata["ssh-keys"] = "k"
    newer = orchestrator.script(spec, Checkout(spec.bucket, ("Makefile",), b"v2"))
    said: list[str] = []
    run([orchestrator.OrchestratorVm(spec, world.clients(), newer)], "setup", said.append)
    assert said == [f"  repaired      vm slm-orchestrator — {orchestrator.STALE_SCRIPT}"]
    inst = world.clients().compute("InstancesClient").get(
        project=PROJECT, zone="us-central1-a", instance="slm-orchestrator")
    assert {i.key: i.value for i in inst.metadata.items} == {"startup-script": newer,
                                                             "ssh-keys": "k"}


def test_the_node_reads_the_bucket_and_writes_only_its_own_results(world: World) -> None:
    """Finding 2: prefect-gcp's GcsBucket calls get_bucket() before each read and write; the
    node's account passes with what setup granted, and fails naming storage.buckets.get
    without roles/storage.legacyBucketReader. Finding 6 of issue 50: the node reads the code and
    the datasets, writes its adapters, checkpoints and environment record, and cannot rewrite
    the code later nights run, the datasets or the run records (on the old grants the node
    wrote code/ as freely as the orchestrator)."""
    from google.api_core.exceptions import Forbidden
    from prefect_gcp import GcpCredentials, GcsBucket

    setup(world)

    def as_(email: str) -> GcsBucket:
        info = json.loads(world.key_file(email).read_text())
        return GcsBucket(bucket=BUCKET, gcp_credentials=GcpCredentials(
            service_account_info=info, project=PROJECT))

    orchestrator, node = as_(ORCH), as_(NODE)
    orchestrator.write_path("code/v1/flows/train.py", b"print('train')\n")
    orchestrator.write_path("datasets/engineering/d.parquet", b"PAR1")
    assert node.read_path("code/v1/flows/train.py") == b"print('train')\n"
    assert node.read_path("datasets/engineering/d.parquet") == b"PAR1"
    node.write_path("artifacts/adapters/eng-1/manifest.json", b"{}")
    node.write_path("artifacts/checkpoints/abc/checkpoint-5/trainer_state.json", b"{}")
    node.write_path("artifacts/promoted/engineering.json", b"{}")
    node.write_path("records/node-environment.json", b"{}")
    node.write_path("artifacts/adapters/eng-1/manifest.json", b'{"state": "done"}')  # overwrite
    for key in ("code/v1/flows/train.py", "code/v2/flows/train.py",
                "datasets/engineering/d.parquet", "records/runs/last-run.json",
                "artifacts/graph-snapshots/s.tar", "artifacts/adapters-x/a",
                "records/node-environment.json.bak"):
        with pytest.raises(Forbidden, match="storage.objects.create"):
            node.write_path(key, b"rewritten")
    assert node.read_path("code/v1/flows/train.py") == b"print('train')\n"
    world.gcp.revoke(f"serviceAccount:{NODE}", "roles/storage.legacyBucketReader",
                     f"projects/_/buckets/{BUCKET}")
    with pytest.raises(Exception, match="storage.buckets.get"):
        node.read_path("datasets/engineering/d.parquet")


def test_each_call_the_code_makes_is_allowed_by_exactly_the_grant_setup_made(
        world: World) -> None:
    """tasks/gcp/grants.py CALLS against the fakes' IAM after setup (role contents from Google's
    roles reference, tests/fakes/gcp_project.py ROLES): each permission is allowed on the
    resource the code uses it on, and revoking the one role listed for it denies it."""
    from tasks.gcp.grants import CALLS
    from tasks.gcp.nodes import node_vms
    from tasks.gcp.reconcile import run

    setup(world)
    world.compute.network.add_image("slm-node-20261203", "slm-node", disk_size_gb=120)
    run(node_vms(spec_of(gcp_profile(world.tmp / "p.toml")), world.clients()), "setup",
        lambda _: None)
    instance = f"projects/{PROJECT}/zones/us-central1-a/instances/slm-node"
    resource = {"project": f"projects/{PROJECT}", "instance": instance,
                "bucket": f"projects/_/buckets/{BUCKET}/objects/datasets/x.jsonl",
                "node-results": f"projects/_/buckets/{BUCKET}/objects/artifacts/adapters/a/x",
                "node-weights": f"projects/_/buckets/{BUCKET}/objects/weights/0123/a.gguf",
                "node-account": f"projects/{PROJECT}/serviceAccounts/{NODE}",
                "secrets": f"projects/{PROJECT}/secrets/prefect-api-key",
                "auth-secret": f"projects/{PROJECT}/secrets/slm-prefect-auth"}
    granted_on = {"project": f"projects/{PROJECT}", "instance": instance,
                  "bucket": f"projects/_/buckets/{BUCKET}",
                  "node-results": f"projects/_/buckets/{BUCKET}",
                  "node-weights": f"projects/_/buckets/{BUCKET}",
                  "node-account": resource["node-account"], "secrets": resource["secrets"],
                  "auth-secret": resource["auth-secret"]}
    gcp = world.gcp
    for who, call, permission, role, where in CALLS:
        member = f"serviceAccount:{ORCH if who == 'orchestrator' else NODE}"
        assert gcp.allowed(member, permission, resource[where]), (who, call)
        if where in ("node-results", "node-weights"):  # conditional: set aside, put back
            policy = gcp.policies[granted_on[where]]
            kept, policy.conditional = policy.conditional, []
            assert not gcp.allowed(member, permission, resource[where]), (who, call, role)
            policy.conditional = kept
        else:
            gcp.revoke(member, role, granted_on[where])
            assert not gcp.allowed(member, permission, resource[where]), (who, call, role)
            gcp.grant(member, role, granted_on[where])
    # the node creates weights and cannot overwrite or delete them (a later build takes them)
    assert not gcp.allowed(f"serviceAccount:{NODE}", "storage.objects.delete",
                           resource["node-weights"])
    # the node can touch no instance: none of the orchestrator's compute permissions
    for permission in ("compute.instances.start", "compute.instances.setMetadata"):
        assert not gcp.allowed(f"serviceAccount:{NODE}", permission,
                               f"projects/{PROJECT}/zones/us-central1-a/instances/slm-node")


def test_nodes_come_from_the_newest_image_of_the_family_stopped(world: World) -> None:
    """`gcp nodes`: one instance per zone from the family's newest image, its disk the image's
    size, the node's account, no external address, spot with STOP; stopped once created; a
    second run only reads."""
    import time

    from tasks.gcp.nodes import node_vms
    from tasks.gcp.reconcile import run

    net = world.compute.network
    net.add_image("slm-node-20261201", "slm-node", disk_size_gb=150, created=time.time() - 60)
    net.add_image("slm-node-20261203", "slm-node", disk_size_gb=120)
    setup(world)
    spec = spec_of(gcp_profile(world.tmp / "p.toml"))
    out = run(node_vms(spec, world.clients()), "setup", lambda _: None)
    assert [(o.resource, o.state) for o in out] == [
        ("node us-central1-a/slm-node", "created"), ("node us-central1-b/slm-node", "created")]
    vms = world.clients().compute("InstancesClient")
    for zone in ("us-central1-a", "us-central1-b"):
        vm = vms.get(project=PROJECT, zone=zone, instance="slm-node")
        assert vm.status == "TERMINATED"
        assert [a.email for a in vm.service_accounts] == [NODE]
        assert list(vm.network_interfaces[0].access_configs) == []
        assert (vm.scheduling.provisioning_model, vm.scheduling.instance_termination_action,
                vm.scheduling.on_host_maintenance) == ("SPOT", "STOP", "TERMINATE")
        assert {i.key: i.value for i in vm.metadata.items} == {
            "enable-guest-attributes": "TRUE"}
        disk = world.compute.network.disks[(zone, "slm-node")]
        assert (int(disk["sizeGb"]), disk["image"], disk["type"]) == (
            120, "slm-node-20261203", "pd-balanced")
        # the orchestrator's compute role, on this instance's own policy
        assert world.gcp.policies[f"projects/{PROJECT}/zones/{zone}/instances/slm-node"
                                  ].bindings == {
            "roles/compute.instanceAdmin.v1": {f"serviceAccount:{ORCH}"}}
    before = len(world.gcp.calls)
    assert {o.state for o in run(node_vms(spec, world.clients()), "setup", lambda _: None)} \
        == {"ok"}
    assert world.gcp.mutations(before) == []


def test_the_orchestrator_starts_and_stops_the_nodes_and_no_other_instance(
        world: World) -> None:
    """Finding 6 of issue 50: the node holds the Prefect API's auth string, so it can have the
    orchestrator's worker run anything as the orchestrator's account. That account's compute
    role is on each node instance, not the project: it stops a node, and is refused, naming the
    permission, on another instance of the project; a node whose grant was removed is drifted
    and `gcp nodes` puts the grant back, keeping what else the instance's policy holds."""
    from google.api_core.exceptions import Forbidden

    from tasks.gcp.nodes import node_vms
    from tasks.gcp.reconcile import run

    world.compute.network.add_image("slm-node-20261203", "slm-node", disk_size_gb=120)
    setup(world)
    spec = spec_of(gcp_profile(world.tmp / "p.toml"))
    run(node_vms(spec, world.clients()), "setup", lambda _: None)
    world.compute.add_instance("us-central1-a", "billing-db", status="RUNNING",
                               service_account=None)
    vms = world.clients(f"serviceAccount:{ORCH}").compute("InstancesClient")
    vms.start_unary(project=PROJECT, zone="us-central1-b", instance="slm-node")
    with pytest.raises(Forbidden, match="compute.instances.stop"):
        vms.stop_unary(project=PROJECT, zone="us-central1-a", instance="billing-db")
    assert world.compute.instances[("us-central1-a", "billing-db")].status == "RUNNING"
    # the grant gone (an operator's edit): check says so, setup puts it back beside the other
    where = f"projects/{PROJECT}/zones/us-central1-a/instances/slm-node"
    world.gcp.revoke(f"serviceAccount:{ORCH}", "roles/compute.instanceAdmin.v1", where)
    world.gcp.grant("user:oncall@example.com", "roles/compute.instanceAdmin.v1", where)
    drifted = {o.resource: (o.state, o.detail) for o in run(
        node_vms(spec, world.clients()), "check", lambda _: None)}
    assert drifted["node us-central1-a/slm-node"] == (
        "drifted", "the orchestrator lacks roles/compute.instanceAdmin.v1 on it")
    assert drifted["node us-central1-b/slm-node"][0] == "ok"
    out = run(node_vms(spec, world.clients()), "setup", lambda _: None)
    assert [o.state for o in out] == ["repaired", "ok"]
    assert world.gcp.policies[where].bindings == {"roles/compute.instanceAdmin.v1": {
        "user:oncall@example.com", f"serviceAccount:{ORCH}"}}


def test_upgrade_moves_stopped_nodes_to_the_newest_image_and_leaves_running_ones(
        world: World) -> None:
    """`gcp upgrade`: a new image in the family; the stopped node is made anew from it (its
    disk's sourceImage says so), the running one is refused naming why; a second run after the
    second one stopped finishes it, a third only reads."""
    import time

    from tasks.gcp.nodes import node_images, node_vms
    from tasks.gcp.reconcile import run

    net = world.compute.network
    net.add_image("slm-node-v1", "slm-node", disk_size_gb=100, created=time.time() - 60)
    setup(world)
    spec = spec_of(gcp_profile(world.tmp / "p.toml"))
    run(node_vms(spec, world.clients()), "setup", lambda _: None)
    net.add_image("slm-node-v2", "slm-node", disk_size_gb=110)
    vms = world.clients().compute("InstancesClient")
    vms.start_unary(project=PROJECT, zone="us-central1-b", instance="slm-node")
    time.sleep(0.5)  # it boots (the fake's boot takes a fraction of a second)
    said: list[str] = []
    with pytest.raises(GcpError, match=r"us-central1-b/slm-node: RUNNING, in use"):
        run(node_images(spec, world.clients()), "setup", said.append)
    assert said == ["  repaired      node us-central1-a/slm-node — image slm-node-v1, "
                    "newest slm-node-v2"]
    disk = world.compute.network.disks[("us-central1-a", "slm-node")]
    assert (disk["image"], int(disk["sizeGb"])) == ("slm-node-v2", 110)
    assert vms.get(project=PROJECT, zone="us-central1-a", instance="slm-node").status == \
        "TERMINATED"
    vms.stop_unary(project=PROJECT, zone="us-central1-b", instance="slm-node")
    time.sleep(0.5)
    out = run(node_images(spec, world.clients()), "setup", lambda _: None)
    assert [o.state for o in out] == ["ok", "repaired"]
    before = len(world.gcp.calls)
    assert [o.state for o in run(node_images(spec, world.clients()), "check",
                                 lambda _: None)] == ["ok", "ok"]
    assert world.gcp.mutations(before) == []


def test_a_new_projects_first_setup_waits_for_the_apis_it_just_enabled(world: World) -> None:
    """Finding 9 of issue 50: right after batchEnable, IAM and Compute still answer
    SERVICE_DISABLED for a while (here 3 s); setup reads and writes again until they serve, and
    ends as a setup without the delay does."""
    world.gcp.propagation_seconds = 3.0
    result, _ = setup(world)
    assert list(states(result)) == EVERYTHING
    assert states(result)[f"service account {ORCH}"] == "created"
    refused = [c for c in world.gcp.calls if c.get("status") == 403]
    assert refused, "no call met the propagation: the test proves nothing"


def test_a_project_that_uses_iam_conditions_keeps_them_through_setup(world: World) -> None:
    """Finding 12 of issue 50: the project's policy holds a conditional binding; setup reads it
    at version 3 and writes it back whole (read at version 1, its role comes back mangled and
    the write is refused)."""
    cond = {"role": "roles/storage.objectViewer", "members": ["user:auditor@example.com"],
            "condition": {"title": "until 2027",
                          "expression": "request.time < timestamp('2027-01-01T00:00:00Z')"}}
    world.gcp.policies[f"projects/{PROJECT}"].conditional = [cond]
    result, _ = setup(world)
    assert states(result)[f"grants projects/{PROJECT}"] == "repaired"
    policy = world.gcp.policies[f"projects/{PROJECT}"]
    assert policy.conditional == [cond]
    assert policy.bindings["roles/compute.viewer"] == {f"serviceAccount:{ORCH}"}


def test_nodes_fall_back_to_on_demand_and_skip_a_zone_out_of_l4s(world: World) -> None:
    """Finding 10 of issue 50: zone b has no spot L4 (on_demand_fallback: made on-demand); zone
    a has none at all (skipped, naming why); a later run, once zone a has L4s again, makes it."""
    from tasks.gcp.nodes import node_vms
    from tasks.gcp.reconcile import run

    world.compute.network.add_image("slm-node-20261203", "slm-node", disk_size_gb=120)
    setup(world)
    spec = spec_of(gcp_profile(world.tmp / "p.toml")).model_copy(
        update={"on_demand_fallback": True})
    world.compute.stock_out("us-central1-a", "SPOT", "STANDARD")
    world.compute.stock_out("us-central1-b", "SPOT")
    out = run(node_vms(spec, world.clients()), "setup", lambda _: None)
    assert [(o.resource, o.state) for o in out] == [
        ("node us-central1-a/slm-node", "skipped"), ("node us-central1-b/slm-node", "created")]
    assert out[0].detail == (
        "no L4 in us-central1-a for spot or on-demand (ZONE_RESOURCE_POOL_EXHAUSTED): run `gcp "
        "nodes` again later, or leave the zone out of [compute] fallback_zones")
    vms = world.clients().compute("InstancesClient")
    b = vms.get(project=PROJECT, zone="us-central1-b", instance="slm-node")
    assert (b.status, b.scheduling.provisioning_model) == ("TERMINATED", "STANDARD")
    assert ("us-central1-a", "slm-node") not in world.compute.instances
    world.compute.restock("us-central1-a")
    again = run(node_vms(spec, world.clients()), "setup", lambda _: None)
    assert [o.state for o in again] == ["created", "ok"]
    a = vms.get(project=PROJECT, zone="us-central1-a", instance="slm-node")
    assert a.scheduling.provisioning_model == "SPOT"


def test_the_preflight_reads_each_node_secret_with_the_grants_setup_made(world: World) -> None:
    """The walk after issue 50: preflight reads the metadata of every secret the node's boot
    reads (projects.secrets.versions.get), the auth string `slm-prefect-auth` of
    profiles/gcp.toml among them; with only secretAccessor on that one (versions.access, no
    versions.get) the orchestrator was refused with 403 and preflight could never pass."""
    from blocks.gce import GceCompute
    from tasks.preflight.google import node_secret_checks

    setup(world)
    block = GceCompute.model_validate({
        "project": PROJECT, "zone": "us-central1-a", "instance": "slm-node",
        "secret_manager_endpoint": world.secrets.url,
        "node": {"prefect_api_key_secret": "prefect-api-key",
                 "prefect_auth_string_secret": "slm-prefect-auth"}})
    creds = world.clients(f"serviceAccount:{ORCH}").credentials
    got = {c.name: (c.status, c.detail) for c in node_secret_checks(block, creds)}
    assert got == {
        "secret prefect-api-key": ("ok", "version 1 ENABLED (the node's access is not checked)"),
        "secret slm-prefect-auth": ("ok", "version 1 ENABLED (the node's access is not checked)")}
