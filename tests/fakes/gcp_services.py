"""Fakes of Service Usage v1 (which APIs a project has on; enabling them) and Cloud Quotas v1 (a
quota's value; asking for more) at their REST wire, over the shared FakeProject (gcp_project.py),
for the real clients google-cloud-service-usage 1.18.0 and google-cloud-quotas 0.6.3
(`transport="rest"`; paths as in their transports/rest_base.py).

Sources (read 2026-12):
[su-ref] cloud.google.com/service-usage/docs/reference/rest/v1/services, service_usage_v1/types/
  serviceusage.py: batchGet takes at most 30 names under `parent`; batchEnable at most 20 ids
  ("the request will fail, and no state changes will occur"); (batch)enable/disable answer an
  Operation, polled at GET /v1/operations/*.
[su-iam] service-usage/docs/access-control, iam/docs/roles-permissions/serviceusage: enabling
  needs serviceusage.services.enable, disabling ….disable, (batch)get ….get; serviceUsageAdmin
  also holds serviceusage.operations.get and cloudquotas.quotas.get/update.
[su-names] Names come back with the project NUMBER ("projects/123/services/x", parent
  "projects/123") whichever form the request used (the reference's examples).
[su-noop] Enabling what is on answers "operations/noop.DONE_OPERATION", done at once with its
  response, and that name cannot be polled (400). Real names: "operations/acf.p2-<number>-<id>"
  (GoogleCloudPlatform samples' ServiceUsage class; clients that special-case the noop).
[su-billing] A service that needs billing, on a project without it, fails the CALL (not the
  operation): 400 FAILED_PRECONDITION "Billing account for project 'N' is not found. Billing must
  be enabled for activation of service(s) 'a,b' to proceed.", PreconditionFailure + ErrorInfo
  UREQ_PROJECT_BILLING_NOT_FOUND (kyegomez/zeta#71; terraform-google-modules project-factory:
  "failed on request preconditions: googleapi: Error 400: Billing account…"). compute and
  secretmanager need billing; iam, cloudresourcemanager, serviceusage do not.
[su-denied] An unknown service looks like a forbidden one: 403 "Permission denied to enable
  service [x]" ("…to get service [x]"), ErrorInfo AUTH_PERMISSION_DENIED (gcloud's text).
[su-deps] Disabling a service others depend on: 400 FAILED_PRECONDITION "The service X is
  depended on by the following active service(s): Y; Please specify
  disable_dependent_services=true if you want to proceed with disabling all services."
  (COMMON_SU_SERVICE_HAS_DEPENDENT_SERVICES); enabling one enables what it depends on. Modelled
  edge: container → compute only; check_if_service_has_usage is ignored.
[cq-ref] cloud.google.com/docs/quotas/reference/rest, cloudquotas_v1/types/resources.py:
  QuotaInfo {name, quotaId, metric, service, isPrecise, containerType, dimensions,
  dimensionsInfos[{dimensions, details{value}, applicableLocations}] most specific first};
  int64 values are JSON strings. Names carry the project number, as [su-names].
[cq-ids] Ids and metrics as Compute's QUOTA_EXCEEDED errors print them ("metric name =
  compute.googleapis.com/gpus_all_regions, limit name = GPUS-ALL-REGIONS-per-project";
  compute.googleapis.com/cpus, CPUS-per-project-region) and live projects list them
  (NVIDIA-L4-GPUS-per-project-region, PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region: one
  undimensioned row for every region). compute.googleapis.com/preemptible_nvidia_l4_gpus follows
  the pattern, unseen verbatim.
[cq-pref] "Quota increase adjustments are subject to approval and fulfillment. Quota decreases
  are fulfilled immediately" (gcloud alpha quotas preferences); reconciling = "pending Google
  Cloud approval"; contact_email "is required" for an increase; "only one QuotaPreference
  resource for a quota value targeting a unique set of dimensions" (another is 409).
[cq-404] An unknown quota: 404 "Limit '…' does not exist or is not visible in the service '…'."
  (hashicorp/terraform-provider-google#18337); compute's quotas before the Compute API is on:
  the same 404 (the reading harder on the caller).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.gcp_project import ROLES, TITLES, FakeProject, Reply, error, error_info
from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

# [su-iam] only permissions the real roles hold (cloudquotas.viewer: the Cloud Quotas viewer role)
ROLES.update({"roles/serviceusage.serviceUsageAdmin": frozenset({
    "serviceusage.services.enable", "serviceusage.services.disable", "serviceusage.services.get",
    "serviceusage.services.list", "serviceusage.operations.get", "cloudquotas.quotas.get",
    "cloudquotas.quotas.update"}),
    "roles/serviceusage.serviceUsageViewer": frozenset({"serviceusage.services.get",
                                                        "serviceusage.services.list"}),
    "roles/cloudquotas.viewer": frozenset({"cloudquotas.quotas.get"})})

SERVICE_USAGE, CLOUD_QUOTAS, COMPUTE = (
    f"{name}.googleapis.com" for name in ("serviceusage", "cloudquotas", "compute"))
KNOWN = {**TITLES, **{f"{k}.googleapis.com": v for k, v in (
    ("container", "Kubernetes Engine"), ("oslogin", "Cloud OS Login"), ("logging", "Cloud Logging"),
    ("monitoring", "Cloud Monitoring"), ("storage-api", "Google Cloud Storage JSON"),
    ("iamcredentials", "IAM Service Account Credentials"), ("cloudbilling", "Cloud Billing"))}}
NEEDS_BILLING = frozenset({COMPUTE, "secretmanager.googleapis.com", "container.googleapis.com"})
DEPENDS_ON = {"container.googleapis.com": (COMPUTE,)}  # [su-deps]
MAX_GET, MAX_ENABLE = 30, 20  # [su-ref]
NOOP = "operations/noop.DONE_OPERATION"
SU_TYPE = "type.googleapis.com/google.api.serviceusage.v1."
REGIONS = ("asia-east1", "europe-west1", "europe-west4", "us-central1", "us-east1", "us-east4",
           "us-west1", "us-west4")


def billing_enabled(project: FakeProject) -> bool:
    """Whether the project has a billing account (tests set `project.billing_enabled`)."""
    return bool(getattr(project, "billing_enabled", True))


def _bad(message: str) -> Reply:
    return error(400, "INVALID_ARGUMENT", message)


class _Api(Served):
    """One REST API: each call is routed, checked (401, SERVICE_DISABLED, the permission on the
    project its path names), answered and recorded."""

    api: str
    service: str
    routes: tuple[tuple[str, str, str, str, bool], ...]  # verb, path, method, permission, mutating

    def __init__(self, project: FakeProject) -> None:
        self.project = project
        self.http = LoopbackServer(_handler(self))

    def canonical(self, project: str) -> str | None:
        """The project id a path names by id or number, or None for another project."""
        p = self.project
        return p.project if project in (p.project, str(p.number)) else None

    def dispatch(self, verb: str, target: str, raw: bytes, authorization: str | None) -> Reply:
        url = urlsplit(target)
        member = self.project.member(authorization)
        body = json.loads(raw) if raw else {}
        found = [(r, m) for r in self.routes
                 if r[0] == verb and (m := re.fullmatch(r[1], url.path))]
        if not found:
            return error(404, "NOT_FOUND", f"The requested URL {url.path} was not found.")
        (_, _, name, permission, mutating), match = found[0]
        named = match.groupdict().get("p", self.project.project)  # operations/…: this project's
        project = self.canonical(named)
        resource = f"projects/{project or named}"
        reply = self.project.check(member, permission, resource, self.service)
        if reply is None and project is None:  # someone else's project, or none: Google's 403
            reply = self.project.denied(permission, resource)
        if reply is None:
            reply = getattr(self, name)(match, parse_qs(url.query), body)
        self.project.record(self.api, verb, url.path, member, mutating=mutating,
                            permission=permission, status=reply[0], body=body or None)
        return reply


def _handler(fake: _Api) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def serve(self) -> None:
            raw = self.read_body() if self.command != "GET" else b""
            self.send_json(*fake.dispatch(self.command, self.path, raw,
                                          self.headers.get("Authorization")))

        do_GET = do_POST = serve  # noqa: N815

    return Handler


# ---- Service Usage -----------------------------------------------------------------------
_SVC = r"/v1/projects/(?P<p>[^/]+)/services"
SU_GET, SU_ENABLE, SU_DISABLE = (f"serviceusage.services.{v}" for v in ("get", "enable", "disable"))


class FakeServiceUsage(_Api):
    """Service Usage v1. Enabling (and disabling) takes effect on `project.enabled` only when
    its operation is done (`project.op_seconds`); until then the other fakes still answer
    SERVICE_DISABLED."""

    api, service = "serviceusage", SERVICE_USAGE
    routes = (("GET", _SVC + ":batchGet", "batch_get", SU_GET, False),
              ("POST", _SVC + ":batchEnable", "batch_enable", SU_ENABLE, True),
              ("POST", _SVC + "/([^/:]+):enable", "enable_one", SU_ENABLE, True),
              ("POST", _SVC + "/([^/:]+):disable", "disable_one", SU_DISABLE, True),
              ("GET", _SVC + "/([^/:]+)", "get_one", SU_GET, False),
              ("GET", "/v1/(operations/[^/]+)", "get_operation", "serviceusage.operations.get",
               False))

    def __init__(self, project: FakeProject) -> None:
        super().__init__(project)
        # operation name → (services it turns on, services it turns off)
        self.pending: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    # -- state -----------------------------------------------------------------------------
    def settle(self) -> None:
        """Apply every operation whose time has come (also run by a timer at that time)."""
        with self.project.lock:
            now = time.time()
            for name, (on, off) in list(self.pending.items()):
                if self.project.operations[name].done_at <= now:
                    for service in on - self.project.enabled:
                        self.project.serving_from[service] = (
                            now + self.project.propagation_seconds)
                    self.project.enabled |= on
                    self.project.enabled -= off
                    del self.pending[name]

    def _settle_at(self, when: float) -> None:
        time.sleep(max(0.0, when - time.time()))
        self.settle()

    def record_of(self, service: str) -> dict[str, Any]:
        parent = f"projects/{self.project.number}"  # [su-names]
        state = "ENABLED" if service in self.project.enabled else "DISABLED"
        return {"name": f"{parent}/services/{service}", "parent": parent, "state": state,
                "config": {"name": service, "title": f"{KNOWN[service]} API"}}

    def _unknown(self, services: list[str], verb: str) -> Reply | None:
        unknown = [f"Permission denied to {verb} service [{s}]" for s in services if s not in KNOWN]
        return error(403, "PERMISSION_DENIED", "\n".join(unknown), error_info(
            "AUTH_PERMISSION_DENIED", SERVICE_USAGE)) if unknown else None

    def _billing(self, services: list[str]) -> Reply | None:
        billed = [s for s in services if s in NEEDS_BILLING and s not in self.project.enabled]
        if not billed or billing_enabled(self.project):
            return None
        n, joined = self.project.number, ",".join(billed)
        subject = f"?error_code=390001&project={n}" + "".join(f"&services={s}" for s in billed)
        return error(400, "FAILED_PRECONDITION", f"Billing account for project '{n}' is not "
                     f"found. Billing must be enabled for activation of service(s) '{joined}' "
                     "to proceed.",
                     {"@type": "type.googleapis.com/google.rpc.PreconditionFailure",
                      "violations": [{"type": "googleapis.com/billing-enabled",
                                      "subject": subject}]},
                     error_info("UREQ_PROJECT_BILLING_NOT_FOUND",
                                "serviceusage.googleapis.com/billing-enabled",
                                project=str(n), services=joined))

    def _operation(self, kind: str, response: dict[str, Any], on: frozenset[str],
                   off: frozenset[str]) -> Reply:
        response = {"@type": SU_TYPE + kind, **response}
        if not (on - self.project.enabled) and not (off & self.project.enabled):
            return 200, {"name": NOOP, "done": True, "response": response}  # [su-noop]
        touched = sorted(on | off)
        op = self.project.operation(
            f"operations/acf.p2-{self.project.number}-", response,
            metadata={"@type": SU_TYPE + "OperationMetadata", "resourceNames": [
                f"services/{s}/projectSettings/{self.project.number}" for s in touched]})
        with self.project.lock:
            self.pending[op.name] = (on, off)
        # applied when due even if nobody polls (the other fakes read project.enabled)
        threading.Thread(target=self._settle_at, args=(op.done_at,), daemon=True).start()
        return 200, op.to_json()

    # -- endpoints -------------------------------------------------------------------------
    def batch_get(self, match: re.Match[str], query: dict[str, list[str]], _: Any) -> Reply:
        names = query.get("names", [])
        if not names or len(names) > MAX_GET:
            return _bad(f"names must hold 1 to {MAX_GET} services; got {len(names)}.")
        services = []
        for name in names:
            m = re.fullmatch(r"projects/([^/]+)/services/([^/]+)", name)
            if not m or self.canonical(m.group(1)) is None:
                return _bad(f"Service name '{name}' is not under parent "
                            f"'projects/{match.group(1)}'.")
            services.append(m.group(2))
        self.settle()
        return self._unknown(services, "get") or (
            200, {"services": [self.record_of(s) for s in services]})

    def get_one(self, match: re.Match[str], *_: Any) -> Reply:
        self.settle()
        return self._unknown([match.group(2)], "get") or (200, self.record_of(match.group(2)))

    def batch_enable(self, match: re.Match[str], _: Any, body: dict[str, Any]) -> Reply:
        ids = list(body.get("serviceIds", []))
        if not ids or len(ids) > MAX_ENABLE:
            return _bad(f"service_ids must hold 1 to {MAX_ENABLE} services; got {len(ids)}. No "
                        "state changes occurred.")
        return self._enable(ids, "BatchEnableServicesResponse")

    def enable_one(self, match: re.Match[str], *_: Any) -> Reply:
        return self._enable([match.group(2)], "EnableServiceResponse")

    def _enable(self, ids: list[str], kind: str) -> Reply:
        self.settle()
        closure = list(dict.fromkeys(d for s in ids for d in (*DEPENDS_ON.get(s, ()), s)))
        fail = self._unknown(ids, "enable") or self._billing(closure)
        if fail:
            return fail
        states = [{**self.record_of(s), "state": "ENABLED"} for s in ids]
        response = {"services": states} if kind.startswith("Batch") else {"service": states[0]}
        return self._operation(kind, response, frozenset(closure), frozenset())

    def disable_one(self, match: re.Match[str], _: Any, body: dict[str, Any]) -> Reply:
        service = match.group(2)
        self.settle()
        fail = self._unknown([service], "disable")
        if fail:
            return fail
        dependents = sorted(s for s, deps in DEPENDS_ON.items()
                            if service in deps and s in self.project.enabled)
        if dependents and not body.get("disableDependentServices"):
            return error(400, "FAILED_PRECONDITION", f"The service {service} is depended on by "
                         f"the following active service(s): {','.join(dependents)}; Please "
                         "specify disable_dependent_services=true if you want to proceed with "
                         "disabling all services.",
                         error_info("COMMON_SU_SERVICE_HAS_DEPENDENT_SERVICES", SERVICE_USAGE))
        state = {**self.record_of(service), "state": "DISABLED"}
        return self._operation("DisableServiceResponse", {"service": state}, frozenset(),
                               frozenset({service, *dependents}))

    def get_operation(self, match: re.Match[str], *_: Any) -> Reply:
        name = match.group(1)
        if name == NOOP:
            return _bad(f"Invalid operation name: {name}.")  # [su-noop]
        self.settle()
        op = self.project.operations.get(name)
        if op is None:
            return error(404, "NOT_FOUND", f"Operation '{name}' not found.")
        return 200, op.to_json()


# ---- Cloud Quotas ------------------------------------------------------------------------
@dataclass
class Quota:
    """One quota: its value everywhere (`default`) and per region where set."""
    quota_id: str
    metric: str
    display: str
    regional: bool
    default: int
    regions: dict[str, int] = field(default_factory=dict)

    def value(self, region: str | None) -> int:
        return self.regions.get(region or "", self.default)

    def dimensions_infos(self) -> list[dict[str, Any]]:
        if not self.regional:
            return [{"details": {"value": str(self.default)}, "applicableLocations": ["global"]}]
        rows = [{"dimensions": {"region": r}, "details": {"value": str(v)},
                 "applicableLocations": [r]} for r, v in sorted(self.regions.items())]
        rest = [r for r in REGIONS if r not in self.regions]
        return rows + [{"details": {"value": str(self.default)}, "applicableLocations": rest}]


def compute_quotas() -> dict[str, Quota]:
    """[cq-ids] a new project's compute quotas: no GPU anywhere until GPUS-ALL-REGIONS is raised."""
    return {q.quota_id: q for q in (
        Quota("GPUS-ALL-REGIONS-per-project", "compute.googleapis.com/gpus_all_regions",
              "GPUs (all regions)", False, 0),
        Quota("NVIDIA-L4-GPUS-per-project-region", "compute.googleapis.com/nvidia_l4_gpus",
              "NVIDIA L4 GPUs", True, 1),
        Quota("PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region",
              "compute.googleapis.com/preemptible_nvidia_l4_gpus", "Preemptible NVIDIA L4 GPUs",
              True, 1),
        Quota("CPUS-per-project-region", "compute.googleapis.com/cpus", "CPUs", True, 24))}


_LOC = r"/v1/projects/(?P<p>[^/]+)/locations/([^/]+)"
QUOTA_GET, QUOTA_UPDATE = "cloudquotas.quotas.get", "cloudquotas.quotas.update"


class FakeCloudQuotas(_Api):
    """Cloud Quotas v1 for compute.googleapis.com's quotas. Test controls: `set_quota`,
    `approve`, `deny`."""

    api, service = "cloudquotas", CLOUD_QUOTAS
    routes = (("GET", _LOC + "/services/([^/]+)/quotaInfos/([^/]+)", "get_quota_info",
               QUOTA_GET, False),
              ("GET", _LOC + "/quotaPreferences", "list_preferences", QUOTA_GET, False),
              ("POST", _LOC + "/quotaPreferences", "create_preference", QUOTA_UPDATE, True))

    def __init__(self, project: FakeProject) -> None:
        super().__init__(project)
        self.quotas = compute_quotas()
        self.preferences: dict[str, dict[str, Any]] = {}  # id → QuotaPreference JSON
        self._ids = itertools.count(1)

    # -- test controls ---------------------------------------------------------------------
    def set_quota(self, quota_id: str, value: int, region: str | None = None) -> None:
        """The quota's value in `region`, or everywhere no region of its own says otherwise."""
        with self.project.lock:
            if region is None:
                self.quotas[quota_id].default = value
            else:
                self.quotas[quota_id].regions[region] = value

    def approve(self, preference: str, value: int | None = None) -> None:
        """Google grants the preference (its preferred value, or `value`): the quota changes."""
        with self.project.lock:
            pref = self.preferences[preference.rsplit("/", 1)[-1]]
            granted = int(pref["quotaConfig"]["preferredValue"]) if value is None else value
            self.set_quota(pref["quotaId"], granted, pref.get("dimensions", {}).get("region"))
            self._settle(pref, granted, "")

    def deny(self, preference: str, detail: str = "The request was denied.") -> None:
        with self.project.lock:
            pref = self.preferences[preference.rsplit("/", 1)[-1]]
            current = self.quotas[pref["quotaId"]].value(pref.get("dimensions", {}).get("region"))
            self._settle(pref, current, detail)

    def _settle(self, pref: dict[str, Any], granted: int, detail: str) -> None:
        pref.update(reconciling=False, updateTime=_now(), etag=f"e{next(self._ids)}")
        pref["quotaConfig"].update(grantedValue=str(granted), **({"stateDetail": detail}
                                                                 if detail else {}))

    # -- endpoints -------------------------------------------------------------------------
    def _quota(self, service: str, quota_id: str) -> Quota | Reply:
        # [cq-404] only compute's quotas are modelled; they are not visible before compute is on
        quota = self.quotas.get(quota_id) if service == COMPUTE else None
        if quota is None or service not in self.project.enabled:
            return error(404, "NOT_FOUND", f"Limit '{quota_id}' does not exist or is not "
                         f"visible in the service '{service}'.")
        return quota

    def get_quota_info(self, match: re.Match[str], *_: Any) -> Reply:
        location, service, quota_id = match.groups()[1:]
        if location != "global":
            return _bad(f"The location must be 'global', not '{location}'.")
        quota = self._quota(service, quota_id)
        if not isinstance(quota, Quota):
            return quota
        eligible = {"isEligible": True} if billing_enabled(self.project) else {
            "isEligible": False, "ineligibilityReason": "NO_VALID_BILLING_ACCOUNT"}
        return 200, {
            "name": f"projects/{self.project.number}/locations/global/services/{service}/"
                    f"quotaInfos/{quota_id}",
            "quotaId": quota_id, "metric": quota.metric, "service": service, "isPrecise": True,
            "containerType": "PROJECT", "dimensions": ["region"] if quota.regional else [],
            "metricDisplayName": quota.display, "quotaDisplayName": quota.display,
            "metricUnit": "1", "quotaIncreaseEligibility": eligible,
            "dimensionsInfos": quota.dimensions_infos(),
            "serviceRequestQuotaUri": "https://console.cloud.google.com/iam-admin/quotas"}

    def list_preferences(self, match: re.Match[str], query: dict[str, list[str]], _: Any
                         ) -> Reply:
        terms: list[tuple[str, str]] = []
        for term in filter(None, (query.get("filter") or [""])[0].split(" AND ")):
            key, _eq, value = term.partition("=")
            key = {"quota_id": "quotaId"}.get(key.strip(), key.strip())
            if key not in ("service", "quotaId", "reconciling"):
                return _bad(f"Unsupported filter: {term}")
            terms.append((key, value.strip().strip('"')))
        prefs = [p for p in self.preferences.values()
                 if all(str(p.get(k, False)).lower() == v.lower() for k, v in terms)]
        return 200, {"quotaPreferences": prefs} if prefs else {}

    def create_preference(self, match: re.Match[str], query: dict[str, list[str]],
                          body: dict[str, Any]) -> Reply:
        if match.group(2) != "global":
            return _bad(f"The location must be 'global', not '{match.group(2)}'.")
        service, quota_id = body.get("service", ""), body.get("quotaId", "")
        # proto3 JSON leaves out a preferred value of 0: present config, absent value, means 0
        config = body.get("quotaConfig")
        preferred = int(config.get("preferredValue", 0)) if config is not None else None
        if not service or not quota_id or preferred is None or preferred < -1:
            return _bad("service, quota_id and quota_config.preferred_value (>= -1) are "
                        "required.")
        quota = self._quota(service, quota_id)
        if not isinstance(quota, Quota):
            return quota
        dims = dict(body.get("dimensions", {}))
        if set(dims) - ({"region"} if quota.regional else set()):
            return _bad(f"Dimensions {sorted(dims)} are not dimensions of quota '{quota_id}'.")
        return self._record_preference(query, body, quota, dims, preferred)

    def _record_preference(self, query: dict[str, list[str]], body: dict[str, Any],
                           quota: Quota, dims: dict[str, str], preferred: int) -> Reply:
        pid = (query.get("quotaPreferenceId") or [f"pref-{next(self._ids)}"])[0]
        name = f"projects/{self.project.number}/locations/global/quotaPreferences/{pid}"
        with self.project.lock:
            if pid in self.preferences:
                return error(409, "ALREADY_EXISTS", f"QuotaPreference '{name}' already exists.")
            same = [p["name"] for p in self.preferences.values()
                    if (p["quotaId"], p.get("dimensions", {})) == (quota.quota_id, dims)]
            if same:
                return error(409, "ALREADY_EXISTS", f"QuotaPreference '{same[0]}' already "
                             f"exists for quota '{quota.quota_id}' and dimensions {dims}.")
            increase = preferred == -1 or preferred > quota.value(dims.get("region"))
            if increase and not body.get("contactEmail"):
                return _bad("contact_email is required when requesting a quota increase.")
            pref: dict[str, Any] = {
                "name": name, "service": body["service"], "quotaId": quota.quota_id,
                "quotaConfig": {"preferredValue": str(preferred),
                                "requestOrigin": "ORIGIN_UNSPECIFIED"},
                "etag": f"e{next(self._ids)}", "createTime": _now(), "updateTime": _now(),
                "reconciling": increase, "justification": body.get("justification", "")}
            if dims:
                pref["dimensions"] = dims
            self.preferences[pid] = pref
            if not increase:  # [cq-pref] a decrease is fulfilled at once
                self.set_quota(quota.quota_id, preferred, dims.get("region"))
                self._settle(pref, preferred, "")
            return 200, pref


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
