"""The Compute networking fake (tests/fakes/compute_network*.py inside FakeComputeEngine),
driven by the real google-cloud-compute REST clients: exact records, the global/region/zone
operations waited with the operations clients, and the failure modes (401, SERVICE_DISABLED,
403 naming the permission, 400 validation, 404, 409, deferred operation errors)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1
from google.oauth2.credentials import Credentials

from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.gcp_project import ROLES, FakeProject

P = "test-project"
REGION, ZONE = "us-central1", "us-central1-a"
OWNER = "user:operator@example.com"
SETUP = "serviceAccount:setup@test-project.iam.gserviceaccount.com"
NODE_SA = "slm-node@test-project.iam.gserviceaccount.com"
VPC = f"projects/{P}/global/networks/slm-vpc"
SUBNET = f"projects/{P}/regions/{REGION}/subnetworks/slm-subnet"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124"


@pytest.fixture
def gcp() -> FakeProject:
    project = FakeProject()
    project.enabled.add("compute.googleapis.com")
    return project


@pytest.fixture
def fake(gcp: FakeProject) -> Iterator[FakeComputeEngine]:
    # operations take 0.2 + 0.2 s: a read before `wait` sees them unfinished
    with FakeComputeEngine(P, op_pending_seconds=0.2, gcp=gcp) as f:
        yield f


def said(e: pytest.ExceptionInfo[Any]) -> str:
    """The API's message (google-api-core prefixes "METHOD URL: ")."""
    return str(e.value.message).split(": ", 1)[-1]


def client(fake: FakeComputeEngine, gcp: FakeProject, name: str, member: str = OWNER) -> Any:
    return getattr(compute_v1, name)(
        credentials=Credentials(token=gcp.token_for(member)),
        client_options={"api_endpoint": fake.url}, transport="rest")


def wait(fake: FakeComputeEngine, gcp: FakeProject, op: Any, region: str | None = None,
         member: str = OWNER) -> compute_v1.Operation:
    if op.zone:
        ops = client(fake, gcp, "ZoneOperationsClient", member)
        return ops.wait(project=P, zone=op.zone.rsplit("/", 1)[-1], operation=op.name)
    if region:
        ops = client(fake, gcp, "RegionOperationsClient", member)
        return ops.wait(project=P, region=region, operation=op.name)
    return client(fake, gcp, "GlobalOperationsClient", member).wait(project=P,
                                                                     operation=op.name)


def make_vpc(fake: FakeComputeEngine, gcp: FakeProject, member: str = OWNER) -> None:
    nets = client(fake, gcp, "NetworksClient", member)
    op = nets.insert_unary(project=P, network_resource=compute_v1.Network(
        name="slm-vpc", auto_create_subnetworks=False))
    assert wait(fake, gcp, op, member=member).status == compute_v1.Operation.Status.DONE
    subs = client(fake, gcp, "SubnetworksClient", member)
    op = subs.insert_unary(project=P, region=REGION, subnetwork_resource=compute_v1.Subnetwork(
        name="slm-subnet", network=VPC, ip_cidr_range="10.10.0.0/24", region=REGION))
    assert not wait(fake, gcp, op, REGION, member).error.errors


def test_a_project_without_the_compute_api_refuses_every_call(fake: FakeComputeEngine,
                                                              gcp: FakeProject) -> None:
    gcp.enabled.discard("compute.googleapis.com")
    fake.add_instance(ZONE, "node")
    for call in (lambda: client(fake, gcp, "NetworksClient").get(project=P, network="default"),
                 lambda: client(fake, gcp, "InstancesClient").get(project=P, zone=ZONE,
                                                                  instance="node")):
        with pytest.raises(exceptions.Forbidden) as e:
            call()
        assert e.value.reason == "SERVICE_DISABLED"
        assert said(e).startswith("Compute Engine API has not been used in project "
                                          "123456789012 before or it is disabled.")
        assert e.value.errors[0]["reason"] == "accessNotConfigured"
    assert [(c["path"], c["status"], c["mutating"]) for c in gcp.calls] == [
        (f"/compute/v1/projects/{P}/global/networks/default", 403, False),
        (f"/compute/v1/projects/{P}/zones/{ZONE}/instances/node", 403, False)]
    with pytest.raises(urllib.error.HTTPError) as h:  # no credentials at all
        urllib.request.urlopen(f"{fake.url}/compute/v1/projects/{P}/global/networks/default")
    assert (h.value.code, json.loads(h.value.read())["error"]["errors"][0]["reason"]) == (
        401, "required")


def test_a_custom_vpc_is_made_through_operations(fake: FakeComputeEngine,
                                                 gcp: FakeProject) -> None:
    nets = client(fake, gcp, "NetworksClient")
    op = nets.insert_unary(project=P, network_resource=compute_v1.Network(
        name="slm-vpc", auto_create_subnetworks=False))
    assert (op.operation_type, op.status, op.user) == (
        "insert", compute_v1.Operation.Status.PENDING, "operator@example.com")
    assert op.target_link == f"{fake.url}/compute/v1/{VPC}"
    with pytest.raises(exceptions.NotFound) as e:  # not there until the operation is DONE
        nets.get(project=P, network="slm-vpc")
    assert said(e) == f"The resource '{VPC}' was not found"
    with pytest.raises(exceptions.Conflict) as c:  # …but its name is taken
        nets.insert_unary(project=P, network_resource=compute_v1.Network(
            name="slm-vpc", auto_create_subnetworks=False))
    assert said(c) == f"The resource '{VPC}' already exists"
    done = wait(fake, gcp, op)
    assert (done.status, done.progress, done.error.errors) == (
        compute_v1.Operation.Status.DONE, 100, [])
    net = nets.get(project=P, network="slm-vpc")
    assert (net.auto_create_subnetworks, net.self_link) == (False,
                                                            f"{fake.url}/compute/v1/{VPC}")
    assert sorted(n.name for n in nets.list(project=P)) == ["default", "slm-vpc"]
    with pytest.raises(exceptions.BadRequest) as b:
        nets.insert_unary(project=P, network_resource=compute_v1.Network(
            name="Slm_VPC", auto_create_subnetworks=False))
    assert said(b) == ("Invalid value for field 'resource.name': 'Slm_VPC'. Must be a "
                               "match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    with pytest.raises(exceptions.BadRequest) as b:  # unset: a legacy network
        nets.insert_unary(project=P, network_resource=compute_v1.Network(name="legacy"))
    assert "'resource.autoCreateSubnetworks'" in said(b)


def test_subnets_are_validated_like_the_api(fake: FakeComputeEngine, gcp: FakeProject) -> None:
    make_vpc(fake, gcp)
    subs = client(fake, gcp, "SubnetworksClient")
    sub = subs.get(project=P, region=REGION, subnetwork="slm-subnet")
    assert (sub.network, sub.ip_cidr_range, sub.private_ip_google_access,
            sub.gateway_address) == (f"{fake.url}/compute/v1/{VPC}", "10.10.0.0/24", False,
                                     "10.10.0.1")

    def refused(name: str, cidr: str, network: str = VPC) -> str:
        with pytest.raises(exceptions.GoogleAPICallError) as e:
            subs.insert_unary(project=P, region="europe-west1", subnetwork_resource=(
                compute_v1.Subnetwork(name=name, network=network, ip_cidr_range=cidr)))
        return f"{e.value.code} {said(e)}"

    assert refused("b", "10.10.0.128/25") == (
        "400 Invalid value for field 'resource.ipCidrRange': '10.10.0.128/25'. Invalid "
        "IPCidrRange: 10.10.0.128/25 conflicts with existing subnetwork 'slm-subnet' in region "
        f"'{REGION}'.")
    assert refused("b", "10.20.0.0/30").startswith("400 Invalid value for field "
                                                   "'resource.ipCidrRange': '10.20.0.0/30'.")
    assert refused("b", "10.20.0.1/24").startswith("400 Invalid value for field "
                                                   "'resource.ipCidrRange': '10.20.0.1/24'.")
    assert refused("b", "10.130.0.0/20", f"projects/{P}/global/networks/default") == (
        "400 Invalid value for field 'resource.ipCidrRange': '10.130.0.0/20'. Extended "
        "subnetworks in auto subnet mode networks cannot overlap with 10.128.0.0/9.")
    assert refused("b", "10.20.0.0/24", f"projects/{P}/global/networks/nope") == (
        f"404 The resource 'projects/{P}/global/networks/nope' was not found")
    op = subs.set_private_ip_google_access_unary(
        project=P, region=REGION, subnetwork="slm-subnet",
        subnetworks_set_private_ip_google_access_request_resource=(
            compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(
                private_ip_google_access=True)))
    assert subs.get(project=P, region=REGION,
                    subnetwork="slm-subnet").private_ip_google_access is False  # not yet
    assert wait(fake, gcp, op, REGION).operation_type == "setPrivateIpGoogleAccess"
    assert subs.get(project=P, region=REGION,
                    subnetwork="slm-subnet").private_ip_google_access is True


def test_a_router_with_nat_and_its_patch(fake: FakeComputeEngine, gcp: FakeProject) -> None:
    make_vpc(fake, gcp)
    routers = client(fake, gcp, "RoutersClient")
    nat = compute_v1.RouterNat(name="slm-nat", nat_ip_allocate_option="AUTO_ONLY",
                               source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES")
    op = routers.insert_unary(project=P, region=REGION, router_resource=compute_v1.Router(
        name="slm-router", network=VPC, region=REGION, nats=[nat]))
    wait(fake, gcp, op, REGION)
    got = routers.get(project=P, region=REGION, router="slm-router")
    assert (got.network, [(n.name, n.source_subnetwork_ip_ranges_to_nat) for n in got.nats]) == (
        f"{fake.url}/compute/v1/{VPC}", [("slm-nat", "ALL_SUBNETWORKS_ALL_IP_RANGES")])
    listed = compute_v1.RouterNat(
        name="listed", nat_ip_allocate_option="AUTO_ONLY",
        source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
        subnetworks=[compute_v1.RouterNatSubnetworkToNat(
            name=f"projects/{P}/regions/{REGION}/subnetworks/default",
            source_ip_ranges_to_nat=["ALL_IP_RANGES"])])
    with pytest.raises(exceptions.BadRequest) as e:  # default's subnet: another network
        routers.patch_unary(project=P, region=REGION, router="slm-router",
                            router_resource=compute_v1.Router(nats=[listed]))
    assert said(e).startswith("Invalid value for field "
                                      "'resource.nats[0].subnetworks[0].name'")
    listed.subnetworks[0].name = SUBNET
    op = routers.patch_unary(project=P, region=REGION, router="slm-router",
                             router_resource=compute_v1.Router(nats=[listed]))
    with pytest.raises(exceptions.BadRequest) as e:  # one change at a time
        routers.delete_unary(project=P, region=REGION, router="slm-router")
    assert e.value.errors[0]["reason"] == "resourceNotReady"
    wait(fake, gcp, op, REGION)
    got = routers.get(project=P, region=REGION, router="slm-router")
    assert [n.name for n in got.nats] == ["listed"]  # merge patch: the array replaced whole
    assert got.network == f"{fake.url}/compute/v1/{VPC}"  # absent fields kept
    with pytest.raises(exceptions.BadRequest) as e:
        routers.insert_unary(project=P, region=REGION, router_resource=compute_v1.Router(
            name="r2", network=VPC, nats=[compute_v1.RouterNat(
                name="n", source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES")]))
    assert said(e) == ("Invalid value for field 'resource.nats[0].natIpAllocateOption'"
                               ": ''. Must be one of [AUTO_ONLY, MANUAL_ONLY].")


def rule(name: str, **kw: Any) -> compute_v1.Firewall:
    return compute_v1.Firewall(name=name, network=VPC, direction="INGRESS", allowed=[
        compute_v1.Allowed(I_p_protocol="tcp", ports=["4200"])], **kw)


def test_firewalls_validate_combine_and_replace(fake: FakeComputeEngine,
                                                gcp: FakeProject) -> None:
    make_vpc(fake, gcp)
    fws = client(fake, gcp, "FirewallsClient")
    default = {f.name: f for f in fws.list(project=P)}
    assert sorted(default) == ["default-allow-icmp", "default-allow-internal",
                               "default-allow-rdp", "default-allow-ssh"]
    internal = default["default-allow-internal"]
    assert (internal.priority, list(internal.source_ranges),
            [(a.I_p_protocol, list(a.ports)) for a in internal.allowed]) == (
        65534, ["10.128.0.0/9"], [("tcp", ["0-65535"]), ("udp", ["0-65535"]), ("icmp", [])])

    def refused(body: compute_v1.Firewall) -> str:
        with pytest.raises(exceptions.BadRequest) as e:
            fws.insert_unary(project=P, firewall_resource=body)
        return said(e)

    assert refused(rule("x", source_service_accounts=[NODE_SA], target_tags=["t"])) == (
        "Invalid value for field 'resource.sourceServiceAccounts': ''. sourceServiceAccounts "
        "cannot be used at the same time as sourceTags or targetTags.")
    assert refused(rule("x", source_ranges=["10.0.0.0/8"], source_tags=["a"],
                        target_service_accounts=[NODE_SA])) == (
        "Invalid value for field 'resource.targetServiceAccounts': ''. targetServiceAccounts "
        "cannot be used at the same time as targetTags or sourceTags.")
    assert refused(rule("x", source_ranges=["10.0.0.0/8"], priority=70000)).startswith(
        "Invalid value for field 'resource.priority': '70000'.")
    assert refused(rule("x")) == ("Invalid value for field 'resource.sourceRanges': ''. For "
                                  "INGRESS traffic, one of sourceRanges, sourceTags or "
                                  "sourceServiceAccounts is required.")
    assert refused(rule("x", source_ranges=["10.0.0.0/8"],
                        target_service_accounts=["node"])) == (
        "Invalid value for field 'resource.targetServiceAccounts[0]': 'node'. Service accounts "
        "must be valid RFC 822 email addresses.")
    op = fws.insert_unary(project=P, firewall_resource=rule(
        "slm-allow-prefect", source_service_accounts=[NODE_SA],
        target_service_accounts=["orch@test-project.iam.gserviceaccount.com"]))
    wait(fake, gcp, op)
    got = fws.get(project=P, firewall="slm-allow-prefect")
    assert (got.priority, got.direction, got.disabled, got.network) == (
        1000, "INGRESS", False, f"{fake.url}/compute/v1/{VPC}")
    # update (PUT) replaces: the source service account is gone, a range instead
    op = fws.update_unary(project=P, firewall="slm-allow-prefect",
                          firewall_resource=rule("slm-allow-prefect",
                                                 source_ranges=["10.10.0.0/24"]))
    wait(fake, gcp, op)
    got = fws.get(project=P, firewall="slm-allow-prefect")
    assert (list(got.source_ranges), list(got.source_service_accounts)) == (["10.10.0.0/24"],
                                                                            [])
    # patch merges: only `disabled` changes, the ranges stay
    wait(fake, gcp, fws.patch_unary(project=P, firewall="slm-allow-prefect",
                                    firewall_resource=compute_v1.Firewall(disabled=True)))
    got = fws.get(project=P, firewall="slm-allow-prefect")
    assert (got.disabled, list(got.source_ranges)) == (True, ["10.10.0.0/24"])
    # a network with a rule on it: its delete is accepted, its operation fails
    op = client(fake, gcp, "NetworksClient").delete_unary(project=P, network="slm-vpc")
    done = wait(fake, gcp, op)
    assert (done.http_error_status_code, [(e.code, e.message) for e in done.error.errors]) == (
        400, [("RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", f"The network resource '{VPC}' is "
               f"already being used by '{SUBNET}'")])


def test_each_call_needs_its_permission(fake: FakeComputeEngine, gcp: FakeProject,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    nets = client(fake, gcp, "NetworksClient", SETUP)
    with pytest.raises(exceptions.Forbidden) as e:
        nets.insert_unary(project=P, network_resource=compute_v1.Network(
            name="slm-vpc", auto_create_subnetworks=False))
    assert (said(e), e.value.errors[0]["reason"]) == (
        f"Required 'compute.networks.create' permission for 'projects/{P}'", "forbidden")
    gcp.grant(SETUP, "roles/compute.networkAdmin")
    make_vpc(fake, gcp, SETUP)
    fws = client(fake, gcp, "FirewallsClient", SETUP)
    body = rule("slm-allow-engine", source_ranges=["10.10.0.0/24"])
    with pytest.raises(exceptions.Forbidden) as e:  # network admin: not firewall rules
        fws.insert_unary(project=P, firewall_resource=body)
    assert said(e) == ("Required 'compute.firewalls.create' permission for "
                               f"'projects/{P}/global/firewalls/slm-allow-engine'")
    monkeypatch.setitem(ROLES, "roles/test.firewallsOnly", frozenset({
        "compute.firewalls.create"}))
    gcp.grant(SETUP, "roles/test.firewallsOnly")
    with pytest.raises(exceptions.Forbidden) as e:
        fws.insert_unary(project=P, firewall_resource=body)
    assert said(e) == (f"Required 'compute.networks.updatePolicy' permission for '{VPC}'")
    gcp.grant(SETUP, "roles/compute.securityAdmin")
    since = len(gcp.calls)
    wait(fake, gcp, fws.insert_unary(project=P, firewall_resource=body), member=SETUP)
    assert [(c["method"], c["permission"], c["mutating"], c["status"], c["member"])
            for c in gcp.calls[since:]] == [
        ("POST", "compute.firewalls.create", True, 200, SETUP),
        ("POST", "compute.globalOperations.get", False, 200, SETUP)]
    # reads make no mutating call
    since = len(gcp.calls)
    nets.get(project=P, network="slm-vpc")
    list(fws.list(project=P))
    assert gcp.mutations(since) == []


def test_images_resolve_families_and_public_projects(fake: FakeComputeEngine,
                                                     gcp: FakeProject) -> None:
    dl = "deeplearning-platform-release"
    fake.network.add_image("cu124-v1", "common-cu124", 50, created=100.0, project=dl)
    fake.network.add_image("cu124-v2", "common-cu124", 60, created=200.0, project=dl)
    fake.network.add_image("cu124-v3", "common-cu124", 60, created=300.0, project=dl,
                           deprecated="DEPRECATED")
    fake.network.add_image("own", "mine", 20)
    images = client(fake, gcp, "ImagesClient", SETUP)  # no role: public images still read
    got = images.get_from_family(project=dl, family="common-cu124")
    assert (got.name, got.disk_size_gb, got.family) == ("cu124-v2", 60, "common-cu124")
    assert images.get(project=dl, image="cu124-v3").deprecated.state == "DEPRECATED"
    with pytest.raises(exceptions.NotFound):
        images.get_from_family(project=dl, family="nope")
    with pytest.raises(exceptions.Forbidden) as e:
        images.get_from_family(project=P, family="mine")
    assert said(e) == ("Required 'compute.images.getFromFamily' permission for "
                               f"'projects/{P}/global/images/family/mine'")
    gcp.grant(SETUP, "roles/compute.imageUser")
    assert images.get_from_family(project=P, family="mine").name == "own"


def vm(name: str = "slm-node", size: int = 60, **kw: Any) -> compute_v1.Instance:
    fields: dict[str, Any] = dict(
        name=name, machine_type=f"zones/{ZONE}/machineTypes/g2-standard-4",
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True,
                                       initialize_params=compute_v1.AttachedDiskInitializeParams(
                                           source_image=DLVM, disk_size_gb=size,
                                           disk_type=f"zones/{ZONE}/diskTypes/pd-balanced"))],
        network_interfaces=[compute_v1.NetworkInterface(subnetwork=SUBNET)],
        service_accounts=[compute_v1.ServiceAccount(
            email=NODE_SA, scopes=["https://www.googleapis.com/auth/cloud-platform"])],
        tags=compute_v1.Tags(items=["slm-node"]),
        scheduling=compute_v1.Scheduling(provisioning_model="SPOT",
                                         instance_termination_action="STOP"))
    return compute_v1.Instance(**(fields | kw))


def test_an_instance_is_created_and_deleted(fake: FakeComputeEngine, gcp: FakeProject) -> None:
    make_vpc(fake, gcp)
    fake.network.add_image("cu124-v2", "common-cu124", 50,
                           project="deeplearning-platform-release")
    gcp.grant(SETUP, "roles/compute.instanceAdmin.v1")
    vms = client(fake, gcp, "InstancesClient", SETUP)
    with pytest.raises(exceptions.BadRequest) as e:
        vms.insert_unary(project=P, zone=ZONE, instance_resource=vm(size=30))
    assert said(e) == ("Invalid value for field 'resource.disks[0].initializeParams."
                               "diskSizeGb': '30'. Requested disk size cannot be smaller than "
                               "the image size (50 GB)")
    with pytest.raises(exceptions.BadRequest) as e:  # may not act as the node's account
        vms.insert_unary(project=P, zone=ZONE, instance_resource=vm())
    assert said(e) == (
        f"The user does not have access to service account '{NODE_SA}'. User: "
        "'setup@test-project.iam.gserviceaccount.com'. Ask a project owner to grant you the "
        "iam.serviceAccountUser role on the service account")
    gcp.grant(SETUP, "roles/iam.serviceAccountUser", f"projects/{P}/serviceAccounts/{NODE_SA}")
    op = vms.insert_unary(project=P, zone=ZONE, instance_resource=vm())
    assert vms.get(project=P, zone=ZONE, instance="slm-node").status == "PROVISIONING"
    assert wait(fake, gcp, op, member=SETUP).status == compute_v1.Operation.Status.DONE
    got = vms.get(project=P, zone=ZONE, instance="slm-node")
    nic = got.network_interfaces[0]
    assert (got.status, nic.network_i_p, nic.subnetwork, nic.network, list(nic.access_configs),
            got.service_accounts[0].email, list(got.tags.items),
            got.scheduling.provisioning_model, got.guest_accelerators[0].accelerator_count) == (
        "RUNNING", "127.0.0.1", f"{fake.url}/compute/v1/{SUBNET}",
        f"{fake.url}/compute/v1/{VPC}", [], NODE_SA, ["slm-node"], "SPOT", 1)
    assert fake.seen("insert", ZONE, "slm-node")
    with pytest.raises(exceptions.Conflict):
        vms.insert_unary(project=P, zone=ZONE, instance_resource=vm())
    with pytest.raises(exceptions.BadRequest) as e:  # an address outside the subnet
        vms.insert_unary(project=P, zone=ZONE, instance_resource=vm(
            "other", network_interfaces=[compute_v1.NetworkInterface(
                subnetwork=SUBNET, network_i_p="10.99.0.5")]))
    assert said(e).startswith("Invalid value for field "
                                      "'resource.networkInterfaces[0].networkIP': '10.99.0.5'.")
    with pytest.raises(exceptions.BadRequest) as e:  # an L4 cannot live-migrate
        vms.insert_unary(project=P, zone=ZONE, instance_resource=vm(
            "other", scheduling=compute_v1.Scheduling(provisioning_model="STANDARD")))
    assert said(e) == "Instances with guest accelerators do not support live migration."
    # the subnet cannot go while the VM is on it; the VM's delete frees its boot disk
    subs = client(fake, gcp, "SubnetworksClient")
    done = wait(fake, gcp, subs.delete_unary(project=P, region=REGION,
                                             subnetwork="slm-subnet"), REGION)
    assert done.error.errors[0].code == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"
    op = vms.delete_unary(project=P, zone=ZONE, instance="slm-node")
    assert vms.get(project=P, zone=ZONE, instance="slm-node").status == "STOPPING"
    wait(fake, gcp, op, member=SETUP)
    with pytest.raises(exceptions.NotFound):
        vms.get(project=P, zone=ZONE, instance="slm-node")
    assert fake.network.disks == {}


def test_an_internal_address_comes_from_its_subnet(fake: FakeComputeEngine,
                                                   gcp: FakeProject) -> None:
    make_vpc(fake, gcp)
    addrs = client(fake, gcp, "AddressesClient")
    op = addrs.insert_unary(project=P, region=REGION, address_resource=compute_v1.Address(
        name="slm-orchestrator", address_type="INTERNAL", subnetwork=SUBNET, region=REGION))
    wait(fake, gcp, op, REGION)
    got = addrs.get(project=P, region=REGION, address="slm-orchestrator")
    assert (got.address, got.status, got.subnetwork, got.purpose) == (
        "10.10.0.2", "RESERVED", f"{fake.url}/compute/v1/{SUBNET}", "GCE_ENDPOINT")
    with pytest.raises(exceptions.BadRequest) as e:
        addrs.insert_unary(project=P, region=REGION, address_resource=compute_v1.Address(
            name="outside", address_type="INTERNAL", subnetwork=SUBNET, address="10.11.0.9"))
    assert said(e).startswith("Invalid value for field 'resource.address': "
                                      "'10.11.0.9'.")
    gcp.grant(SETUP, "roles/compute.viewer")
    with pytest.raises(exceptions.Forbidden) as e:
        client(fake, gcp, "AddressesClient", SETUP).insert_unary(
            project=P, region=REGION, address_resource=compute_v1.Address(
                name="mine", address_type="INTERNAL", subnetwork=SUBNET))
    assert said(e) == ("Required 'compute.addresses.createInternal' permission for "
                               f"'projects/{P}/regions/{REGION}/addresses/mine'")


def test_the_old_instance_verbs_go_through_the_shared_project(
        fake: FakeComputeEngine, gcp: FakeProject) -> None:
    fake.add_instance("zone-a", "node")
    vms = client(fake, gcp, "InstancesClient", SETUP)
    with pytest.raises(exceptions.Forbidden) as e:
        vms.get(project=P, zone="zone-a", instance="node")
    assert said(e) == ("Required 'compute.instances.get' permission for "
                               f"'projects/{P}/zones/zone-a/instances/node'")
    gcp.grant(SETUP, "roles/compute.instanceAdmin.v1")
    assert vms.get(project=P, zone="zone-a", instance="node").status == "TERMINATED"
    op = vms.start_unary(project=P, zone="zone-a", instance="node")
    assert op.operation_type == "start"
    assert [(c["permission"], c["mutating"], c["status"]) for c in gcp.calls[-3:]] == [
        ("compute.instances.get", False, 403), ("compute.instances.get", False, 200),
        ("compute.instances.start", True, 200)]


def test_without_a_project_the_old_subnet_and_nat_controls_still_work() -> None:
    with FakeComputeEngine(P) as fake:
        fake.add_instance("zone-a", "node")
        fake.subnet("zone").private_ip_google_access = False
        fake.add_nat("zone", subnetworks=["default"])
        anon = {"credentials": Credentials(token="anything"),
                "client_options": {"api_endpoint": fake.url}, "transport": "rest"}
        sub = compute_v1.SubnetworksClient(**anon).get(project=P, region="zone",
                                                       subnetwork="default")
        assert (sub.private_ip_google_access, sub.ip_cidr_range) == (False, "10.128.0.0/20")
        routers = compute_v1.RoutersClient(**anon)
        nats = [n for r in routers.list(project=P, region="zone") for n in r.nats]
        assert [(n.name, n.source_subnetwork_ip_ranges_to_nat) for n in nats] == [
            ("nat", "LIST_OF_SUBNETWORKS")]
        fake.routers.clear()
        assert list(routers.list(project=P, region="zone")) == []
        started = time.time()
        assert fake.seen("get") and time.time() - started < 5
