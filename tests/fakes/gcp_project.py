"""One Google Cloud project as the API fakes of `slm-nightly gcp` share it: who the caller is,
what IAM lets them do, which APIs are enabled, long-running operations, and one log of every
call. Each API fake (Service Usage, Cloud Quotas, IAM, Resource Manager, Secret Manager, the
bucket's IAM in front of the storage emulator, Compute's networking) serves its own wire and
asks this object.

Sources (read 2026-12):
  [iam]     "Understanding roles" (cloud.google.com/iam/docs/understanding-roles) and the
            predefined roles reference (cloud.google.com/iam/docs/roles-permissions): a role is a
            set of permissions; a binding on a resource applies to everything under it (project
            → bucket, secret, service account, instance). ROLES below lists, per role, only the
            permissions some fake checks.
  [errors]  "Error model" (cloud.google.com/apis/design/errors) and AIP-193: JSON errors
            {"error": {code, message, status, details[ErrorInfo{reason, domain, metadata}]}}; a
            missing permission is 403 PERMISSION_DENIED "Permission 'P' denied on resource 'R'
            (or it may not exist)." with ErrorInfo reason IAM_PERMISSION_DENIED and
            metadata.permission; a disabled API is 403 PERMISSION_DENIED with reason
            SERVICE_DISABLED, domain googleapis.com, metadata {service, consumer}, and the text
            "<Title> API has not been used in project N before or it is disabled. Enable it by
            visiting https://console.developers.google.com/apis/api/<service>/overview?project=N
            then retry." (the text gcloud and every client print, e.g.
            googleapis/google-cloud-python#10457).
  [policy]  "Policies" (cloud.google.com/iam/docs/policies) and setIamPolicy: a policy is
            {version, etag, bindings[{role, members}]}; a setIamPolicy whose etag is not the
            current one fails 409 ABORTED ("There were concurrent policy changes…"), so a
            read-modify-write never loses another writer's change.
  [cel]     "Overview of IAM Conditions" and "Attribute reference for IAM Conditions"
            (cloud.google.com/iam/docs/conditions-overview, conditions-attribute-reference): a
            conditional binding grants its role only where its CEL expression is true;
            `resource.name` of a Cloud Storage object is "projects/_/buckets/B/objects/O", and of
            a bucket (buckets.get, objects.list) "projects/_/buckets/B" — so a condition on an
            object prefix never allows a list. Modelled: `resource.name.startsWith("…")` and
            `resource.name == "…"` joined by `||`; any other expression raises here, so a test
            that needs more says so.
  [lro]     google.longrunning.Operation (cloud.google.com/service-usage/docs/reference/rest/
            v1/operations): {name, done, metadata, response | error}; done only after
            `op_seconds` here, so a caller that does not poll sees done=false.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

# [iam] role → the permissions the fakes check (a subset of each role, never more than it has)
ROLES: dict[str, frozenset[str]] = {
    "roles/compute.instanceAdmin.v1": frozenset({
        "compute.instances.get", "compute.instances.list", "compute.instances.start",
        "compute.instances.stop", "compute.instances.setScheduling",
        "compute.instances.setMetadata", "compute.instances.getGuestAttributes",
        "compute.instances.create", "compute.instances.delete", "compute.instances.setTags",
        "compute.disks.create", "compute.disks.get",
        "compute.zoneOperations.get", "compute.zoneOperations.list", "compute.regions.get",
        "compute.projects.get", "compute.subnetworks.get", "compute.subnetworks.use",
        "compute.routers.list", "compute.images.get", "compute.images.getFromFamily",
        "compute.images.useReadOnly"}),
    # read-only: gets and lists, no start, stop or change
    "roles/compute.viewer": frozenset({
        "compute.instances.get", "compute.instances.list", "compute.zoneOperations.get",
        "compute.zoneOperations.list", "compute.regions.get", "compute.projects.get",
        "compute.disks.get", "compute.images.get", "compute.images.getFromFamily",
        "compute.subnetworks.get", "compute.routers.list"}),
    "roles/iam.serviceAccountUser": frozenset({
        "iam.serviceAccounts.actAs", "iam.serviceAccounts.get", "iam.serviceAccounts.list"}),
    # roles/storage.objectAdmin has storage.objects.* and no storage.buckets.* (finding 2;
    # googleapis/google-cloud-python#9065): get_bucket() is refused with it alone
    "roles/storage.objectAdmin": frozenset({
        "storage.objects.create", "storage.objects.delete", "storage.objects.get",
        "storage.objects.list", "storage.objects.update", "storage.objects.getIamPolicy"}),
    "roles/storage.objectViewer": frozenset({"storage.objects.get", "storage.objects.list"}),
    # creates, and cannot overwrite: an overwrite needs storage.objects.delete too (gcs_iam.py)
    "roles/storage.objectCreator": frozenset({"storage.objects.create"}),
    # the bucket-level role that holds storage.buckets.get (and objects.list)
    "roles/storage.legacyBucketReader": frozenset({"storage.buckets.get",
                                                   "storage.objects.list"}),
    "roles/secretmanager.secretAccessor": frozenset({"secretmanager.versions.access"}),
    "roles/secretmanager.viewer": frozenset({
        "secretmanager.secrets.get", "secretmanager.secrets.list",
        "secretmanager.secrets.getIamPolicy", "secretmanager.versions.get",
        "secretmanager.versions.list"}),
    "roles/logging.logWriter": frozenset({"logging.logEntries.create"}),
    "roles/monitoring.metricWriter": frozenset({"monitoring.timeSeries.create"}),
}
OWNER = "roles/owner"  # every permission ([iam] basic roles)

# the services a new project has on (cloud.google.com/service-usage/docs/enabled-service:
# "Services enabled by default"); compute, iam, secretmanager, cloudquotas are not among them
DEFAULT_SERVICES = frozenset({"serviceusage.googleapis.com", "storage.googleapis.com",
                              "storage-api.googleapis.com", "logging.googleapis.com",
                              "monitoring.googleapis.com", "cloudresourcemanager.googleapis.com"})
TITLES = {"compute.googleapis.com": "Compute Engine", "iam.googleapis.com":
          "Identity and Access Management (IAM)", "secretmanager.googleapis.com":
          "Secret Manager", "cloudquotas.googleapis.com": "Cloud Quotas",
          "iap.googleapis.com": "Cloud Identity-Aware Proxy",
          "storage.googleapis.com": "Cloud Storage",
          "cloudresourcemanager.googleapis.com": "Cloud Resource Manager",
          "serviceusage.googleapis.com": "Service Usage"}

Reply = tuple[int, dict[str, Any]]
_TERM = re.compile(r'resource\.name(?:\.startsWith\("([^"]*)"\)| == "([^"]*)")')


def condition_holds(expression: str, resource: str) -> bool:
    """[cel] whether a conditional binding's expression is true for `resource` (an object's
    name arrives percent-quoted, tests/fakes/gcs_iam.py, and CEL sees it as named)."""
    resource = unquote(resource)
    terms = [t.strip() for t in expression.split("||")]
    matched = [_TERM.fullmatch(t) for t in terms]
    if not all(matched):
        raise ValueError(f"condition not modelled by the fake: {expression!r}")
    return any(resource.startswith(m[1]) if m[1] is not None else resource == m[2]
               for m in matched if m)


def error(code: int, status: str, message: str, *details: dict[str, Any]) -> Reply:
    """[errors] the JSON error body of a Google REST API."""
    body: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        body["details"] = list(details)
    return code, {"error": body}


def error_info(reason: str, domain: str, **metadata: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": domain, "metadata": metadata}


def jwt_claims(token: str) -> dict[str, Any]:
    """The unverified claims of a JWT (a service account's assertion or self-signed token)."""
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}


@dataclass
class Policy:
    """[policy] one resource's IAM policy: role → members, its conditional bindings ({role,
    members, condition}), and the etag of this version.

    [versions] (cloud.google.com/iam/docs/policies#versions, "Specifying a policy version when
    getting a policy"): a policy with a conditional binding is version 3. Read at a lower
    requested version, each conditional binding comes back without its condition, its role
    suffixed `_withcond_` and a hash, and the policy says version 1; such a role cannot be
    written back."""
    bindings: dict[str, set[str]] = field(default_factory=dict)
    version: int = 1
    conditional: list[dict[str, Any]] = field(default_factory=list)

    @property
    def etag(self) -> str:
        canon = json.dumps([sorted((r, sorted(m)) for r, m in self.bindings.items()),
                            self.conditional], sort_keys=True)
        return base64.b64encode(hashlib.sha256(canon.encode()).digest()[:8]).decode()

    def to_json(self, requested_version: int = 1) -> dict[str, Any]:
        full = requested_version >= 3
        version = 3 if self.conditional and full else 1 if self.conditional else self.version
        out: dict[str, Any] = {"version": version, "etag": self.etag}
        bindings = [{"role": r, "members": sorted(m)} for r, m in sorted(self.bindings.items())
                    if m]
        for b in self.conditional:
            digest = hashlib.sha256(json.dumps(b["condition"], sort_keys=True).encode())
            bindings.append(dict(b) if full else {
                "role": f"{b['role']}_withcond_{digest.hexdigest()[:20]}",
                "members": sorted(b["members"])})
        if bindings:
            out["bindings"] = bindings
        return out


@dataclass
class Operation:
    """[lro] a long-running operation, done at `done_at` with `response` (or `error`)."""
    name: str
    done_at: float
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if time.time() >= self.done_at:
            out["done"] = True
            if self.error is not None:
                out["error"] = self.error
            else:
                out["response"] = self.response or {}
        return out


class FakeProject:
    """The shared state. `owner` is the operator running `gcp setup` (roles/owner on the
    project); every other principal has only what a policy grants it. `enforce` False lets
    everyone do everything (the state of the fakes before this module)."""

    def __init__(self, project: str = "test-project", number: int = 123456789012,
                 owner: str = "user:operator@example.com", op_seconds: float = 0.05) -> None:
        self.project = project
        self.number = number
        self.owner = owner
        self.op_seconds = op_seconds
        self.enforce = True
        self.billing_enabled = True  # a billing account is linked (Service Usage's enable checks)
        self.enabled: set[str] = set(DEFAULT_SERVICES)
        # [su] an API just enabled is ENABLED in Service Usage at once, but its own calls may
        # still answer SERVICE_DISABLED for a while ("If you enabled this API recently, wait a
        # few minutes for the action to propagate to our systems and retry", the error's own
        # text): `propagation_seconds` after each enable (0: at once)
        self.propagation_seconds = 0.0
        self.serving_from: dict[str, float] = {}
        self.policies: dict[str, Policy] = {
            f"projects/{project}": Policy({OWNER: {owner}})}
        # resource → the resource IAM inherits from, where the path does not say it (a bucket
        # "projects/_/buckets/B" belongs to the project that created it)
        self.parents: dict[str, str] = {}
        self.tokens: dict[str, str] = {}  # access token → member ("user:…", "serviceAccount:…")
        self.calls: list[dict[str, Any]] = []
        # every permission check (member, permission, resource, allowed): the grants a run
        # needed, derived afterwards (tests/integration/test_operator_guide.py)
        self.checks: list[tuple[str | None, str, str, bool]] = []
        self.operations: dict[str, Operation] = {}
        self._ops = itertools.count(1)
        self.lock = threading.RLock()

    # ---- identity ---------------------------------------------------------------------
    def token_for(self, member: str) -> str:
        """An access token that the fakes read as `member` (tests hand it to
        google.oauth2.credentials.Credentials)."""
        token = "ya29.fake." + hashlib.sha256(member.encode()).hexdigest()[:16]
        self.tokens[token] = member
        return token

    def member(self, authorization: str | None) -> str | None:
        """The IAM member a call's Authorization header names: a token from token_for or the
        token endpoint, or a service account's self-signed JWT."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        token = authorization.split(" ", 1)[1]
        if token in self.tokens:
            return self.tokens[token]
        claims = jwt_claims(token)
        email = claims.get("sub") or claims.get("iss")
        return f"serviceAccount:{email}" if email else None

    def oauth_token(self, assertion: str) -> dict[str, Any]:
        """The token endpoint's answer to a service account's JWT-bearer grant (unverified)."""
        email = jwt_claims(assertion).get("iss") or "anonymous"
        token = self.token_for(f"serviceAccount:{email}")
        return {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    # ---- IAM --------------------------------------------------------------------------
    def policy(self, resource: str) -> Policy:
        return self.policies.setdefault(resource, Policy())

    def grant(self, member: str, role: str, resource: str | None = None) -> None:
        if role not in ROLES and role != OWNER:
            raise ValueError(f"role {role!r} is not modelled: {sorted(ROLES)}")
        with self.lock:
            self.policy(resource or f"projects/{self.project}").bindings.setdefault(
                role, set()).add(member)

    def revoke(self, member: str, role: str, resource: str | None = None) -> None:
        with self.lock:
            self.policy(resource or f"projects/{self.project}").bindings.get(
                role, set()).discard(member)

    def adopt(self, child: str, parent: str | None = None) -> None:
        """Say that `child` (a bucket, say) inherits the project's policy (or `parent`'s)."""
        with self.lock:
            self.parents[child] = parent or f"projects/{self.project}"

    def ancestry(self, resource: str) -> list[str]:
        """`resource`, every path prefix of it (a policy on "projects/P" covers
        "projects/P/global/networks/N" and an object "b/B/objects/a/b.txt"), and the resources
        `adopt` named above them, nearest first."""
        out: list[str] = []
        todo = [resource]
        while todo:
            parts = todo.pop().split("/")
            for n in range(len(parts), 1, -1):
                scope = "/".join(parts[:n])
                if scope not in out:
                    out.append(scope)
                    if scope in self.parents:
                        todo.append(self.parents[scope])
        return out

    def allowed(self, member: str | None, permission: str, resource: str) -> bool:
        """[iam] a binding on `resource` or any resource above it whose role holds
        `permission`."""
        if not self.enforce:
            return True
        with self.lock:
            ok = self.holds(member, permission, resource)
            self.checks.append((member, permission, resource, ok))
        return ok

    def holds(self, member: str | None, permission: str, resource: str,
              without: tuple[str, str, str] | None = None) -> bool:
        """`allowed`'s answer, unrecorded; `without` (member, role, resource): as if that one
        binding were removed."""
        if member is None:
            return False
        with self.lock:
            for scope in self.ancestry(resource):
                pol = self.policies.get(scope)
                for role, members in (pol.bindings.items() if pol else ()):
                    if (member, role, scope) == without:
                        continue
                    if member in members and (role == OWNER or permission in ROLES.get(role, ())):
                        return True
                for b in (pol.conditional if pol else ()):
                    if (member in b["members"] and permission in ROLES.get(b["role"], ())
                            and condition_holds(b["condition"]["expression"], resource)):
                        return True
        return False

    def denied(self, permission: str, resource: str) -> Reply:
        """[errors] the 403 of a missing permission, naming it."""
        return error(403, "PERMISSION_DENIED",
                     f"Permission '{permission}' denied on resource '{resource}' (or it may "
                     "not exist).", error_info("IAM_PERMISSION_DENIED", "iam.googleapis.com",
                                               permission=permission))

    def check(self, member: str | None, permission: str, resource: str,
              service: str | None = None) -> Reply | None:
        """The error a call must answer instead of running, or None: 401 without credentials,
        403 SERVICE_DISABLED when `service` is off, 403 naming the permission."""
        if member is None:
            return error(401, "UNAUTHENTICATED", "Request is missing required authentication "
                         "credential. Expected OAuth 2 access token, login cookie or other valid "
                         "authentication credential.")
        if service is not None and not self.serves(service):
            return self.service_disabled(service)
        if not self.allowed(member, permission, resource):
            return self.denied(permission, resource)
        return None

    def serves(self, service: str) -> bool:
        """Whether `service`'s own API answers: enabled, and its enablement propagated."""
        return service in self.enabled and time.time() >= self.serving_from.get(service, 0.0)

    def service_disabled(self, service: str) -> Reply:
        title = TITLES.get(service, service)
        return error(403, "PERMISSION_DENIED",
                     f"{title} API has not been used in project {self.number} before or it is "
                     "disabled. Enable it by visiting https://console.developers.google.com/"
                     f"apis/api/{service}/overview?project={self.number} then retry. If you "
                     "enabled this API recently, wait a few minutes for the action to propagate "
                     "to our systems and retry.",
                     error_info("SERVICE_DISABLED", "googleapis.com", service=service,
                                consumer=f"projects/{self.number}"))

    # ---- calls and operations ---------------------------------------------------------
    def record(self, api: str, method: str, path: str, member: str | None, *,
               mutating: bool, permission: str | None = None, status: int = 200,
               body: Any = None) -> None:
        with self.lock:
            self.calls.append({"api": api, "method": method, "path": path, "member": member,
                               "mutating": mutating, "permission": permission,
                               "status": status, "body": body, "at": time.time()})

    def mutations(self, since: int = 0) -> list[dict[str, Any]]:
        """The mutating calls from index `since` of `calls` on: a second setup makes none."""
        return [c for c in self.calls[since:] if c["mutating"]]

    def operation(self, prefix: str, response: dict[str, Any] | None = None, *,
                  metadata: dict[str, Any] | None = None, error_: dict[str, Any] | None = None,
                  seconds: float | None = None) -> Operation:
        op = Operation(f"{prefix}{next(self._ops)}",
                       time.time() + (self.op_seconds if seconds is None else seconds),
                       response, error_, metadata)
        with self.lock:
            self.operations[op.name] = op
        return op


class TokenEndpoint:
    """Google's OAuth token endpoint for service-account credentials (the JWT-bearer grant,
    developers.google.com/identity/protocols/oauth2/service-account#httprest): the assertion's
    `iss` becomes the member of the token it returns. Unverified: the fakes trust the key."""

    def __init__(self, project: FakeProject) -> None:
        from tests.fakes.loopback import JsonHandler, LoopbackServer

        gcp = project

        class Handler(JsonHandler):
            def do_POST(self) -> None:  # noqa: N802
                from urllib.parse import parse_qs

                form = parse_qs(self.read_body().decode())
                assertion = (form.get("assertion") or [""])[0]
                if not assertion:
                    self.send_json(400, {"error": "invalid_grant",
                                         "error_description": "missing assertion"})
                    return
                self.send_json(200, gcp.oauth_token(assertion))

        self.http = LoopbackServer(Handler)
        self.url = f"{self.http.url}/token"

    def __enter__(self) -> TokenEndpoint:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)
