"""The Secret Manager fake, driven through the real google-cloud-secret-manager client (REST)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c
import pytest
from google.api_core import exceptions as gx
from google.cloud import secretmanager_v1
from google.oauth2.credentials import Credentials

from tests.fakes.gcp_iam import FakeIam
from tests.fakes.gcp_project import FakeProject
from tests.fakes.gcp_secrets import FakeSecrets

P = "test-project"
N = 123456789012
OPERATOR = "user:operator@example.com"
NODE = f"serviceAccount:slm-node@{P}.iam.gserviceaccount.com"
VALUE = b"pnu_not-a-real-key-0123456789"
LAG = 0.2


@dataclass
class World:
    project: FakeProject
    iam: FakeIam
    sm: FakeSecrets

    def client(self, member: str = OPERATOR) -> secretmanager_v1.SecretManagerServiceClient:
        return secretmanager_v1.SecretManagerServiceClient(
            credentials=Credentials(token=self.project.token_for(member)), transport="rest",
            client_options={"api_endpoint": self.sm.url})

    def create(self, secret_id: str = "prefect-api-key") -> secretmanager_v1.Secret:
        return self.client().create_secret(parent=f"projects/{P}", secret_id=secret_id,
                                           secret={"replication": {"automatic": {}}})

    def add(self, data: bytes = VALUE, crc: int | None = None,
            secret_id: str = "prefect-api-key") -> secretmanager_v1.SecretVersion:
        return self.client().add_secret_version(
            parent=f"projects/{P}/secrets/{secret_id}",
            payload={"data": data, "data_crc32c": google_crc32c.value(data) if crc is None
                     else crc})


@pytest.fixture
def world() -> Iterator[World]:
    project = FakeProject(P, N)
    project.enabled.add("secretmanager.googleapis.com")
    with FakeIam(project, sa_propagation_seconds=LAG) as iam, FakeSecrets(project, iam) as sm:
        yield World(project, iam, sm)


def said(exc: gx.GoogleAPICallError) -> str:
    """The API's message (the REST client prefixes the method and URL)."""
    return exc.message.split(": ", 1)[1]


def test_disabled_api_is_service_disabled(world: World) -> None:
    world.project.enabled.discard("secretmanager.googleapis.com")
    with pytest.raises(gx.Forbidden) as exc:
        world.create()
    assert exc.value.reason == "SERVICE_DISABLED"
    assert said(exc.value).startswith(f"Secret Manager API has not been used in project {N} "
                                      "before or it is disabled.")


def test_create_get_and_duplicate(world: World) -> None:
    made = world.create()
    assert made.name == f"projects/{N}/secrets/prefect-api-key"  # the number, not the id
    assert "automatic" in made.replication
    assert world.client().get_secret(name=f"projects/{P}/secrets/prefect-api-key").name == \
        made.name
    with pytest.raises(gx.Conflict) as exc:
        world.create()
    assert said(exc.value) == f"Secret [projects/{N}/secrets/prefect-api-key] already exists."
    with pytest.raises(gx.NotFound) as exc:
        world.client().get_secret(name=f"projects/{P}/secrets/nope")
    assert said(exc.value) == f"Secret [projects/{N}/secrets/nope] not found."
    assert [(c["method"], c["mutating"], c["permission"], c["status"])
            for c in world.project.calls] == [
        ("projects.secrets.create", True, "secretmanager.secrets.create", 200),
        ("projects.secrets.get", False, "secretmanager.secrets.get", 200),
        ("projects.secrets.create", True, "secretmanager.secrets.create", 409),
        ("projects.secrets.get", False, "secretmanager.secrets.get", 404)]


@pytest.mark.parametrize("secret_id", ["has.dot", "a" * 256, "sp ace"])
def test_secret_ids_are_validated(world: World, secret_id: str) -> None:
    with pytest.raises(gx.BadRequest) as exc:
        world.create(secret_id)
    assert said(exc.value).startswith(f"Secret ID [{secret_id}] is invalid")
    assert world.sm.secrets == {}


def test_replication_is_required(world: World) -> None:
    with pytest.raises(gx.BadRequest) as exc:
        world.client().create_secret(parent=f"projects/{P}", secret_id="engine-key", secret={})
    assert said(exc.value) == "Secret.replication is required."


def test_add_version_checks_the_checksum_and_size(world: World) -> None:
    world.create()
    with pytest.raises(gx.BadRequest) as exc:
        world.add(crc=google_crc32c.value(VALUE) ^ 1)
    assert said(exc.value) == ("Checksum mismatch: payload.data_crc32c is not the CRC32C of "
                               "payload.data.")
    with pytest.raises(gx.BadRequest) as exc:
        world.add(b"x" * (64 * 1024 + 1))
    assert said(exc.value).endswith("it cannot be larger than 64KiB.")
    version = world.add(b"x" * (64 * 1024))
    assert (version.name, version.state, version.client_specified_payload_checksum) == (
        f"projects/{N}/secrets/prefect-api-key/versions/1",
        secretmanager_v1.SecretVersion.State.ENABLED, True)
    with pytest.raises(gx.NotFound):
        world.add(secret_id="no-such-secret")


def test_latest_access_and_list(world: World) -> None:
    world.create()
    name = f"projects/{P}/secrets/prefect-api-key"
    with pytest.raises(gx.NotFound) as exc:
        world.client().get_secret_version(name=f"{name}/versions/latest")
    assert said(exc.value) == (f"Secret [projects/{N}/secrets/prefect-api-key] not found or has "
                               "no versions.")
    world.add(b"old")
    world.add()
    latest = world.client().get_secret_version(name=f"{name}/versions/latest")
    assert latest.name == f"projects/{N}/secrets/prefect-api-key/versions/2"
    got = world.client().access_secret_version(name=f"{name}/versions/latest")
    assert (got.name, got.payload.data, got.payload.data_crc32c) == (
        latest.name, VALUE, google_crc32c.value(VALUE))
    assert world.client().access_secret_version(name=f"{name}/versions/1").payload.data == b"old"
    with pytest.raises(gx.NotFound) as exc:
        world.client().get_secret_version(name=f"{name}/versions/7")
    assert said(exc.value) == (f"Secret Version [projects/{N}/secrets/prefect-api-key/versions/7]"
                               " not found.")
    listed = world.client().list_secret_versions(request={"parent": name,
                                                          "filter": "state:ENABLED"})
    assert [v.name.rsplit("/", 1)[1] for v in listed] == ["2", "1"]  # newest first


def test_a_version_not_enabled_cannot_be_accessed(world: World) -> None:
    world.sm.seed("engine-key", "ENABLED", "DISABLED")
    name = f"projects/{P}/secrets/engine-key/versions/latest"
    assert world.client().get_secret_version(name=name).state == \
        secretmanager_v1.SecretVersion.State.DISABLED
    with pytest.raises(gx.BadRequest) as exc:  # REST maps the HTTP 400, not the status
        world.client().access_secret_version(name=name)
    assert exc.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    assert said(exc.value) == (f"Secret Version [projects/{N}/secrets/engine-key/versions/2] is "
                               "in DISABLED state.")
    enabled = world.client().list_secret_versions(request={
        "parent": f"projects/{P}/secrets/engine-key", "filter": "state:ENABLED"})
    assert [v.name.rsplit("/", 1)[1] for v in enabled] == ["1"]


def test_access_needs_its_own_permission(world: World) -> None:
    world.sm.seed("engine-key")
    world.project.grant(NODE, "roles/secretmanager.viewer")
    name = f"projects/{P}/secrets/engine-key/versions/latest"
    assert world.client(NODE).get_secret_version(name=name).name.endswith("/versions/1")
    with pytest.raises(gx.Forbidden) as exc:
        world.client(NODE).access_secret_version(name=name)
    assert said(exc.value) == (f"Permission 'secretmanager.versions.access' denied for resource "
                               f"'projects/{N}/secrets/engine-key/versions/latest' (or it may "
                               "not exist).")
    assert exc.value.reason == "IAM_PERMISSION_DENIED"
    world.project.grant(NODE, "roles/secretmanager.secretAccessor",
                        f"projects/{P}/secrets/engine-key")
    assert world.client(NODE).access_secret_version(name=name).payload.data == b"seeded"
    with pytest.raises(gx.Forbidden):  # on one secret, not another
        world.sm.seed("other-key")
        world.client(NODE).access_secret_version(name=f"projects/{P}/secrets/other-key/versions/1")


def test_secret_policy_round_trip_and_refusals(world: World) -> None:
    world.create()
    resource = f"projects/{P}/secrets/prefect-api-key"
    client = world.client()
    policy = client.get_iam_policy(request={"resource": resource})
    assert list(policy.bindings) == []
    node = world.iam.seed("slm-node")
    binding = {"role": "roles/secretmanager.secretAccessor", "members": [f"serviceAccount:{node}"]}
    stored = client.set_iam_policy(request={"resource": resource, "policy": {
        "etag": policy.etag, "bindings": [binding]}})
    assert world.project.allowed(NODE, "secretmanager.versions.access", resource + "/versions/1")
    with pytest.raises(gx.Conflict):
        client.set_iam_policy(request={"resource": resource, "policy": {
            "etag": policy.etag, "bindings": [binding]}})
    with pytest.raises(gx.BadRequest) as exc:
        client.set_iam_policy(request={"resource": resource, "policy": {
            "etag": stored.etag, "bindings": [{"role": "roles/storage.objectViewer",
                                               "members": [f"serviceAccount:{node}"]}]}})
    assert said(exc.value) == "Role roles/storage.objectViewer is not supported for this resource."
    fresh = world.iam.seed("placeholder")  # exists; a created one has not propagated yet
    world.iam.accounts[fresh].usable_at = time.time() + 60
    with pytest.raises(gx.BadRequest) as exc:
        client.set_iam_policy(request={"resource": resource, "policy": {"bindings": [
            {"role": "roles/secretmanager.secretAccessor", "members": [f"serviceAccount:{fresh}"]}
        ]}})
    assert said(exc.value) == f"Service account {fresh} does not exist."
    assert [c["status"] for c in world.project.mutations()
            if c["method"] == "projects.secrets.setIamPolicy"] == [200, 409, 400, 400]


def test_delete_removes_secret_and_policy(world: World) -> None:
    world.create()
    world.add()
    resource = f"projects/{P}/secrets/prefect-api-key"
    world.project.grant(NODE, "roles/secretmanager.secretAccessor", resource)
    world.client().delete_secret(name=resource)
    assert resource not in world.project.policies
    with pytest.raises(gx.NotFound):
        world.client().get_secret(name=resource)
    with pytest.raises(gx.NotFound):
        world.client().delete_secret(name=resource)


def test_a_stranger_is_refused_and_no_value_is_recorded(world: World) -> None:
    world.create()
    world.add()
    with pytest.raises(gx.Forbidden) as exc:
        world.client("user:stranger@example.com").create_secret(
            parent=f"projects/{P}", secret_id="mine", secret={"replication": {"automatic": {}}})
    assert said(exc.value) == (f"Permission 'secretmanager.secrets.create' denied for resource "
                               f"'projects/{N}' (or it may not exist).")
    world.client().access_secret_version(name=f"projects/{P}/secrets/prefect-api-key/versions/1")
    assert VALUE not in repr(world.project.calls).encode()
    assert base64.b64encode(VALUE).decode() not in repr(world.project.calls)
    assert VALUE.decode() not in repr(world.sm.secrets)
    assert world.sm.payload("prefect-api-key") == VALUE
