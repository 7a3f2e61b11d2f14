"""Cloud Storage IAM (tests/fakes/gcs_iam.py) in front of gcp-storage-emulator, driven by the
real google-cloud-storage client and by prefect-gcp's GcsBucket: the bucket's policy, the 403s
naming the permission, and the production finding — roles/storage.objectAdmin alone cannot
get_bucket(), which GcsBucket calls before every read and write."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import storage
from google.oauth2.credentials import Credentials

from tests.fakes.gcp_project import FakeProject
from tests.fakes.gcs import GcsEmulator, service_account
from tests.fakes.gcs_iam import GcsIamProxy

PROJECT = "test-project"
OWNER = "user:operator@example.com"
NODE_EMAIL = "slm-node@test-project.iam.gserviceaccount.com"
NODE = f"serviceAccount:{NODE_EMAIL}"
BUCKET = "slm-artifacts"
RES = f"projects/_/buckets/{BUCKET}"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeProject, GcsIamProxy]]:
    gcp = FakeProject()
    with GcsEmulator(tmp_path) as gcs, GcsIamProxy(gcs, gcp) as proxy:
        yield gcp, proxy


def client(world: tuple[FakeProject, GcsIamProxy], member: str = OWNER) -> storage.Client:
    gcp, proxy = world
    return storage.Client(project=PROJECT, credentials=Credentials(token=gcp.token_for(member)),
                          client_options={"api_endpoint": proxy.url})


def said(e: pytest.ExceptionInfo[Any]) -> str:
    """The API's message (google-api-core prefixes "METHOD URL: "; an upload's error carries
    the whole JSON body)."""
    text = str(e.value.message).split(": ", 1)[-1]
    if text.startswith("{"):
        return json.JSONDecoder().raw_decode(text)[0]["error"]["message"]
    return text


def no_access(who: str, perm: str, what: str = "Google Cloud Storage bucket") -> str:
    return (f"{who} does not have {perm} access to the {what}. Permission '{perm}' denied on "
            "resource (or it may not exist).")


def make_bucket(world: tuple[FakeProject, GcsIamProxy]) -> storage.Bucket:
    c = client(world)
    bucket = c.bucket(BUCKET)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    return c.create_bucket(bucket, location="us-central1")


def test_a_bucket_keeps_its_location_uniform_access_and_policy(
        world: tuple[FakeProject, GcsIamProxy]) -> None:
    gcp, proxy = world
    with pytest.raises(exceptions.Forbidden) as e:
        client(world, NODE).create_bucket(BUCKET)
    assert said(e) == no_access(NODE_EMAIL, "storage.buckets.create", "Google Cloud project")
    with pytest.raises(exceptions.BadRequest) as b:
        client(world).create_bucket("Bad_Name")
    assert said(b) == "Invalid bucket name: 'Bad_Name'"
    make_bucket(world)
    got = client(world).get_bucket(BUCKET)
    locked = got.iam_configuration.uniform_bucket_level_access_locked_time
    assert (got.location, got.location_type, got.project_number,
            got.iam_configuration.uniform_bucket_level_access_enabled) == (
        "US-CENTRAL1", "region", 123456789012, True)
    assert abs((locked - datetime.now(UTC)).total_seconds() - 90 * 86400) < 60
    assert gcp.parents[RES] == f"projects/{PROJECT}"
    policy = got.get_iam_policy()
    assert {b["role"]: sorted(b["members"]) for b in policy.bindings} == {
        "roles/storage.legacyBucketOwner": [f"projectEditor:{PROJECT}",
                                            f"projectOwner:{PROJECT}"],
        "roles/storage.legacyBucketReader": [f"projectViewer:{PROJECT}"],
        "roles/storage.legacyObjectOwner": [f"projectEditor:{PROJECT}",
                                            f"projectOwner:{PROJECT}"],
        "roles/storage.legacyObjectReader": [f"projectViewer:{PROJECT}"]}
    policy.bindings.append({"role": "roles/storage.objectAdmin", "members": {NODE}})
    got.set_iam_policy(policy)
    assert gcp.policies[RES].bindings["roles/storage.objectAdmin"] == {NODE}
    with pytest.raises(exceptions.PreconditionFailed) as p:  # the etag read before the change
        got.set_iam_policy(policy)
    assert said(p) == "At least one of the pre-conditions you specified did not hold."
    with pytest.raises(exceptions.BadRequest) as b:  # no ACLs on a uniform bucket
        got.acl.reload()
    assert said(b).startswith("Cannot get legacy ACL for a bucket that has uniform "
                              "bucket-level access.")
    with pytest.raises(exceptions.BadRequest) as b:
        got.acl.save(acl=[{"entity": "allUsers", "role": "READER"}])
    assert said(b).startswith("Cannot use ACL API to update bucket policy when uniform "
                              "bucket-level access is enabled.")
    assert [(c["method"], c["permission"], c["status"]) for c in gcp.calls[-5:]] == [
        ("GET", "storage.buckets.getIamPolicy", 200),
        ("PUT", "storage.buckets.setIamPolicy", 200),
        ("PUT", "storage.buckets.setIamPolicy", 412),
        ("GET", "storage.buckets.getIamPolicy", 400),
        ("PATCH", "storage.buckets.update", 400)]


def test_object_admin_alone_cannot_get_the_bucket(
        world: tuple[FakeProject, GcsIamProxy]) -> None:
    gcp, _ = world
    make_bucket(world)
    gcp.grant(NODE, "roles/storage.objectAdmin", RES)
    node = client(world, NODE)
    with pytest.raises(exceptions.Forbidden) as e:
        node.get_bucket(BUCKET)
    assert said(e) == no_access(NODE_EMAIL, "storage.buckets.get")
    blob = node.bucket(BUCKET).blob("adapters/a.bin")  # objects alone: no bucket read
    blob.upload_from_string(b"weights")
    assert blob.download_as_bytes() == b"weights"
    assert [b.name for b in node.list_blobs(BUCKET)] == ["adapters/a.bin"]
    assert node.bucket(BUCKET).test_iam_permissions(
        ["storage.buckets.get", "storage.objects.list", "storage.objects.get"]) == [
        "storage.objects.list", "storage.objects.get"]
    gcp.grant(NODE, "roles/storage.legacyBucketReader", RES)
    assert node.get_bucket(BUCKET).name == BUCKET
    with pytest.raises(exceptions.Forbidden) as e:  # reading the policy is not theirs
        node.bucket(BUCKET).get_iam_policy()
    assert said(e) == no_access(NODE_EMAIL, "storage.buckets.getIamPolicy")


def test_an_overwrite_needs_delete_too(world: tuple[FakeProject, GcsIamProxy]) -> None:
    gcp, _ = world
    make_bucket(world)
    gcp.grant(NODE, "roles/storage.objectCreator", RES)
    bucket = client(world, NODE).bucket(BUCKET)
    bucket.blob("runs/1.json").upload_from_string("{}")
    with pytest.raises(exceptions.Forbidden) as e:
        bucket.blob("runs/1.json").upload_from_string("{} ")
    assert said(e) == no_access(NODE_EMAIL, "storage.objects.delete",
                                "Google Cloud Storage object")
    with pytest.raises(exceptions.Forbidden) as e:
        bucket.blob("runs/1.json").download_as_bytes()
    assert said(e) == no_access(NODE_EMAIL, "storage.objects.get",
                                "Google Cloud Storage object")
    # a resumable upload: the start is checked, its chunks ride on the session
    big = bucket.blob("runs/big.bin", chunk_size=256 * 1024)
    big.upload_from_string(b"x" * (600 * 1024))
    owner = client(world).bucket(BUCKET)
    assert owner.get_blob("runs/big.bin").size == 600 * 1024
    owner.copy_blob(owner.blob("runs/1.json"), owner, "runs/2.json")
    with pytest.raises(exceptions.Forbidden) as e:  # copying reads the source
        bucket.copy_blob(bucket.blob("runs/1.json"), bucket, "runs/3.json")
    assert said(e) == no_access(NODE_EMAIL, "storage.objects.get",
                                "Google Cloud Storage object")


def test_prefect_gcs_bucket_needs_object_admin_and_legacy_bucket_reader(
        world: tuple[FakeProject, GcsIamProxy], tmp_path: Path) -> None:
    from prefect_gcp import GcpCredentials, GcsBucket

    gcp, proxy = world
    make_bucket(world)
    gcp.grant(NODE, "roles/storage.objectAdmin", RES)
    creds = GcpCredentials(service_account_info=service_account(proxy.token_uri, NODE_EMAIL),
                           project=PROJECT)
    block = GcsBucket(bucket=BUCKET, gcp_credentials=creds, bucket_folder="nightly")
    since = len(gcp.calls)
    with pytest.raises(exceptions.Forbidden) as e:
        block.write_path("scores.json", b"{}")
    assert said(e) == no_access(NODE_EMAIL, "storage.buckets.get")
    assert [(c["member"], c["permission"], c["status"]) for c in gcp.calls[since:]] == [
        (NODE, "storage.buckets.get", 403)]
    with pytest.raises(exceptions.Forbidden):
        block.read_path("scores.json")
    gcp.grant(NODE, "roles/storage.legacyBucketReader", RES)
    assert block.write_path("scores.json", b'{"f1": 1}') == "nightly/scores.json"
    assert block.read_path("scores.json") == b'{"f1": 1}'
    local = tmp_path / "adapter.bin"
    local.write_bytes(b"lora")
    assert block.upload_from_path(local, "adapters/a.bin") == "nightly/adapters/a.bin"
    assert client(world).bucket(BUCKET).blob("nightly/adapters/a.bin").download_as_bytes() == (
        b"lora")


def test_a_disabled_api_and_an_anonymous_caller(world: tuple[FakeProject, GcsIamProxy]) -> None:
    gcp, proxy = world
    make_bucket(world)
    with pytest.raises(urllib.error.HTTPError) as e:  # no credentials
        urllib.request.urlopen(f"{proxy.url}/download/storage/v1/b/{BUCKET}/o/x?alt=media")
    assert (e.value.code, json.loads(e.value.read())["error"]["message"]) == (
        401, no_access("Anonymous caller", "storage.objects.get", "Google Cloud Storage object"))
    gcp.enabled.discard("storage.googleapis.com")
    with pytest.raises(exceptions.Forbidden) as f:
        client(world).get_bucket(BUCKET)
    assert f.value.reason == "SERVICE_DISABLED"


def test_a_conditional_binding_grants_only_the_objects_it_names(
        world: tuple[FakeProject, GcsIamProxy]) -> None:
    """[conditions]: written only as a version-3 policy on a bucket with uniform access; read
    back whole at version 3 and mangled below it; it allows the objects under its prefix, and
    not a list (whose resource is the bucket)."""
    gcp, _ = world
    c = client(world)
    legacy = c.create_bucket(c.bucket("slm-acl-bucket"), location="us-central1")
    make_bucket(world)
    cond = {"title": "runs", "description": "",
            "expression": f'resource.name.startsWith("{RES}/objects/runs/")'}
    for bucket, version, why in ((legacy, 3, "uniform bucket-level access"),
                                 (c.bucket(BUCKET), 1, "version 3")):
        policy = bucket.get_iam_policy(requested_policy_version=3)
        policy.version = version
        policy.bindings.append({"role": "roles/storage.objectAdmin", "members": {NODE},
                                "condition": cond})
        with pytest.raises(exceptions.BadRequest, match=why):
            bucket.set_iam_policy(policy)
    bucket = c.bucket(BUCKET)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings.append({"role": "roles/storage.objectAdmin", "members": {NODE},
                            "condition": cond})
    bucket.set_iam_policy(policy)
    assert [b for b in bucket.get_iam_policy(requested_policy_version=3).bindings
            if b.get("condition")] == [{"role": "roles/storage.objectAdmin",
                                        "members": {NODE}, "condition": cond}]
    v1 = bucket.get_iam_policy()
    assert v1.version == 1 and [b["role"][:len("roles/storage.objectAdmin_withcond_")]
                                for b in v1.bindings if "_withcond_" in b["role"]] == [
        "roles/storage.objectAdmin_withcond_"]
    gcp.grant(NODE, "roles/storage.legacyBucketReader", RES)
    mine = client(world, NODE).bucket(BUCKET)
    mine.blob("runs/1.json").upload_from_string("{}")
    assert mine.blob("runs/1.json").download_as_bytes() == b"{}"
    with pytest.raises(exceptions.Forbidden) as e:
        mine.blob("code/1.py").upload_from_string("x")
    assert said(e) == no_access(NODE_EMAIL, "storage.objects.create",
                                "Google Cloud Storage object")
    gcp.revoke(NODE, "roles/storage.legacyBucketReader", RES)
    with pytest.raises(exceptions.Forbidden) as e:
        list(mine.list_blobs())
    assert said(e) == no_access(NODE_EMAIL, "storage.objects.list")
