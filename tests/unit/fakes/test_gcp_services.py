"""The Service Usage and Cloud Quotas fakes (tests/fakes/gcp_services.py), driven by the real
client libraries over REST: exact records, the operation the client polls on the fake itself,
and every failure mode (401, 403 naming the permission, SERVICE_DISABLED, 400, 404, 409)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import cloudquotas_v1, service_usage_v1
from google.oauth2.credentials import Credentials

from tests.fakes.gcp_project import FakeProject
from tests.fakes.gcp_services import (
    CLOUD_QUOTAS,
    COMPUTE,
    NOOP,
    SERVICE_USAGE,
    FakeCloudQuotas,
    FakeServiceUsage,
)

P = "projects/test-project"
N = 123456789012
STRANGER = "user:stranger@example.com"
GPUS = "GPUS-ALL-REGIONS-per-project"
L4 = "NVIDIA-L4-GPUS-per-project-region"
LOC = f"{P}/locations/global"


def info_name(quota_id: str, project: str = P) -> str:
    return f"{project}/locations/global/services/{COMPUTE}/quotaInfos/{quota_id}"


@pytest.fixture
def project() -> FakeProject:
    return FakeProject(op_seconds=0.2)


@pytest.fixture
def su(project: FakeProject) -> Iterator[FakeServiceUsage]:
    with FakeServiceUsage(project) as fake:
        yield fake


@pytest.fixture
def cq(project: FakeProject) -> Iterator[FakeCloudQuotas]:
    project.enabled |= {CLOUD_QUOTAS, COMPUTE}
    with FakeCloudQuotas(project) as fake:
        yield fake


def creds(project: FakeProject, member: str | None = None) -> Credentials:
    return Credentials(token=project.token_for(member or project.owner))


def su_client(fake: FakeServiceUsage, member: str | None = None
              ) -> service_usage_v1.ServiceUsageClient:
    return service_usage_v1.ServiceUsageClient(
        credentials=creds(fake.project, member), transport="rest",
        client_options={"api_endpoint": fake.url})


def cq_client(fake: FakeCloudQuotas, member: str | None = None
              ) -> cloudquotas_v1.CloudQuotasClient:
    return cloudquotas_v1.CloudQuotasClient(
        credentials=creds(fake.project, member), transport="rest",
        client_options={"api_endpoint": fake.url})


def said(exc: exceptions.GoogleAPICallError) -> str:
    """The message of the error body the fake answered (the exception's own text adds the URL)."""
    assert exc.response is not None
    return str(exc.response.json()["error"]["message"])


def names(*services: str, project: str = P) -> list[str]:
    return [f"{project}/services/{s}" for s in services]


def states(response: Any) -> dict[str, str]:
    return {s.config.name: s.state.name for s in response.services}


# ---- Service Usage: batchGet ---------------------------------------------------------------
def test_batch_get_answers_with_the_project_number_whatever_the_request_said(
        su: FakeServiceUsage) -> None:
    got = su_client(su).batch_get_services(request={"parent": P, "names": [
        *names(COMPUTE), *names(SERVICE_USAGE, project=f"projects/{N}")]})
    first, second = got.services
    assert (first.name, first.parent, first.state.name) == (
        f"projects/{N}/services/{COMPUTE}", f"projects/{N}", "DISABLED")
    assert (first.config.name, first.config.title) == (COMPUTE, "Compute Engine API")
    assert (second.name, second.state.name) == (
        f"projects/{N}/services/{SERVICE_USAGE}", "ENABLED")
    call = su.project.calls[-1]
    assert (call["method"], call["mutating"], call["permission"], call["status"]) == (
        "GET", False, "serviceusage.services.get", 200)


def test_batch_get_refuses_bad_requests(su: FakeServiceUsage) -> None:
    client = su_client(su)
    with pytest.raises(exceptions.BadRequest, match="1 to 30 services; got 31"):
        client.batch_get_services(request={"parent": P, "names": names(COMPUTE) * 31})
    with pytest.raises(exceptions.BadRequest, match="is not under parent"):
        client.batch_get_services(request={"parent": P, "names": names(
            COMPUTE, project="projects/other")})
    with pytest.raises(exceptions.Forbidden,
                       match=r"Permission denied to get service \[bogus.googleapis.com\]"):
        client.batch_get_services(request={"parent": P, "names": names("bogus.googleapis.com")})


def test_batch_get_needs_serviceusage_services_get(su: FakeServiceUsage) -> None:
    request = {"parent": P, "names": names(COMPUTE)}
    with pytest.raises(exceptions.Forbidden) as caught:
        su_client(su, STRANGER).batch_get_services(request=request)
    assert said(caught.value) == ("Permission 'serviceusage.services.get' denied on resource "
                                    f"'{P}' (or it may not exist).")
    su.project.grant(STRANGER, "roles/serviceusage.serviceUsageViewer")
    assert states(su_client(su, STRANGER).batch_get_services(request=request)) == {
        COMPUTE: "DISABLED"}


def test_another_project_and_no_credentials_are_refused(su: FakeServiceUsage) -> None:
    with pytest.raises(exceptions.Forbidden, match="'projects/other-project'"):
        su_client(su).batch_get_services(request={
            "parent": "projects/other-project",
            "names": names(COMPUTE, project="projects/other-project")})
    # the client cannot send a call without a token: the wire can
    request = urllib.request.Request(f"{su.url}/v1/{P}/services:batchGet?names={P}/services/x")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401
    assert json.loads(caught.value.read())["error"]["status"] == "UNAUTHENTICATED"


def test_service_usage_itself_disabled_is_service_disabled(su: FakeServiceUsage) -> None:
    su.project.enabled.discard(SERVICE_USAGE)
    with pytest.raises(exceptions.Forbidden) as caught:
        su_client(su).batch_get_services(request={"parent": P, "names": names(COMPUTE)})
    assert caught.value.reason == "SERVICE_DISABLED"
    assert said(caught.value).startswith(
        f"Service Usage API has not been used in project {N} before or it is disabled.")


# ---- Service Usage: batchEnable and its operation ------------------------------------------
def test_batch_enable_is_an_operation_polled_on_the_fake(su: FakeServiceUsage) -> None:
    project = su.project
    project.op_seconds = 1.0  # long enough to look at the pending state on a loaded machine
    op = su_client(su).batch_enable_services(
        request={"parent": P, "service_ids": [COMPUTE, CLOUD_QUOTAS]})
    assert op.operation.name == f"operations/acf.p2-{N}-1" and not op.operation.done
    # not on before the operation is done: the other fakes still answer SERVICE_DISABLED
    assert COMPUTE not in project.enabled
    refusal = project.check(project.owner, "compute.instances.get", P, COMPUTE)
    assert refusal is not None and refusal[1]["error"]["details"][0]["reason"] == (
        "SERVICE_DISABLED")
    assert op.metadata.resource_names == [f"services/{CLOUD_QUOTAS}/projectSettings/{N}",
                                          f"services/{COMPUTE}/projectSettings/{N}"]
    assert states(op.result(timeout=10)) == {COMPUTE: "ENABLED", CLOUD_QUOTAS: "ENABLED"}
    assert {COMPUTE, CLOUD_QUOTAS} <= project.enabled
    polls = [c for c in project.calls if c["path"] == f"/v1/operations/acf.p2-{N}-1"]
    assert polls and all(not c["mutating"] for c in polls)
    assert [c["permission"] for c in project.mutations()] == ["serviceusage.services.enable"]


def test_the_operation_also_completes_unpolled(su: FakeServiceUsage) -> None:
    su_client(su).batch_enable_services(request={"parent": P, "service_ids": [COMPUTE]})
    deadline = time.time() + 5
    while COMPUTE not in su.project.enabled and time.time() < deadline:
        time.sleep(0.02)
    assert COMPUTE in su.project.enabled


def test_get_operation_polls_the_fake_too(su: FakeServiceUsage) -> None:
    su.project.op_seconds = 1.0
    client = su_client(su)
    op = client.batch_enable_services(request={"parent": P, "service_ids": [COMPUTE]})
    assert client.get_operation({"name": op.operation.name}).done is False
    time.sleep(1.05)
    assert client.get_operation({"name": op.operation.name}).done is True
    with pytest.raises(exceptions.NotFound, match="'operations/acf.p2-1-99' not found"):
        client.get_operation({"name": "operations/acf.p2-1-99"})


def test_enabling_what_is_on_is_a_done_noop_that_cannot_be_polled(su: FakeServiceUsage
                                                                   ) -> None:
    client = su_client(su)
    op = client.batch_enable_services(request={"parent": P, "service_ids": [SERVICE_USAGE]})
    assert (op.operation.name, op.operation.done) == (NOOP, True)
    assert states(op.result(timeout=1)) == {SERVICE_USAGE: "ENABLED"}
    with pytest.raises(exceptions.BadRequest, match="Invalid operation name"):
        client.get_operation({"name": NOOP})
    # still a mutating call: a second setup should have asked batchGet first
    assert len(su.project.mutations()) == 1


def test_batch_enable_refuses_more_than_20_and_changes_nothing(su: FakeServiceUsage) -> None:
    with pytest.raises(exceptions.BadRequest, match="1 to 20 services; got 21"):
        su_client(su).batch_enable_services(
            request={"parent": P, "service_ids": [COMPUTE] * 21})
    assert COMPUTE not in su.project.enabled and not su.project.operations


def test_batch_enable_without_billing_fails_the_call(su: FakeServiceUsage) -> None:
    su.project.billing_enabled = False  # type: ignore[attr-defined]
    with pytest.raises(exceptions.BadRequest) as caught:
        su_client(su).batch_enable_services(request={"parent": P, "service_ids": [
            "iam.googleapis.com", COMPUTE, "secretmanager.googleapis.com"]})
    assert said(caught.value) == (
        f"Billing account for project '{N}' is not found. Billing must be enabled for "
        "activation of service(s) 'compute.googleapis.com,secretmanager.googleapis.com' to "
        "proceed.")
    assert caught.value.reason == "UREQ_PROJECT_BILLING_NOT_FOUND"
    assert "iam.googleapis.com" not in su.project.enabled and not su.project.operations
    # services that need no billing are enabled without it
    op = su_client(su).batch_enable_services(
        request={"parent": P, "service_ids": ["iam.googleapis.com"]})
    assert states(op.result(timeout=10)) == {"iam.googleapis.com": "ENABLED"}


def test_batch_enable_of_an_unknown_service_is_denied(su: FakeServiceUsage) -> None:
    with pytest.raises(exceptions.Forbidden) as caught:
        su_client(su).batch_enable_services(
            request={"parent": P, "service_ids": [COMPUTE, "bogus.googleapis.com"]})
    assert said(caught.value) == "Permission denied to enable service [bogus.googleapis.com]"
    assert caught.value.reason == "AUTH_PERMISSION_DENIED"
    assert not su.project.operations


def test_batch_enable_needs_serviceusage_services_enable(su: FakeServiceUsage) -> None:
    su.project.grant(STRANGER, "roles/serviceusage.serviceUsageViewer")
    with pytest.raises(exceptions.Forbidden, match="'serviceusage.services.enable'"):
        su_client(su, STRANGER).batch_enable_services(
            request={"parent": P, "service_ids": [COMPUTE]})
    [call] = su.project.mutations()
    assert (call["member"], call["status"]) == (STRANGER, 403)
    su.project.grant(STRANGER, "roles/serviceusage.serviceUsageAdmin")
    op = su_client(su, STRANGER).batch_enable_services(
        request={"parent": f"projects/{N}", "service_ids": [COMPUTE]})
    assert states(op.result(timeout=10)) == {COMPUTE: "ENABLED"}


# ---- Service Usage: enable / disable one ---------------------------------------------------
def test_enable_pulls_in_dependencies_and_disable_refuses_a_depended_on_service(
        su: FakeServiceUsage) -> None:
    client = su_client(su)
    op = client.enable_service(request={"name": f"{P}/services/container.googleapis.com"})
    assert op.result(timeout=10).service.state.name == "ENABLED"
    assert {"container.googleapis.com", COMPUTE} <= su.project.enabled
    with pytest.raises(exceptions.BadRequest) as caught:
        client.disable_service(request={"name": f"{P}/services/{COMPUTE}"})
    assert said(caught.value) == (
        "The service compute.googleapis.com is depended on by the following active "
        "service(s): container.googleapis.com; Please specify disable_dependent_services=true "
        "if you want to proceed with disabling all services.")
    assert caught.value.reason == "COMMON_SU_SERVICE_HAS_DEPENDENT_SERVICES"
    su.project.op_seconds = 1.0
    op = client.disable_service(request={"name": f"{P}/services/{COMPUTE}",
                                         "disable_dependent_services": True})
    assert COMPUTE in su.project.enabled  # until the operation is done
    assert op.result(timeout=10).service.state.name == "DISABLED"
    assert not {"container.googleapis.com", COMPUTE} & su.project.enabled
    assert [c["permission"] for c in su.project.mutations()] == [
        "serviceusage.services.enable", "serviceusage.services.disable",
        "serviceusage.services.disable"]


def test_disabling_what_is_off_is_a_noop(su: FakeServiceUsage) -> None:
    op = su_client(su).disable_service(request={"name": f"{P}/services/{COMPUTE}"})
    assert (op.operation.name, op.result().service.state.name) == (NOOP, "DISABLED")


# ---- Cloud Quotas: quota infos -------------------------------------------------------------
def test_a_new_project_has_no_gpu_anywhere(cq: FakeCloudQuotas) -> None:
    info = cq_client(cq).get_quota_info(name=info_name(GPUS))
    assert info.name == info_name(GPUS, project=f"projects/{N}")
    assert (info.quota_id, info.metric, info.service) == (
        GPUS, "compute.googleapis.com/gpus_all_regions", COMPUTE)
    assert (info.is_precise, info.container_type.name, list(info.dimensions)) == (
        True, "PROJECT", [])
    [row] = info.dimensions_infos
    assert (dict(row.dimensions), row.details.value, list(row.applicable_locations)) == (
        {}, 0, ["global"])
    assert cq.project.calls[-1]["permission"] == "cloudquotas.quotas.get"


def test_a_regional_quota_lists_the_specific_region_first(cq: FakeCloudQuotas) -> None:
    cq.set_quota(L4, 4, region="us-central1")
    info = cq_client(cq).get_quota_info(name=info_name(L4))
    assert (info.metric, list(info.dimensions)) == ("compute.googleapis.com/nvidia_l4_gpus",
                                                    ["region"])
    specific, rest = info.dimensions_infos
    assert (dict(specific.dimensions), specific.details.value,
            list(specific.applicable_locations)) == ({"region": "us-central1"}, 4,
                                                     ["us-central1"])
    assert (dict(rest.dimensions), rest.details.value) == ({}, 1)
    assert "us-central1" not in rest.applicable_locations and "us-east4" in (
        rest.applicable_locations)


def test_quotas_need_the_cloud_quotas_api(cq: FakeCloudQuotas) -> None:
    cq.project.enabled.discard(CLOUD_QUOTAS)
    with pytest.raises(exceptions.Forbidden) as caught:
        cq_client(cq).get_quota_info(name=info_name(GPUS))
    assert caught.value.reason == "SERVICE_DISABLED"
    assert said(caught.value).startswith(
        f"Cloud Quotas API has not been used in project {N} before or it is disabled.")


def test_compute_quotas_are_not_found_before_compute_is_on(cq: FakeCloudQuotas) -> None:
    cq.project.enabled.discard(COMPUTE)
    with pytest.raises(exceptions.NotFound) as caught:
        cq_client(cq).get_quota_info(name=info_name(GPUS))
    assert said(caught.value) == (f"Limit '{GPUS}' does not exist or is not visible in the "
                                    "service 'compute.googleapis.com'.")
    cq.project.enabled.add(COMPUTE)
    with pytest.raises(exceptions.NotFound, match="Limit 'NO-SUCH-QUOTA' does not exist"):
        cq_client(cq).get_quota_info(name=info_name("NO-SUCH-QUOTA"))


def test_quota_reads_and_writes_need_their_permissions(cq: FakeCloudQuotas) -> None:
    with pytest.raises(exceptions.Forbidden, match="'cloudquotas.quotas.get'"):
        cq_client(cq, STRANGER).get_quota_info(name=info_name(GPUS))
    cq.project.grant(STRANGER, "roles/cloudquotas.viewer")
    assert cq_client(cq, STRANGER).get_quota_info(name=info_name(GPUS)).quota_id == GPUS
    with pytest.raises(exceptions.Forbidden, match="'cloudquotas.quotas.update'"):
        cq_client(cq, STRANGER).create_quota_preference(parent=LOC, quota_preference=gpu_pref(1))
    [call] = cq.project.mutations()
    assert (call["status"], call["permission"]) == (403, "cloudquotas.quotas.update")


# ---- Cloud Quotas: preferences -------------------------------------------------------------
def pref_of(**fields: Any) -> cloudquotas_v1.QuotaPreference:
    return cloudquotas_v1.QuotaPreference(**fields)


def gpu_pref(value: int, **extra: Any) -> cloudquotas_v1.QuotaPreference:
    return pref_of(**{"service": COMPUTE, "quota_id": GPUS,
                      "quota_config": {"preferred_value": value},
                      "justification": "nightly eval node", "contact_email": "ops@example.com",
                      **extra})


def test_an_increase_is_recorded_but_not_granted_until_approved(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    pref = client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(1),
                                          quota_preference_id="gpus-all-regions")
    assert pref.name == f"projects/{N}/locations/global/quotaPreferences/gpus-all-regions"
    assert (pref.reconciling, pref.quota_config.preferred_value, pref.quota_id) == (
        True, 1, GPUS)
    assert not pref.contact_email  # input only
    assert client.get_quota_info(name=info_name(GPUS)).dimensions_infos[0].details.value == 0
    [listed] = client.list_quota_preferences(parent=LOC)
    assert listed.name == pref.name and listed.reconciling
    cq.approve(pref.name)
    assert client.get_quota_info(name=info_name(GPUS)).dimensions_infos[0].details.value == 1
    [listed] = client.list_quota_preferences(parent=LOC)
    assert (listed.reconciling, listed.quota_config.granted_value) == (False, 1)
    assert [c["method"] for c in cq.project.mutations()] == ["POST"]


def test_a_denied_increase_keeps_the_quota(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    pref = client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(8))
    assert pref.name == f"projects/{N}/locations/global/quotaPreferences/pref-1"
    cq.deny(pref.name)
    [listed] = client.list_quota_preferences(parent=LOC)
    assert (listed.reconciling, listed.quota_config.granted_value,
            listed.quota_config.state_detail) == (False, 0, "The request was denied.")


def test_a_decrease_is_fulfilled_at_once(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    pref = client.create_quota_preference(parent=LOC, quota_preference=pref_of(**{
        "service": COMPUTE, "quota_id": L4, "quota_config": {"preferred_value": 0},
        "dimensions": {"region": "us-west4"}}))
    assert (pref.reconciling, pref.quota_config.granted_value) == (False, 0)
    rows = client.get_quota_info(name=info_name(L4)).dimensions_infos
    assert (dict(rows[0].dimensions), rows[0].details.value) == ({"region": "us-west4"}, 0)


def test_duplicate_preferences_are_409(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(1),
                                   quota_preference_id="gpus")
    with pytest.raises(exceptions.Conflict, match="quotaPreferences/gpus' already exists"):
        client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(2),
                                       quota_preference_id="gpus")
    with pytest.raises(exceptions.Conflict, match="already exists for quota"):
        client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(2),
                                       quota_preference_id="gpus-again")


def test_invalid_preferences_are_refused(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    with pytest.raises(exceptions.BadRequest, match="contact_email is required"):
        client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(
            1, contact_email=""))
    with pytest.raises(exceptions.BadRequest, match="are not dimensions of quota"):
        client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(
            1, dimensions={"region": "us-central1"}))
    with pytest.raises(exceptions.BadRequest, match="are required"):
        client.create_quota_preference(parent=LOC, quota_preference=pref_of(**{
            "service": COMPUTE, "quota_id": GPUS}))
    with pytest.raises(exceptions.NotFound, match="Limit 'NOPE' does not exist"):
        client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(1, quota_id="NOPE"))
    assert not list(client.list_quota_preferences(parent=LOC))


def test_list_filters_on_reconciling(cq: FakeCloudQuotas) -> None:
    client = cq_client(cq)
    client.create_quota_preference(parent=LOC, quota_preference=gpu_pref(1))
    client.create_quota_preference(parent=LOC, quota_preference=pref_of(**{
        "service": COMPUTE, "quota_id": L4, "quota_config": {"preferred_value": 0}}))
    pending = client.list_quota_preferences(request={"parent": LOC,
                                                     "filter": "reconciling=true"})
    assert [p.quota_id for p in pending] == [GPUS]
    with pytest.raises(exceptions.BadRequest, match="Unsupported filter"):
        list(client.list_quota_preferences(request={"parent": LOC, "filter": "etag=x"}))
