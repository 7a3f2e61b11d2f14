"""Fakes of the IAM admin API v1 (service accounts; gRPC, as google-cloud-iam 2.27.0's IAMClient
ships only gRPC transports) and the Resource Manager API v3 (projects; REST), both on one
FakeProject (tests/fakes/gcp_project.py). Also the REST plumbing and the policy rules that
tests/fakes/gcp_secrets.py shares.

Sources (read 2026-12):
  [grpc]    google/cloud/iam_admin_v1/services/iam/transports/grpc.py (google-cloud-iam 2.27.0):
            service google.iam.admin.v1.IAM, the request/response types of each method
            (GetIamPolicy/SetIamPolicy take google.iam.v1 iam_policy_pb2 requests); errors are
            gRPC statuses, details (ErrorInfo) in the `grpc-status-details-bin` trailer, which
            google-api-core's _parse_grpc_error_details reads into `.reason`/`.error_info`.
  [sa]      types/iam.py ServiceAccount and CreateServiceAccountRequest: account_id "must be
            6-30 characters long, and match the regular expression [a-z]([-a-z0-9]*[a-z0-9])";
            email ID@PROJECT.iam.gserviceaccount.com; display_name ≤ 100 bytes, description ≤ 256;
            `projects/-/serviceAccounts/X` for a missing X answers 403, not 404. Texts seen on the
            wire: 'The account ID "X" does not have a length between 6 and 30.' (google/litmus#107),
            'X does not match [a-z][a-z\\d\\-]*[a-z\\d].' (cloud-code-intellij#2062), 409
            "Service account X already exists within project projects/P." with a ResourceInfo
            (ansible#54422), 404 "Unknown service account" (googleCloudRunner#146), 403
            "Permission 'P' denied on resource (or it may not exist)." + ErrorInfo
            IAM_PERMISSION_DENIED, domain iam.googleapis.com, metadata.permission
            (everycure-org/matrix#75, google-github-actions/auth#340).
            ListServiceAccountsRequest.page_size: default 20, max 100.
  [consist] cloud.google.com/iam/docs/service-accounts-create: "After you create a service
            account, you might need to wait for 60 seconds or more before you use the service
            account." Here, for `sa_propagation_seconds`, a new account is not found by get/list
            /its own getIamPolicy (the harder reading; terraform-provider-google polls after
            create for this) and a policy naming it is refused 400 INVALID_ARGUMENT "Service
            account EMAIL does not exist." (the text of gcloud projects add-iam-policy-binding,
            GoogleCloudPlatform/generative-ai#944; googleapi Error 400 on other resources,
            Liscor/terraform_dataform_ga4_pipeline#1). A deleted account's bindings become
            "deleted:serviceAccount:EMAIL?uid=ID" (cloud.google.com/iam/docs/service-accounts-
            delete-undelete) and do not apply to a new account of the same email.
            The Compute default account N-compute@developer.gserviceaccount.com exists once
            compute.googleapis.com is enabled (cloud.google.com/compute/docs/access/service-
            accounts#default_service_account).
  [rm]      cloud.google.com/resource-manager/reference/rest/v3/projects (get, getIamPolicy,
            setIamPolicy) and resourcemanager_v3/services/projects/transports/rest_base.py:
            GET /v3/projects/P, POST /v3/projects/P:getIamPolicy|:setIamPolicy. setIamPolicy
            constraints (its reference page): no allUsers/allAuthenticatedUsers; "A user cannot
            be granted the owner role using setIamPolicy()" (400 INVALID_ARGUMENT "Request
            contains an invalid argument." + ProjectIamPolicyError SOLO_MUST_INVITE_OWNERS,
            googleapis/google-api-python-client#537); outside an organization "Calling
            setIamPolicy() to remove the last ToS-accepted owner from the policy will fail" (the
            detail's type name SOLO_REQUIRE_TOS_ACCEPTOR is this fake's guess). A role the
            resource does not take: 400 "Role roles/X is not supported for this resource."
            (stackdriver-metrics-export#7, googleapis/google-cloud-python#10499). A stale etag:
            409 ABORTED "There were concurrent policy changes. Please retry the whole read-modify-
            write with exponential backoff." (+ v3: "The request's ETag 'A' did not match the
            current policy's ETag 'B'.", pulumi/pulumi-google-native#862). A missing permission:
            "Permission 'P' denied on resource '//cloudresourcemanager.googleapis.com/projects/X'
            (or it may not exist)." (CrowdStrike/falcon-integration-gateway#98); an unknown
            project answers the same 403.
Not modelled: policy conditions, audit configs, keys, undelete, the 100-account quota.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import grpc
from google.cloud.iam_admin_v1 import types
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import any_pb2, empty_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from tests.fakes.gcp_project import OWNER, ROLES, FakeProject, Policy, Reply, error, error_info
from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

# cloud.google.com/iam/docs/roles-permissions/iam, /resourcemanager, /secretmanager: a subset
# of each role's permissions, merged into ROLES (a union, so another fake's subset survives)
EXTRA_ROLES: dict[str, frozenset[str]] = {
    "roles/iam.serviceAccountAdmin": frozenset({
        "iam.serviceAccounts.create", "iam.serviceAccounts.delete", "iam.serviceAccounts.get",
        "iam.serviceAccounts.list", "iam.serviceAccounts.getIamPolicy",
        "iam.serviceAccounts.setIamPolicy", "iam.serviceAccounts.update",
        "resourcemanager.projects.get"}),
    "roles/iam.serviceAccountViewer": frozenset({
        "iam.serviceAccounts.get", "iam.serviceAccounts.list", "resourcemanager.projects.get"}),
    "roles/resourcemanager.projectIamAdmin": frozenset({
        "resourcemanager.projects.get", "resourcemanager.projects.getIamPolicy",
        "resourcemanager.projects.setIamPolicy"}),
    "roles/browser": frozenset({"resourcemanager.projects.get",
                                "resourcemanager.projects.getIamPolicy"}),
    "roles/secretmanager.admin": frozenset({
        "secretmanager.secrets.create", "secretmanager.secrets.delete",
        "secretmanager.secrets.get", "secretmanager.secrets.list",
        "secretmanager.secrets.update", "secretmanager.secrets.getIamPolicy",
        "secretmanager.secrets.setIamPolicy", "secretmanager.versions.access",
        "secretmanager.versions.add", "secretmanager.versions.destroy",
        "secretmanager.versions.disable", "secretmanager.versions.enable",
        "secretmanager.versions.get", "secretmanager.versions.list",
        "resourcemanager.projects.get"}),
    "roles/secretmanager.secretVersionAdder": frozenset({"secretmanager.versions.add"}),
    "roles/secretmanager.secretVersionManager": frozenset({
        "secretmanager.versions.add", "secretmanager.versions.destroy",
        "secretmanager.versions.disable", "secretmanager.versions.enable",
        "secretmanager.versions.get", "secretmanager.versions.list"}),
}
for _role, _perms in EXTRA_ROLES.items():
    ROLES[_role] = ROLES.get(_role, frozenset()) | _perms

IAM = "iam.googleapis.com"
RM = "cloudresourcemanager.googleapis.com"
ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
SA_NAME = re.compile(r"^projects/([^/]+)/serviceAccounts/([^/]+)$")
# "roles/<service>.<name>", a basic role, or a custom role: what a policy may name at all
ROLE_NAME = re.compile(r"^(roles/(owner|editor|viewer|browser)|roles/[a-z][a-zA-Z0-9]*\.[\w.]+"
                       r"|(projects|organizations)/[^/]+/roles/[\w.]+)$")
MEMBER = re.compile(r"^(user|serviceAccount|group|domain|principal|principalSet|deleted:user"
                    r"|deleted:serviceAccount|deleted:group):.+$")
BASIC = frozenset({OWNER, "roles/editor", "roles/viewer"})
ABORTED = ("There were concurrent policy changes. Please retry the whole read-modify-write with "
           "exponential backoff.")
HTTP = {grpc.StatusCode.OK: 200, grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
        grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.ABORTED: 409}


# ---- policy rules shared by every setIamPolicy ---------------------------------------------
def bindings_of(policy: dict[str, Any]) -> dict[str, set[str]]:
    """A policy's JSON (or MessageToDict) bindings as role → members."""
    out: dict[str, set[str]] = {}
    for b in policy.get("bindings") or ():
        out.setdefault(b.get("role", ""), set()).update(b.get("members") or ())
    return out


def policy_problem(bindings: dict[str, set[str]], current: Policy, etag: str | None, *,
                   role_ok: Callable[[str], bool], account_ok: Callable[[str], bool],
                   etag_detail: bool = False) -> Reply | None:
    """[rm][consist] why a setIamPolicy must be refused, or None: a stale etag (none: a blind
    overwrite, as documented), a role the resource does not take, a malformed member, a service
    account that does not exist (yet)."""
    if etag and etag != current.etag:
        detail = (f" The request's ETag '{etag}' did not match the current policy's ETag "
                  f"'{current.etag}'." if etag_detail else "")
        return error(409, "ABORTED", ABORTED + detail)
    for role, members in sorted(bindings.items()):
        if not ROLE_NAME.match(role) or not role_ok(role):
            return error(400, "INVALID_ARGUMENT", f"Role {role} is not supported for this "
                         "resource.")
        for m in sorted(members):
            if not MEMBER.match(m):
                return error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
            if m.startswith("serviceAccount:") and not account_ok(m.split(":", 1)[1]):
                return error(400, "INVALID_ARGUMENT",
                             f"Service account {m.split(':', 1)[1]} does not exist.")
    return None


def store_policy(project: FakeProject, resource: str, bindings: dict[str, set[str]]) -> Policy:
    with project.lock:
        pol = project.policies.setdefault(resource, Policy())
        pol.bindings = {r: set(m) for r, m in bindings.items() if m}
        return pol


# ---- REST plumbing (Resource Manager here, Secret Manager in gcp_secrets.py) ---------------
@dataclass(frozen=True)
class Route:
    """One REST method: `pattern` names the project `p` and the resource `res` it checks."""
    verb: str
    pattern: re.Pattern[str]
    method: str       # the API's method id, for the record
    permission: str
    mutating: bool
    fn: str           # the fake's method: fn(call) -> Reply


class Refused(Exception):
    """Raised by a REST method to answer `reply` (an error) instead of going on."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply[1]["error"]["message"])
        self.reply = reply


@dataclass
class Call:
    member: str | None
    path: str
    groups: dict[str, str]
    query: dict[str, str]
    body: Any
    resource: str     # `res` with the project's id where the caller gave its number


class RestFake(Served):
    """A REST API of one FakeProject: routes, the 401/SERVICE_DISABLED/403 guard, one record per
    call (mutating or not, whatever its answer)."""

    api = ""
    service = ""
    routes: tuple[Route, ...] = ()

    def __init__(self, project: FakeProject) -> None:
        self.project = project
        self.http = LoopbackServer(self._handler())

    def denied(self, permission: str, shown: str) -> Reply:
        return self.project.denied(permission, shown)

    def recorded(self, route: Route, body: Any) -> Any:
        return body

    def ours(self, p: str) -> bool:
        return p in (self.project.project, str(self.project.number))

    def handle(self, verb: str, raw: str, auth: str | None, data: bytes) -> Reply:
        url = urlsplit(raw)
        route, m = next(((r, m) for r in self.routes if r.verb == verb
                         and (m := r.pattern.match(url.path))), (None, None))
        if route is None or m is None:
            return error(404, "NOT_FOUND", f"The requested URL {url.path} was not found.")
        try:
            body = json.loads(data) if data else {}
        except ValueError:
            return error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        groups = m.groupdict()
        resource = groups["res"]
        if groups["p"] == str(self.project.number):
            resource = resource.replace(f"projects/{groups['p']}", f"projects/"
                                        f"{self.project.project}", 1)
        call = Call(self.project.member(auth), url.path, groups, dict(parse_qsl(url.query)),
                    body, resource)
        with self.project.lock:
            try:
                reply = self._guard(route, call) or getattr(self, route.fn)(call)
            except Refused as r:
                reply = r.reply
        self.project.record(self.api, route.method, url.path, call.member,
                            mutating=route.mutating, permission=route.permission,
                            status=reply[0], body=self.recorded(route, body))
        return reply

    def _guard(self, route: Route, call: Call) -> Reply | None:
        if call.member is None:
            return self.project.check(None, route.permission, call.resource)
        if not self.project.serves(self.service):
            return self.project.service_disabled(self.service)
        if not self.ours(call.groups["p"]) or not self.project.allowed(
                call.member, route.permission, call.resource):
            return self.denied(route.permission, call.groups["res"])
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            def _serve(self, verb: str) -> None:
                code, payload = fake.handle(verb, self.path, self.headers.get("Authorization"),
                                            self.read_body())
                self.send_json(code, payload)

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

        return Handler


# ---- Resource Manager v3 -------------------------------------------------------------------
_PROJECT = r"^/v3/(?P<res>projects/(?P<p>[^/:]+))"


class FakeResourceManager(RestFake):
    """[rm] projects.get / getIamPolicy / setIamPolicy on `project.policies["projects/P"]`.
    `iam`: the FakeIam whose accounts a policy may name (None: any account exists);
    `unsupported_roles`: well-formed role names the project refuses."""

    api = "cloudresourcemanager"
    service = RM
    routes = (
        Route("GET", re.compile(_PROJECT + "$"), "projects.get",
              "resourcemanager.projects.get", False, "_get"),
        Route("POST", re.compile(_PROJECT + ":getIamPolicy$"), "projects.getIamPolicy",
              "resourcemanager.projects.getIamPolicy", False, "_get_policy"),
        Route("POST", re.compile(_PROJECT + ":setIamPolicy$"), "projects.setIamPolicy",
              "resourcemanager.projects.setIamPolicy", True, "_set_policy"),
    )

    def __init__(self, project: FakeProject, iam: FakeIam | None = None,
                 display_name: str = "SLM nightly") -> None:
        super().__init__(project)
        self.iam = iam
        self.display_name = display_name
        self.unsupported_roles: set[str] = {"roles/compute.browser"}

    def denied(self, permission: str, shown: str) -> Reply:
        return error(403, "PERMISSION_DENIED", f"Permission '{permission}' denied on resource "
                     f"'//cloudresourcemanager.googleapis.com/{shown}' (or it may not exist).",
                     error_info("IAM_PERMISSION_DENIED", RM, permission=permission,
                                resource=shown))

    def _get(self, call: Call) -> Reply:
        p = self.project
        return 200, {"name": f"projects/{p.number}", "projectId": p.project, "state": "ACTIVE",
                     "displayName": self.display_name, "createTime": "2026-01-05T10:00:00.000Z",
                     "updateTime": "2026-01-05T10:00:00.000Z", "etag": f'W/"{p.number:x}"'}

    def _get_policy(self, call: Call) -> Reply:
        # [versions] the body's options.requestedPolicyVersion (absent: 1)
        options = (call.body or {}).get("options") or {}
        return 200, self.project.policy(call.resource).to_json(
            int(options.get("requestedPolicyVersion") or 1))

    def _set_policy(self, call: Call) -> Reply:
        policy = call.body.get("policy") or {}
        conditional = [b for b in policy.get("bindings") or () if b.get("condition")]
        if conditional and int(policy.get("version") or 1) < 3:
            # [versions] a policy with conditions must be written as version 3
            return error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.",
                         {"@type": "type.googleapis.com/google.rpc.BadRequest",
                          "fieldViolations": [{"field": "policy.version", "description":
                                               "Conditional role bindings require policy "
                                               "version 3."}]})
        bindings = bindings_of({"bindings": [b for b in policy.get("bindings") or ()
                                             if not b.get("condition")]})
        current = self.project.policy(call.resource)
        problem = policy_problem(
            bindings, current, policy.get("etag"), etag_detail=True,
            # [versions] a role read back as `…_withcond_…` names no role
            role_ok=lambda r: r not in self.unsupported_roles and "_withcond_" not in r,
            account_ok=lambda e: self.iam is None or self.iam.account_usable(e))
        problem = problem or self._owner_problem(bindings, current)
        if problem:
            return problem
        stored = store_policy(self.project, call.resource, bindings)
        stored.conditional = [{"role": b["role"], "members": sorted(b.get("members") or ()),
                               "condition": b["condition"]} for b in conditional]
        return 200, stored.to_json(3)

    @staticmethod
    def _owner_problem(bindings: dict[str, set[str]], current: Policy) -> Reply | None:
        """[rm] public members, a user made owner, the last user (ToS-accepting) owner gone."""
        members = set().union(*bindings.values()) if bindings else set()
        if members & {"allUsers", "allAuthenticatedUsers"}:
            return error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
        before = current.bindings.get(OWNER, set())
        after = bindings.get(OWNER, set())
        for member in sorted(after - before):
            if member.startswith("user:"):
                return _policy_error("SOLO_MUST_INVITE_OWNERS", member=member, role=OWNER)
        if any(m.startswith("user:") for m in before) and not any(
                m.startswith("user:") for m in after):
            return _policy_error("SOLO_REQUIRE_TOS_ACCEPTOR", role=OWNER)
        return None


def _policy_error(kind: str, **fields: str) -> Reply:
    return error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.",
                 {"@type": "type.googleapis.com/google.cloudresourcemanager.v1."
                  "ProjectIamPolicyError", "type": kind, **fields})


# ---- IAM admin v1 over gRPC ----------------------------------------------------------------
class Fail(Exception):
    """A gRPC error status with google.rpc details (ErrorInfo, ResourceInfo, DebugInfo)."""

    def __init__(self, code: grpc.StatusCode, message: str, *details: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details

    @classmethod
    def from_reply(cls, reply: Reply) -> Fail:
        err = reply[1]["error"]
        infos = [error_details_pb2.ErrorInfo(reason=d["reason"], domain=d["domain"],
                                             metadata=d["metadata"])
                 for d in err.get("details", ()) if d.get("@type", "").endswith("ErrorInfo")]
        return cls(grpc.StatusCode[err["status"]], err["message"], *infos)

    def status(self) -> grpc.Status:
        packed = []
        for d in self.details:
            any_ = any_pb2.Any()
            any_.Pack(d)
            packed.append(any_)
        return rpc_status.to_status(status_pb2.Status(code=self.code.value[0],
                                                      message=self.message, details=packed))


@dataclass
class ServiceAccount:
    email: str
    unique_id: str
    display_name: str = ""
    description: str = ""
    usable_at: float = 0.0   # [consist] when it has propagated

    def proto(self, project: str) -> types.ServiceAccount:
        return types.ServiceAccount(
            name=f"projects/{project}/serviceAccounts/{self.email}", project_id=project,
            unique_id=self.unique_id, email=self.email, display_name=self.display_name,
            description=self.description, oauth2_client_id=self.unique_id,
            etag=b"MDEwMjE5MjA=")


@dataclass(frozen=True)
class Rpc:
    request: Any
    response: Any
    fn: str
    permission: str
    mutating: bool
    method: str


RPCS = {
    "GetServiceAccount": Rpc(types.GetServiceAccountRequest, types.ServiceAccount, "_get",
                             "iam.serviceAccounts.get", False, "projects.serviceAccounts.get"),
    "CreateServiceAccount": Rpc(types.CreateServiceAccountRequest, types.ServiceAccount,
                                "_create", "iam.serviceAccounts.create", True,
                                "projects.serviceAccounts.create"),
    "DeleteServiceAccount": Rpc(types.DeleteServiceAccountRequest, empty_pb2.Empty, "_delete",
                                "iam.serviceAccounts.delete", True,
                                "projects.serviceAccounts.delete"),
    "ListServiceAccounts": Rpc(types.ListServiceAccountsRequest,
                               types.ListServiceAccountsResponse, "_list",
                               "iam.serviceAccounts.list", False,
                               "projects.serviceAccounts.list"),
    "GetIamPolicy": Rpc(iam_policy_pb2.GetIamPolicyRequest, policy_pb2.Policy, "_get_policy",
                        "iam.serviceAccounts.getIamPolicy", False,
                        "projects.serviceAccounts.getIamPolicy"),
    "SetIamPolicy": Rpc(iam_policy_pb2.SetIamPolicyRequest, policy_pb2.Policy, "_set_policy",
                        "iam.serviceAccounts.setIamPolicy", True,
                        "projects.serviceAccounts.setIamPolicy"),
}


def _codec(t: Any) -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]]:
    if hasattr(t, "FromString"):  # a protobuf class
        return t.FromString, t.SerializeToString
    return t.deserialize, t.serialize  # a proto-plus class


class FakeIam:
    """[grpc][sa][consist] google.iam.admin.v1.IAM's service-account methods on 127.0.0.1,
    `target` ("127.0.0.1:PORT"; `url` is the same with http://). The caller is the Bearer token
    of the `authorization` metadata. `seed(account_id)` makes an account that already exists."""

    def __init__(self, project: FakeProject, *, sa_propagation_seconds: float = 0.3) -> None:
        self.project = project
        self.sa_propagation_seconds = sa_propagation_seconds
        self.accounts: dict[str, ServiceAccount] = {}  # email → account
        self._ids = itertools.count(1)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {}
        for name, rpc in RPCS.items():
            deserialize, _ = _codec(rpc.request)
            _, serialize = _codec(rpc.response)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap(rpc), request_deserializer=deserialize,
                response_serializer=serialize)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.iam.admin.v1.IAM", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.target}"

    def __enter__(self) -> FakeIam:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)

    # ---- test controls and the other fakes' view ---------------------------------------
    def seed(self, account_id: str, display_name: str = "", description: str = "") -> str:
        """An account that exists and has propagated (no call recorded); its email."""
        with self.project.lock:
            acct = self._new(account_id, display_name, description, usable_at=0.0)
        return acct.email

    def email(self, account_id: str) -> str:
        return f"{account_id}@{self.project.project}.iam.gserviceaccount.com"

    def account_usable(self, email: str) -> bool:
        """[consist] whether a policy may name serviceAccount:EMAIL now."""
        p = self.project
        if email == f"{p.number}-compute@developer.gserviceaccount.com":
            return "compute.googleapis.com" in p.enabled
        if not email.endswith(f"@{p.project}.iam.gserviceaccount.com"):
            return True  # another project's account or a Google agent: not this fake's to know
        acct = self.accounts.get(email)
        return acct is not None and time.time() >= acct.usable_at

    # ---- the wire ----------------------------------------------------------------------
    def _wrap(self, rpc: Rpc) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            auth = dict(context.invocation_metadata()).get("authorization")
            member = self.project.member(auth if isinstance(auth, str) else None)
            path = getattr(request, "name", "") or getattr(request, "resource", "")

            def record(code: grpc.StatusCode) -> None:
                self.project.record("iam", rpc.method, path, member, mutating=rpc.mutating,
                                    permission=rpc.permission, status=HTTP.get(code, 500))
            try:
                with self.project.lock:
                    response = getattr(self, rpc.fn)(request, member, rpc.permission)
            except Fail as f:
                record(f.code)
                context.abort_with_status(f.status())  # raises: the call ends here
                raise
            record(grpc.StatusCode.OK)
            return response
        return handle

    def _guard(self, member: str | None, permission: str, resource: str) -> None:
        """401, SERVICE_DISABLED, or [sa] IAM's own 403 text (it names no resource)."""
        reply = self.project.check(member, permission, resource, IAM)
        if reply is None:
            return
        fail = Fail.from_reply(reply)
        details = reply[1]["error"].get("details") or [{}]
        if details[0].get("reason") == "IAM_PERMISSION_DENIED":
            fail.message = (f"Permission '{permission}' denied on resource (or it may not "
                            "exist).")
        raise fail

    def _project(self, name: str, member: str | None, permission: str) -> None:
        """The guard of a method on projects/P: another project is a 403 (no grant there)."""
        ours = name.removeprefix("projects/") in (self.project.project, str(self.project.number))
        self._guard(member, permission, f"projects/{self.project.project}" if ours else name)
        if not ours:
            raise self._denied(permission)

    @staticmethod
    def _denied(permission: str) -> Fail:
        return Fail(grpc.StatusCode.PERMISSION_DENIED, f"Permission '{permission}' denied on "
                    "resource (or it may not exist).", error_details_pb2.ErrorInfo(
                        reason="IAM_PERMISSION_DENIED", domain=IAM,
                        metadata={"permission": permission}))

    def _resolve(self, name: str, member: str | None, permission: str) -> ServiceAccount:
        m = SA_NAME.match(name)
        if not m:
            raise Fail(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid service account name {name}.")
        p, key = m.groups()
        acct = next((a for a in self.accounts.values() if key in (a.email, a.unique_id)), None)
        if acct is not None and time.time() < acct.usable_at:
            acct = None  # [consist] not yet readable
        resource = f"projects/{self.project.project}/serviceAccounts/{acct.email if acct else key}"
        self._guard(member, permission, resource)
        if p not in ("-", self.project.project, str(self.project.number)):
            raise self._denied(permission)  # another project: no grant there
        if acct is None:
            if p == "-":  # [sa] the wildcard hides a missing account behind a 403
                raise self._denied(permission)
            raise Fail(grpc.StatusCode.NOT_FOUND, "Unknown service account")
        return acct

    def _resource(self, acct: ServiceAccount) -> str:
        return f"projects/{self.project.project}/serviceAccounts/{acct.email}"

    def _new(self, account_id: str, display_name: str, description: str, *,
             usable_at: float) -> ServiceAccount:
        acct = ServiceAccount(self.email(account_id), str(10**20 + next(self._ids)),
                              display_name, description, usable_at)
        self.accounts[acct.email] = acct
        return acct

    def _get(self, req: types.GetServiceAccountRequest, member: str | None,
             permission: str) -> types.ServiceAccount:
        return self._resolve(req.name, member, permission).proto(self.project.project)

    def _create(self, req: types.CreateServiceAccountRequest, member: str | None,
                permission: str) -> types.ServiceAccount:
        self._project(req.name, member, permission)
        aid, sa = req.account_id, req.service_account
        if not 6 <= len(aid) <= 30:
            raise Fail(grpc.StatusCode.INVALID_ARGUMENT, f'The account ID "{aid}" does not have '
                       "a length between 6 and 30.")
        if not ACCOUNT_ID.match(aid):
            raise Fail(grpc.StatusCode.INVALID_ARGUMENT,
                       f"{aid} does not match [a-z][a-z\\d\\-]*[a-z\\d].")
        if len(sa.display_name.encode()) > 100 or len(sa.description.encode()) > 256:
            raise Fail(grpc.StatusCode.INVALID_ARGUMENT, "Request contains an invalid argument.")
        if self.email(aid) in self.accounts:
            raise Fail(grpc.StatusCode.ALREADY_EXISTS, f"Service account {aid} already exists "
                       f"within project projects/{self.project.project}.",
                       error_details_pb2.ResourceInfo(
                           resource_name=f"projects/{self.project.project}/serviceAccounts/"
                           f"{self.email(aid)}"))
        acct = self._new(aid, sa.display_name, sa.description,
                         usable_at=time.time() + self.sa_propagation_seconds)
        return acct.proto(self.project.project)

    def _delete(self, req: types.DeleteServiceAccountRequest, member: str | None,
                permission: str) -> empty_pb2.Empty:
        acct = self._resolve(req.name, member, permission)
        del self.accounts[acct.email]
        self.project.policies.pop(self._resource(acct), None)
        # [consist] its grants stay, renamed, and no longer apply to anyone
        gone = f"serviceAccount:{acct.email}"
        for pol in self.project.policies.values():
            for members in pol.bindings.values():
                if gone in members:
                    members.discard(gone)
                    members.add(f"deleted:{gone}?uid={acct.unique_id}")
        return empty_pb2.Empty()

    def _list(self, req: types.ListServiceAccountsRequest, member: str | None,
              permission: str) -> types.ListServiceAccountsResponse:
        self._project(req.name, member, permission)
        now = time.time()
        accounts = sorted((a for a in self.accounts.values() if now >= a.usable_at),
                          key=lambda a: a.email)
        size = min(req.page_size or 20, 100)
        start = int(req.page_token or 0)
        page = accounts[start:start + size]
        more = start + size < len(accounts)
        return types.ListServiceAccountsResponse(
            accounts=[a.proto(self.project.project) for a in page],
            next_page_token=str(start + size) if more else "")

    def _get_policy(self, req: iam_policy_pb2.GetIamPolicyRequest, member: str | None,
                    permission: str) -> policy_pb2.Policy:
        acct = self._resolve(req.resource, member, permission)
        return _to_proto(self.project.policies.get(self._resource(acct)) or Policy())

    def _set_policy(self, req: iam_policy_pb2.SetIamPolicyRequest, member: str | None,
                    permission: str) -> policy_pb2.Policy:
        acct = self._resolve(req.resource, member, permission)
        resource = self._resource(acct)
        bindings = {b.role: set(b.members) for b in req.policy.bindings}
        etag = base64.b64encode(req.policy.etag).decode() if req.policy.etag else None
        # [sa] only roles about service accounts (roles/iam.*) and the basic roles apply here
        problem = policy_problem(bindings, self.project.policies.get(resource) or Policy(), etag,
                                 role_ok=lambda r: r.startswith("roles/iam.") or r in BASIC,
                                 account_ok=self.account_usable)
        if problem:
            raise Fail.from_reply(problem)
        return _to_proto(store_policy(self.project, resource, bindings))


def _to_proto(pol: Policy) -> policy_pb2.Policy:
    return policy_pb2.Policy(version=pol.version, etag=base64.b64decode(pol.etag), bindings=[
        policy_pb2.Binding(role=r, members=sorted(m)) for r, m in sorted(pol.bindings.items())
        if m])
