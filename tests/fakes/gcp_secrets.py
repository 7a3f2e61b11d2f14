"""A fake of the Secret Manager API v1 (REST) on a FakeProject: the admin calls `gcp setup` makes
and the reads the node makes. The payload of a version is kept but never printed, logged or
recorded.

Served (secretmanager_v1/services/secret_manager_service/transports/rest_base.py, google-cloud-
secret-manager 2.32.0; cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets):
    POST   /v1/projects/P/secrets?secretId=S           secrets.create            secrets.create
    GET    /v1/projects/P/secrets                      secrets.list              secrets.list
    GET    /v1/projects/P/secrets/S                    secrets.get               secrets.get
    DELETE /v1/projects/P/secrets/S                    secrets.delete            secrets.delete
    GET    /v1/projects/P/secrets/S:getIamPolicy       secrets.getIamPolicy      …getIamPolicy
    POST   /v1/projects/P/secrets/S:setIamPolicy       secrets.setIamPolicy      …setIamPolicy
    POST   /v1/projects/P/secrets/S:addVersion         secrets.addVersion        versions.add
    GET    /v1/projects/P/secrets/S/versions           secrets.versions.list     versions.list
    GET    /v1/projects/P/secrets/S/versions/V         secrets.versions.get      versions.get
    GET    /v1/projects/P/secrets/S/versions/V:access  secrets.versions.access   versions.access
(permissions are secretmanager.*; the mutating ones: create, delete, setIamPolicy, addVersion)

Behaviour and its sources (read 2026-12):
  - the API must be enabled (secretmanager.googleapis.com is not on by default): 403
    SERVICE_DISABLED (tests/fakes/gcp_project.py [errors]).
  - names in answers carry the project NUMBER ("projects/123…/secrets/S"), as the real API's
    do (its error texts, e.g. googleapis/java-docs-samples#6571, and versions/latest resolving
    to ".../versions/4", transparency-dev/tesseract#689).
  - a missing permission: 403 "Permission 'P' denied for resource 'projects/N/secrets/S…' (or
    it may not exist)." (java-docs-samples#6571: "denied for", not "denied on").
  - secretId: "a string with a maximum length of 255 characters and can contain uppercase and
    lowercase letters, numerals, and the hyphen and underscore characters" (projects.secrets
    create reference); else 400 INVALID_ARGUMENT (text unconfirmed). `replication` is required
    for a global secret: 400 without it (text unconfirmed). A duplicate: 409 ALREADY_EXISTS
    "Secret [projects/N/secrets/S] already exists." (gcloud's rendering of it).
  - addVersion: payload.data "Must be no larger than 64KiB" (SecretPayload reference); a
    data_crc32c that is not the CRC32C (Castagnoli) of the data is refused 400 INVALID_ARGUMENT
    (cloud.google.com/secret-manager/docs/data-integrity: the checksum "is then verified by
    Secret Manager"; both texts unconfirmed); the version records clientSpecifiedPayloadChecksum;
    access returns payload.dataCrc32c.
  - versions/latest is the newest version whatever its state; a secret without versions: 404
    "Secret [projects/N/secrets/S] not found or has no versions."; access to a version not
    ENABLED: 400 FAILED_PRECONDITION "Secret Version [projects/N/secrets/S/versions/V] is in
    DISABLED state." (external-secrets#4042, get-secretmanager-secrets#268).
  - versions.list: newest first; filter "state:ENABLED" etc. (ListSecretVersionsRequest.filter).
  - IAM: a secret's policy is project.policies["projects/P/secrets/S"]; roles that apply to a
    secret are roles/secretmanager.* and the basic roles ("Lowest-level resources where you can
    grant this role: Secret", iam/docs/roles-permissions/secretmanager); a stale etag, an
    unknown role or a service account that does not exist (yet) are refused as in gcp_iam.py.
  - delete removes the secret, its versions and its policy.
Not modelled: regional secrets, aliases, rotation, TTL, CMEK, version disable/enable/destroy
calls (seed versions in those states instead).
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import google_crc32c

from tests.fakes.gcp_iam import (
    BASIC,
    Call,
    FakeIam,
    Refused,
    RestFake,
    Route,
    bindings_of,
    policy_problem,
    store_policy,
)
from tests.fakes.gcp_project import FakeProject, Policy, Reply, error, error_info

SECRET_ID = re.compile(r"^[a-zA-Z0-9_-]{1,255}$")
MAX_PAYLOAD = 64 * 1024
STATES = ("ENABLED", "DISABLED", "DESTROYED")
_P = r"^/v1/(?P<res>projects/(?P<p>[^/:]+)"
_S = _P + r"/secrets/(?P<s>[^/:]+)"
_V = _S + r"/versions/(?P<v>[^/:]+)"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Version:
    number: int
    state: str
    data: bytes = field(repr=False)  # never printed
    crc32c: int = field(repr=False)
    created: float
    client_checksum: bool = False


@dataclass
class Secret:
    secret_id: str
    created: float
    replication: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    versions: list[Version] = field(default_factory=list)


def _route(verb: str, pattern: str, method: str, perm: str, mutating: bool, fn: str) -> Route:
    return Route(verb, re.compile(pattern), method, f"secretmanager.{perm}", mutating, fn)


class FakeSecrets(RestFake):
    """Secret Manager on `project` at `url`. `iam`: the FakeIam whose accounts a policy may name
    (None: any account exists). `seed(secret_id, *states)` makes a secret with versions in those
    states (no call recorded); `payload(secret_id, version)` reads a stored value in a test."""

    api = "secretmanager"
    service = "secretmanager.googleapis.com"
    routes = (
        _route("GET", _V + r"):access$", "projects.secrets.versions.access",
               "versions.access", False, "_access"),
        _route("GET", _V + r")$", "projects.secrets.versions.get", "versions.get", False,
               "_get_version"),
        _route("GET", _S + r")/versions$", "projects.secrets.versions.list", "versions.list",
               False, "_list_versions"),
        _route("POST", _S + r"):addVersion$", "projects.secrets.addVersion", "versions.add",
               True, "_add_version"),
        _route("GET", _S + r"):getIamPolicy$", "projects.secrets.getIamPolicy",
               "secrets.getIamPolicy", False, "_get_policy"),
        _route("POST", _S + r"):setIamPolicy$", "projects.secrets.setIamPolicy",
               "secrets.setIamPolicy", True, "_set_policy"),
        _route("GET", _S + r")$", "projects.secrets.get", "secrets.get", False, "_get"),
        _route("DELETE", _S + r")$", "projects.secrets.delete", "secrets.delete", True,
               "_delete"),
        _route("POST", _P + r")/secrets$", "projects.secrets.create", "secrets.create", True,
               "_create"),
        _route("GET", _P + r")/secrets$", "projects.secrets.list", "secrets.list", False,
               "_list"),
    )

    def __init__(self, project: FakeProject, iam: FakeIam | None = None) -> None:
        super().__init__(project)
        self.iam = iam
        self.secrets: dict[str, Secret] = {}

    # ---- test controls -----------------------------------------------------------------
    def seed(self, secret_id: str, *states: str, data: bytes = b"seeded") -> None:
        """A secret (replaced if it exists) whose versions 1, 2, … hold `data` and are in
        `states` (default: one ENABLED version)."""
        now = time.time()
        with self.project.lock:
            secret = Secret(secret_id, now, {"automatic": {}})
            for i, state in enumerate(states or ("ENABLED",), start=1):
                if state not in STATES:
                    raise ValueError(f"state {state!r} is not one of {STATES}")
                secret.versions.append(Version(i, state, data, google_crc32c.value(data), now))
            self.secrets[secret_id] = secret

    def seed_empty(self, secret_id: str) -> None:
        """A secret without versions."""
        with self.project.lock:
            self.secrets[secret_id] = Secret(secret_id, time.time(), {"automatic": {}})

    def payload(self, secret_id: str, version: int | None = None) -> bytes:
        secret = self.secrets[secret_id]
        return (secret.versions[version - 1] if version else secret.versions[-1]).data

    # ---- RestFake hooks ----------------------------------------------------------------
    def denied(self, permission: str, shown: str) -> Reply:
        return error(403, "PERMISSION_DENIED", f"Permission '{permission}' denied for resource "
                     f"'{self._numbered(shown)}' (or it may not exist).",
                     error_info("IAM_PERMISSION_DENIED", "iam.googleapis.com",
                                permission=permission))

    def recorded(self, route: Route, body: Any) -> Any:
        if route.fn == "_add_version":  # the value never reaches the record
            payload = body.get("payload") or {}
            return {"payload": {"data": "<redacted>", "dataCrc32c": payload.get("dataCrc32c")}}
        return body

    # ---- names -------------------------------------------------------------------------
    def _numbered(self, resource: str) -> str:
        parts = resource.split("/")
        if len(parts) > 1 and self.ours(parts[1]):
            parts[1] = str(self.project.number)
        return "/".join(parts)

    def _name(self, secret_id: str, version: int | None = None) -> str:
        name = f"projects/{self.project.number}/secrets/{secret_id}"
        return name if version is None else f"{name}/versions/{version}"

    def _secret_json(self, s: Secret) -> dict[str, Any]:
        out = {"name": self._name(s.secret_id), "replication": s.replication,
               "createTime": _stamp(s.created), "etag": f'"{int(s.created * 1e6):x}"'}
        return {**out, "labels": s.labels} if s.labels else out

    def _version_json(self, s: Secret, v: Version) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self._name(s.secret_id, v.number), "createTime": _stamp(v.created),
            "state": v.state, "replicationStatus": {"automatic": {}},
            "etag": f'"{int(v.created * 1e6):x}"',
            "clientSpecifiedPayloadChecksum": v.client_checksum}
        if v.state == "DESTROYED":
            out["destroyTime"] = _stamp(v.created)
        return out

    def _secret(self, call: Call) -> Secret:
        secret = self.secrets.get(call.groups["s"])
        if secret is None:
            raise Refused(error(404, "NOT_FOUND",
                                f"Secret [{self._name(call.groups['s'])}] not found."))
        return secret

    def _version(self, call: Call) -> tuple[Secret, Version]:
        sid, v = call.groups["s"], call.groups["v"]
        secret = self.secrets.get(sid)
        if v == "latest":
            if secret is None or not secret.versions:
                raise Refused(error(404, "NOT_FOUND", f"Secret [{self._name(sid)}] not found or "
                                    "has no versions."))
            return secret, secret.versions[-1]
        if secret is None or not v.isdigit() or not 1 <= int(v) <= len(secret.versions):
            raise Refused(error(404, "NOT_FOUND", f"Secret Version [{self._name(sid)}/versions/"
                                f"{v}] not found."))
        return secret, secret.versions[int(v) - 1]

    # ---- secrets -----------------------------------------------------------------------
    def _create(self, call: Call) -> Reply:
        sid = call.query.get("secretId", "")
        if not SECRET_ID.match(sid):
            return error(400, "INVALID_ARGUMENT", f"Secret ID [{sid}] is invalid: it must be 1 "
                         "to 255 letters, numerals, hyphens or underscores.")
        replication = call.body.get("replication")
        if not replication or not ({"automatic", "userManaged"} & set(replication)):
            return error(400, "INVALID_ARGUMENT", "Secret.replication is required.")
        if sid in self.secrets:
            return error(409, "ALREADY_EXISTS", f"Secret [{self._name(sid)}] already exists.")
        secret = Secret(sid, time.time(), replication, dict(call.body.get("labels") or {}))
        self.secrets[sid] = secret
        return 200, self._secret_json(secret)

    def _list(self, call: Call) -> Reply:
        secrets = [self._secret_json(s) for _, s in sorted(self.secrets.items())]
        return 200, {"secrets": secrets, "totalSize": len(secrets)} if secrets else {}

    def _get(self, call: Call) -> Reply:
        return 200, self._secret_json(self._secret(call))

    def _delete(self, call: Call) -> Reply:
        secret = self._secret(call)
        del self.secrets[secret.secret_id]
        self.project.policies.pop(call.resource, None)
        return 200, {}

    def _get_policy(self, call: Call) -> Reply:
        self._secret(call)
        return 200, (self.project.policies.get(call.resource) or Policy()).to_json()

    def _set_policy(self, call: Call) -> Reply:
        self._secret(call)
        policy = call.body.get("policy") or {}
        bindings = bindings_of(policy)
        problem = policy_problem(
            bindings, self.project.policies.get(call.resource) or Policy(), policy.get("etag"),
            role_ok=lambda r: r.startswith("roles/secretmanager.") or r in BASIC,
            account_ok=lambda e: self.iam is None or self.iam.account_usable(e))
        if problem:
            return problem
        return 200, store_policy(self.project, call.resource, bindings).to_json()

    # ---- versions ----------------------------------------------------------------------
    def _add_version(self, call: Call) -> Reply:
        secret = self._secret(call)
        payload = call.body.get("payload") or {}
        try:
            data = base64.b64decode(payload.get("data") or "", validate=True)
        except ValueError:
            return error(400, "INVALID_ARGUMENT", "Invalid value at 'payload.data' (TYPE_BYTES).")
        if len(data) > MAX_PAYLOAD:
            return error(400, "INVALID_ARGUMENT", f"Secret payload data is {len(data)} bytes: "
                         "it cannot be larger than 64KiB.")
        crc = google_crc32c.value(data)
        sent = payload.get("dataCrc32c")
        if sent is not None and int(sent) != crc:
            return error(400, "INVALID_ARGUMENT", "Checksum mismatch: payload.data_crc32c is not "
                         "the CRC32C of payload.data.")
        version = Version(len(secret.versions) + 1, "ENABLED", data, crc, time.time(),
                          client_checksum=sent is not None)
        secret.versions.append(version)
        return 200, self._version_json(secret, version)

    def _list_versions(self, call: Call) -> Reply:
        secret = self._secret(call)
        wanted = call.query.get("filter", "").strip()
        m = re.fullmatch(r"state\s*[:=]\s*(\w+)", wanted)
        if wanted and (m is None or m.group(1) not in STATES):
            return error(400, "INVALID_ARGUMENT", f"Invalid filter: {wanted}")
        versions = [v for v in reversed(secret.versions) if m is None or v.state == m.group(1)]
        size = int(call.query.get("pageSize") or 25000)
        start = int(call.query.get("pageToken") or 0)
        out: dict[str, Any] = {"totalSize": len(versions)}
        page = versions[start:start + size]
        if page:
            out["versions"] = [self._version_json(secret, v) for v in page]
        if start + size < len(versions):
            out["nextPageToken"] = str(start + size)
        return 200, out

    def _get_version(self, call: Call) -> Reply:
        return 200, self._version_json(*self._version(call))

    def _access(self, call: Call) -> Reply:
        secret, v = self._version(call)
        name = self._name(secret.secret_id, v.number)
        if v.state != "ENABLED":
            return error(400, "FAILED_PRECONDITION", f"Secret Version [{name}] is in {v.state} "
                         "state.")
        return 200, {"name": name, "payload": {"data": base64.b64encode(v.data).decode(),
                                               "dataCrc32c": str(v.crc32c)}}
