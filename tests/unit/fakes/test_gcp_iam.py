"""The IAM admin fake (gRPC) and the Resource Manager fake (REST), driven through the real
google-cloud-iam IAMClient and google-cloud-resource-manager ProjectsClient."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.api_core import exceptions as gx
from google.auth.transport.grpc import AuthMetadataPlugin
from google.auth.transport.requests import Request
from google.cloud import resourcemanager_v3
from google.cloud.iam_admin_v1 import IAMClient, types
from google.cloud.iam_admin_v1.services.iam.transports import IAMGrpcTransport
from google.iam.v1 import policy_pb2
from google.oauth2.credentials import Credentials

from tests.fakes.gcp_iam import FakeIam, FakeResourceManager
from tests.fakes.gcp_project import FakeProject

P = "test-project"
OPERATOR = "user:operator@example.com"
STRANGER = "user:stranger@example.com"
LAG = 0.5


@dataclass
class World:
    project: FakeProject
    iam: FakeIam
    rm: FakeResourceManager
    channels: list[grpc.Channel]

    def creds(self, member: str = OPERATOR) -> Credentials:
        return Credentials(token=self.project.token_for(member))

    def client(self, member: str = OPERATOR) -> IAMClient:
        """The connection production code makes to a local (non-TLS) IAM endpoint: local channel
        credentials carry the OAuth token as call credentials."""
        channel = grpc.secure_channel(self.iam.target, grpc.composite_channel_credentials(
            grpc.local_channel_credentials(),
            grpc.metadata_call_credentials(AuthMetadataPlugin(self.creds(member), Request()))))
        self.channels.append(channel)
        return IAMClient(transport=IAMGrpcTransport(channel=channel))

    def projects(self, member: str = OPERATOR) -> resourcemanager_v3.ProjectsClient:
        return resourcemanager_v3.ProjectsClient(
            credentials=self.creds(member), transport="rest",
            client_options={"api_endpoint": self.rm.url})

    def create(self, account_id: str, member: str = OPERATOR) -> types.ServiceAccount:
        return self.client(member).create_service_account(
            name=f"projects/{P}", account_id=account_id,
            service_account=types.ServiceAccount(display_name="Node", description="runs jobs"))


@pytest.fixture
def world() -> Iterator[World]:
    project = FakeProject(P)
    project.enabled.add("iam.googleapis.com")
    with FakeIam(project, sa_propagation_seconds=LAG) as iam, \
            FakeResourceManager(project, iam) as rm:
        w = World(project, iam, rm, [])
        yield w
        for channel in w.channels:
            channel.close()


def sa_name(account_id: str, project: str = P) -> str:
    return f"projects/{project}/serviceAccounts/{account_id}@{P}.iam.gserviceaccount.com"


def said(exc: gx.GoogleAPICallError) -> str:
    """The API's message (a REST error's message starts with the method and URL)."""
    return exc.message.split(": ", 1)[1] if exc.message.startswith(("GET ", "POST ")) \
        else exc.message


# ---- IAM admin: service accounts ----------------------------------------------------------
def test_create_then_get_after_propagation(world: World) -> None:
    sa = world.create("slm-node")
    assert (sa.name, sa.email, sa.project_id, sa.display_name, sa.description) == (
        sa_name("slm-node"), f"slm-node@{P}.iam.gserviceaccount.com", P, "Node", "runs jobs")
    assert len(sa.unique_id) == 21 and sa.unique_id == sa.oauth2_client_id
    # eventual consistency: not found, and not usable in a policy, until it has propagated
    with pytest.raises(gx.NotFound) as exc:
        world.client().get_service_account(name=sa.name)
    assert exc.value.message == "Unknown service account"
    assert not world.iam.account_usable(sa.email)
    time.sleep(LAG + 0.05)
    assert world.iam.account_usable(sa.email)
    assert world.client().get_service_account(name=sa.name).unique_id == sa.unique_id
    by_id = world.client().get_service_account(name=f"projects/{P}/serviceAccounts/"
                                               f"{sa.unique_id}")
    assert by_id.email == sa.email
    calls = [(c["method"], c["mutating"], c["permission"], c["status"], c["member"])
             for c in world.project.calls]
    assert calls == [
        ("projects.serviceAccounts.create", True, "iam.serviceAccounts.create", 200, OPERATOR),
        ("projects.serviceAccounts.get", False, "iam.serviceAccounts.get", 404, OPERATOR),
        ("projects.serviceAccounts.get", False, "iam.serviceAccounts.get", 200, OPERATOR),
        ("projects.serviceAccounts.get", False, "iam.serviceAccounts.get", 200, OPERATOR)]


def test_a_duplicate_create_is_409_even_before_propagation(world: World) -> None:
    world.create("slm-node")
    with pytest.raises(gx.AlreadyExists) as exc:
        world.create("slm-node")
    assert exc.value.message == (f"Service account slm-node already exists within project "
                                 f"projects/{P}.")
    assert [d.resource_name for d in exc.value.details] == [sa_name("slm-node")]


@pytest.mark.parametrize(("account_id", "message"), [
    ("node", 'The account ID "node" does not have a length between 6 and 30.'),
    ("a" * 31, f'The account ID "{"a" * 31}" does not have a length between 6 and 30.'),
    ("Slm-node", "Slm-node does not match [a-z][a-z\\d\\-]*[a-z\\d]."),
    ("slm-node-", "slm-node- does not match [a-z][a-z\\d\\-]*[a-z\\d]."),
    ("1slm-node", "1slm-node does not match [a-z][a-z\\d\\-]*[a-z\\d]."),
])
def test_account_ids_are_validated(world: World, account_id: str, message: str) -> None:
    with pytest.raises(gx.InvalidArgument) as exc:
        world.create(account_id)
    assert exc.value.message == message
    assert world.iam.accounts == {}


def test_iam_api_disabled_is_service_disabled(world: World) -> None:
    world.project.enabled.discard("iam.googleapis.com")
    with pytest.raises(gx.PermissionDenied) as exc:
        world.create("slm-node")
    assert exc.value.reason == "SERVICE_DISABLED"
    assert exc.value.metadata == {"service": "iam.googleapis.com",
                                  "consumer": "projects/123456789012"}
    assert exc.value.message.startswith("Identity and Access Management (IAM) API has not been "
                                        "used in project 123456789012 before or it is disabled.")


def test_a_missing_permission_is_named(world: World) -> None:
    email = world.iam.seed("slm-node")
    with pytest.raises(gx.PermissionDenied) as exc:
        world.create("other-one", member=STRANGER)
    assert exc.value.message == ("Permission 'iam.serviceAccounts.create' denied on resource "
                                 "(or it may not exist).")
    assert (exc.value.reason, exc.value.domain, exc.value.metadata) == (
        "IAM_PERMISSION_DENIED", "iam.googleapis.com",
        {"permission": "iam.serviceAccounts.create"})
    # a grant on the account itself: get, not list (list needs the project)
    world.project.grant(STRANGER, "roles/iam.serviceAccountUser",
                        f"projects/{P}/serviceAccounts/{email}")
    assert world.client(STRANGER).get_service_account(name=sa_name("slm-node")).email == email
    with pytest.raises(gx.PermissionDenied) as exc:
        list(world.client(STRANGER).list_service_accounts(name=f"projects/{P}"))
    assert "'iam.serviceAccounts.list'" in exc.value.message
    assert world.project.calls[-1]["status"] == 403


def test_no_credentials_is_unauthenticated(world: World) -> None:
    channel = grpc.insecure_channel(world.iam.target)
    world.channels.append(channel)
    client = IAMClient(transport=IAMGrpcTransport(channel=channel))
    with pytest.raises(gx.Unauthenticated) as exc:
        client.get_service_account(name=sa_name("slm-node"))
    assert exc.value.message.startswith("Request is missing required authentication credential.")


def test_missing_accounts_404_or_403_with_the_wildcard(world: World) -> None:
    with pytest.raises(gx.NotFound):
        world.client().get_service_account(name=sa_name("nobody-here"))
    with pytest.raises(gx.PermissionDenied) as exc:  # documented: "-" answers 403, not 404
        world.client().get_service_account(
            name=f"projects/-/serviceAccounts/nobody-here@{P}.iam.gserviceaccount.com")
    assert exc.value.message == ("Permission 'iam.serviceAccounts.get' denied on resource (or "
                                 "it may not exist).")
    with pytest.raises(gx.PermissionDenied):
        world.client().list_service_accounts(name="projects/another-project")


def test_list_pages_by_twenty(world: World) -> None:
    emails = sorted(world.iam.seed(f"node-{i:02d}") for i in range(25))
    world.create("too-new-to-list")
    first = world.client().list_service_accounts(
        request=types.ListServiceAccountsRequest(name=f"projects/{P}"))
    assert len(first._response.accounts) == 20 and first.next_page_token == "20"
    assert [a.email for a in world.client().list_service_accounts(name=f"projects/{P}")] == emails


def test_delete_leaves_deleted_bindings(world: World) -> None:
    email = world.iam.seed("slm-node")
    world.project.grant(f"serviceAccount:{email}", "roles/logging.logWriter")
    world.client().delete_service_account(name=sa_name("slm-node"))
    with pytest.raises(gx.NotFound):
        world.client().get_service_account(name=sa_name("slm-node"))
    uid = "100000000000000000001"
    assert world.project.policies[f"projects/{P}"].bindings["roles/logging.logWriter"] == {
        f"deleted:serviceAccount:{email}?uid={uid}"}
    assert world.project.mutations()[0]["method"] == "projects.serviceAccounts.delete"


def test_service_account_policy_round_trip(world: World) -> None:
    email = world.iam.seed("slm-node")
    client = world.client()
    policy = client.get_iam_policy(resource=sa_name("slm-node"))
    assert (policy.version, list(policy.bindings)) == (1, [])
    policy.bindings.append(policy_pb2.Binding(role="roles/iam.serviceAccountUser",
                                              members=[OPERATOR]))
    stored = client.set_iam_policy(request={"resource": sa_name("slm-node"), "policy": policy})
    assert [(b.role, list(b.members)) for b in stored.bindings] == [
        ("roles/iam.serviceAccountUser", [OPERATOR])]
    resource = f"projects/{P}/serviceAccounts/{email}"
    assert world.project.allowed(OPERATOR, "iam.serviceAccounts.actAs", resource)
    assert not world.project.allowed(STRANGER, "iam.serviceAccounts.actAs", resource)
    # the etag read before that write is stale now
    with pytest.raises(gx.Aborted) as exc:
        client.set_iam_policy(request={"resource": sa_name("slm-node"), "policy": policy})
    assert exc.value.message == ("There were concurrent policy changes. Please retry the whole "
                                 "read-modify-write with exponential backoff.")
    assert [c["status"] for c in world.project.mutations()] == [200, 409]


def test_service_account_policy_refusals(world: World) -> None:
    world.iam.seed("slm-node")
    new = world.create("just-made").email
    client = world.client()

    def set_(role: str, member: str) -> None:
        client.set_iam_policy(request={"resource": sa_name("slm-node"), "policy": {
            "bindings": [{"role": role, "members": [member]}]}})

    with pytest.raises(gx.InvalidArgument) as exc:
        set_("roles/storage.objectCreator", OPERATOR)
    assert exc.value.message == "Role roles/storage.objectCreator is not supported for this " \
        "resource."
    with pytest.raises(gx.InvalidArgument) as exc:
        set_("roles/iam.serviceAccountUser", f"serviceAccount:{new}")
    assert exc.value.message == f"Service account {new} does not exist."
    time.sleep(LAG + 0.05)
    set_("roles/iam.serviceAccountUser", f"serviceAccount:{new}")
    with pytest.raises(gx.InvalidArgument):
        set_("roles/iam.serviceAccountUser", "operator@example.com")  # no member type


def test_compute_default_account_exists_once_compute_is_on(world: World) -> None:
    default = "123456789012-compute@developer.gserviceaccount.com"
    assert not world.iam.account_usable(default)
    world.project.enabled.add("compute.googleapis.com")
    assert world.iam.account_usable(default)
    assert world.iam.account_usable("agent@other-project.iam.gserviceaccount.com")


# ---- Resource Manager v3: projects --------------------------------------------------------
def test_get_project_by_id_or_number(world: World) -> None:
    for name in (f"projects/{P}", "projects/123456789012"):
        got = world.projects().get_project(name=name)
        assert (got.name, got.project_id, got.state, got.display_name) == (
            "projects/123456789012", P, resourcemanager_v3.Project.State.ACTIVE, "SLM nightly")
    with pytest.raises(gx.Forbidden) as exc:
        world.projects().get_project(name="projects/someone-elses")
    assert said(exc.value) == ("Permission 'resourcemanager.projects.get' denied on resource "
                               "'//cloudresourcemanager.googleapis.com/projects/someone-elses' "
                               "(or it may not exist).")
    with pytest.raises(gx.Forbidden) as exc:
        world.projects(STRANGER).get_project(name=f"projects/{P}")
    assert exc.value.reason == "IAM_PERMISSION_DENIED"
    assert world.project.mutations() == []


def test_project_policy_read_modify_write(world: World) -> None:
    email = world.iam.seed("slm-node")
    client = world.projects()
    policy = client.get_iam_policy(request={"resource": f"projects/{P}",
                                            "options": {"requested_policy_version": 3}})
    assert [(b.role, list(b.members)) for b in policy.bindings] == [("roles/owner", [OPERATOR])]
    policy.bindings.append(policy_pb2.Binding(role="roles/logging.logWriter",
                                              members=[f"serviceAccount:{email}"]))
    stored = client.set_iam_policy(request={"resource": f"projects/{P}", "policy": policy})
    assert [b.role for b in stored.bindings] == ["roles/logging.logWriter", "roles/owner"]
    assert world.project.allowed(f"serviceAccount:{email}", "logging.logEntries.create",
                                 f"projects/{P}")
    assert [(c["method"], c["mutating"], c["permission"]) for c in world.project.calls] == [
        ("projects.getIamPolicy", False, "resourcemanager.projects.getIamPolicy"),
        ("projects.setIamPolicy", True, "resourcemanager.projects.setIamPolicy")]
    with pytest.raises(gx.Conflict) as exc:  # the same etag again: stale
        client.set_iam_policy(request={"resource": f"projects/{P}", "policy": policy})
    sent, now = base64.b64encode(policy.etag).decode(), world.project.policies[f"projects/{P}"].etag
    assert said(exc.value) == (
        "There were concurrent policy changes. Please retry the whole read-modify-write with "
        f"exponential backoff. The request's ETag '{sent}' did not match the current policy's "
        f"ETag '{now}'.")


def test_project_policy_refusals(world: World) -> None:
    client = world.projects()
    new = world.create("just-made").email

    def set_(*bindings: tuple[str, list[str]]) -> None:
        current = client.get_iam_policy(resource=f"projects/{P}")
        policy = {"etag": current.etag, "bindings": [{"role": r, "members": m}
                                                     for r, m in bindings]}
        client.set_iam_policy(request={"resource": f"projects/{P}", "policy": policy})

    owner = ("roles/owner", [OPERATOR])
    with pytest.raises(gx.BadRequest) as exc:
        set_(owner, ("roles/logging.logWriter", [f"serviceAccount:{new}"]))
    assert said(exc.value) == f"Service account {new} does not exist."
    with pytest.raises(gx.BadRequest) as exc:
        set_(owner, ("roles/logging.logWriter", [f"serviceAccount:ghost@{P}.iam.gserviceaccount"
                                                 ".com"]))
    assert said(exc.value) == f"Service account ghost@{P}.iam.gserviceaccount.com does not exist."
    with pytest.raises(gx.BadRequest) as exc:
        set_(owner, ("roles/compute.browser", [OPERATOR]))
    assert said(exc.value) == "Role roles/compute.browser is not supported for this resource."
    with pytest.raises(gx.BadRequest) as exc:
        set_(owner, ("not-a-role", [OPERATOR]))
    assert said(exc.value) == "Role not-a-role is not supported for this resource."
    with pytest.raises(gx.BadRequest) as exc:  # a user is invited to be an owner, not set
        set_(("roles/owner", [OPERATOR, "user:friend@example.com"]))
    assert exc.value.details[0]["type"] == "SOLO_MUST_INVITE_OWNERS"
    with pytest.raises(gx.BadRequest) as exc:  # the last (ToS-accepting) owner stays
        set_(("roles/owner", [f"serviceAccount:{world.iam.seed('robot-owner')}"]))
    assert exc.value.details[0]["type"] == "SOLO_REQUIRE_TOS_ACCEPTOR"
    with pytest.raises(gx.BadRequest):
        set_(owner, ("roles/viewer", ["allUsers"]))
    time.sleep(LAG + 0.05)
    set_(owner, ("roles/logging.logWriter", [f"serviceAccount:{new}"]),
         ("roles/some.futureRole", [OPERATOR]))  # any well-formed role is stored
    assert world.project.policies[f"projects/{P}"].bindings["roles/some.futureRole"] == {
        OPERATOR}
    assert [c["status"] for c in world.project.mutations()
            if c["api"] == "cloudresourcemanager"] == [400] * 7 + [200]


def test_project_policy_needs_the_permission(world: World) -> None:
    world.project.grant(STRANGER, "roles/browser")
    client = world.projects(STRANGER)
    policy = client.get_iam_policy(resource=f"projects/{P}")
    with pytest.raises(gx.Forbidden) as exc:
        client.set_iam_policy(request={"resource": f"projects/{P}", "policy": policy})
    assert said(exc.value).startswith("Permission 'resourcemanager.projects.setIamPolicy' denied")
    assert exc.value.details[0]["metadata"]["permission"] == (
        "resourcemanager.projects.setIamPolicy")
