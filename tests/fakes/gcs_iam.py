"""Cloud Storage IAM in front of the storage emulator (tests/fakes/gcs.py): an HTTP proxy that
answers the bucket IAM calls itself, checks every other request's permission for its caller
against the shared FakeProject (tests/fakes/gcp_project.py), and forwards what is allowed to
gcp-storage-emulator — which has no IAM (its /iam routes are stubs that allow everything).

    with GcsEmulator(tmp) as gcs, GcsIamProxy(gcs, project) as proxy:
        storage.Client(client_options={"api_endpoint": proxy.url}, credentials=…)

While entered, STORAGE_EMULATOR_HOST names the proxy (prefect-gcp's GcsBucket and any client
without an api_endpoint come through it), and `token_uri` hands service accounts tokens the
project reads as "serviceAccount:EMAIL" (FakeProject.oauth_token).

Checked permissions [perms] (resource "projects/_/buckets/B", objects ".../objects/O"):
    POST   /storage/v1/b?project=P            storage.buckets.create on projects/P
    GET    /storage/v1/b?project=P            storage.buckets.list on projects/P
    GET    /storage/v1/b/B                    storage.buckets.get
    PATCH  /storage/v1/b/B                    storage.buckets.update (+ setIamPolicy with acl)
    GET    /storage/v1/b/B/acl                storage.buckets.getIamPolicy (400 if uniform)
    DELETE /storage/v1/b/B                    storage.buckets.delete
    GET    /storage/v1/b/B/iam                storage.buckets.getIamPolicy   (served here)
    PUT    /storage/v1/b/B/iam                storage.buckets.setIamPolicy   (served here)
    GET    /storage/v1/b/B/iam/testPermissions  none: the subset the caller holds (served here)
    GET    /storage/v1/b/B/o                  storage.objects.list on the bucket
    GET    /storage/v1/b/B/o/O, /download/…   storage.objects.get
    PATCH  /storage/v1/b/B/o/O                storage.objects.update
    DELETE /storage/v1/b/B/o/O                storage.objects.delete
    POST   /upload/storage/v1/b/B/o           storage.objects.create (+ storage.objects.delete
                                              when the object exists: an overwrite); multipart,
                                              media and the start of a resumable upload — its
                                              chunks (PUT ?upload_id=) ride on the session URI
    POST   …/o/O/rewriteTo|copyTo/b/D/o/O2    storage.objects.get on O, create (+ delete) on O2
    POST   …/o/D/compose                      storage.objects.get on each source, create on D
Any other path is 501: nothing reaches the emulator unchecked.

Modelled:
  - a missing permission is GCS's 403 [errors]: "EMAIL does not have PERM access to the Google
    Cloud Storage bucket|object (the Google Cloud project for buckets.create/list). Permission
    'PERM' denied on resource (or it may not exist).", errors[] reason forbidden; no credentials
    → 401 "Anonymous caller does not have …"; storage.googleapis.com off → SERVICE_DISABLED.
  - roles/storage.objectAdmin has no storage.buckets.* (gcp_project.ROLES): prefect-gcp's
    GcsBucket.read_path/write_path call get_bucket() first, so objectAdmin alone is refused with
    storage.buckets.get; objectAdmin + roles/storage.legacyBucketReader passes (the production
    finding; googleapis/google-cloud-python#9065).
  - a bucket created here is adopted by its project (project roles apply to it) and gets GCS's
    default policy [policy]: legacyBucketOwner for projectOwner:/projectEditor:, legacyBucketReader
    for projectViewer: (and the legacyObject roles with uniform access). The convenience members
    are listed, not expanded: project roles reach the bucket through the adoption instead.
    A bucket the emulator already had (its --default-bucket) is adopted on first sight.
  - a conditional binding [conditions]: refused (400) below policy version 3 or on a bucket
    without uniform access; read back whole at optionsRequestedPolicyVersion=3, mangled below;
    it grants only on the objects its `resource.name` condition names.
  - setIamPolicy with an etag that is not the current one → 412 conditionNotMet "At least one of
    the pre-conditions you specified did not hold." (GCS answers 412, not IAM's 409: hashicorp/
    terraform-provider-google#7853, gsutil's PreconditionException); only storage roles (and
    custom roles) bind on a bucket (400 otherwise); the policy lives at
    FakeProject.policies["projects/_/buckets/B"].
  - the emulator drops location and iamConfiguration on insert (always US, uniform access off)
    and reports projectNumber 1234: the bucket as created is kept here and spliced into bucket
    responses — location upper-cased with its locationType, uniformBucketLevelAccess {enabled,
    lockedTime = enable time + 90 days} [ubla], projectNumber the project's; reading or
    changing the ACLs of a bucket with uniform access → 400 [ubla]. Bucket names are
    validated [names].
  - a 404 the emulator sends without a body gets GCS's: "The specified bucket does not exist."
    or "No such object: B/O".
  - every call is recorded (api "storage", mutating unless GET; the permission checked first).

Sources (read 2026-12):
  [perms]  "IAM permissions for JSON methods" (cloud.google.com/storage/docs/json_api/v1/
           json-api-permissions): objects.insert needs storage.objects.create, and
           storage.objects.delete too when it overwrites; rewrite/copy/compose likewise on the
           destination and storage.objects.get on the sources; buckets.insert/list need the
           permission on the project; testIamPermissions needs none.
  [errors] "Permission error messages" (cloud.google.com/iam/docs/permission-error-messages):
           the REST 403 {"error": {code, message, errors[{message, domain global, reason
           forbidden}]}}; the bucket/object wording from public reports (e.g. "… does not have
           storage.buckets.get access to the Google Cloud Storage bucket. Permission
           'storage.buckets.get' denied on resource (or it may not exist).").
  [policy] "IAM policies for buckets" / JSON API buckets.getIamPolicy, setIamPolicy,
           testIamPermissions (cloud.google.com/storage/docs/json_api/v1/buckets); the
           convenience values (cloud.google.com/storage/docs/access-control/iam#convenience-
           values).
  [conditions] "Use IAM Conditions on buckets" (cloud.google.com/storage/docs/access-control/
           using-iam-conditions) and "IAM Conditions" (…/access-control/iam#conditions): a
           conditional binding needs uniform bucket-level access and a version-3 policy;
           python-storage#52 (its system test: a conditional binding on a bucket without
           uniform access is refused with BadRequest). The condition is evaluated per request
           by gcp_project.condition_holds ([cel]).
  [ubla]   "Uniform bucket-level access" (cloud.google.com/storage/docs/uniform-bucket-level-
           access): lockedTime 90 days after enabling; "Cannot use ACL API to update bucket
           policy when uniform bucket-level access is enabled." and "Cannot get legacy ACL for
           a bucket that has uniform bucket-level access." (the texts gsutil and clients show)
  [names]  "Bucket naming requirements" (cloud.google.com/storage/docs/buckets#naming).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlparse

from tests.fakes.gcp_project import ROLES, FakeProject, Policy
from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

if TYPE_CHECKING:
    from tests.fakes.gcs import GcsEmulator

SERVICE = "storage.googleapis.com"
LOCK_SECONDS = 90 * 86400  # [ubla]
# hop-by-hop, and Expect: the proxy has read the whole body before it forwards (curl -T sends
# "Expect: 100-continue" with an upload, which the client's side of this hop answered: the
# Handler below speaks HTTP/1.1, as Cloud Storage does)
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection",
       "expect"}


def json_body(body: bytes, headers: dict[str, str]) -> Any:
    """A request's JSON body, or None: an upload's media is the object's bytes, JSON or not
    (a chat template begins with "{%")."""
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return json.loads(body) if "json" in ctype and body[:1] == b"{" else None


BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
MULTI = {"US", "EU", "ASIA"}
DUAL = {"NAM4", "EUR4", "ASIA1", "EUR5", "EUR7", "EUR8"}
_B = r"/storage/v1/b/(?P<b>[^/]+)"
# (method, path, kind, permissions, mutating); kind tells what the path names
ROUTES = [(m, re.compile(p), k, perms, mut) for m, p, k, perms, mut in [
    ("POST", r"/storage/v1/b", "create", ("storage.buckets.create",), True),
    ("GET", r"/storage/v1/b", "project", ("storage.buckets.list",), False),
    ("GET", _B, "bucket", ("storage.buckets.get",), False),
    ("PATCH", _B, "bucket", ("storage.buckets.update",), True),
    ("DELETE", _B, "bucket", ("storage.buckets.delete",), True),
    ("GET", _B + "/iam", "getIam", ("storage.buckets.getIamPolicy",), False),
    ("PUT", _B + "/iam", "setIam", ("storage.buckets.setIamPolicy",), True),
    ("GET", _B + "/iam/testPermissions", "testIam", (), False),
    ("GET", _B + "/acl", "acl", ("storage.buckets.getIamPolicy",), False),
    ("GET", _B + "/o", "bucket", ("storage.objects.list",), False),
    ("POST", _B + r"/o/(?P<o>.+)/(?:rewriteTo|copyTo)/b/(?P<db>[^/]+)/o/(?P<do>.+)", "copy",
     ("storage.objects.get",), True),
    ("POST", _B + r"/o/(?P<o>.+)/compose", "compose", ("storage.objects.create",), True),
    ("GET", _B + r"/o/(?P<o>.+)", "object", ("storage.objects.get",), False),
    ("PATCH", _B + r"/o/(?P<o>.+)", "object", ("storage.objects.update",), True),
    ("DELETE", _B + r"/o/(?P<o>.+)", "object", ("storage.objects.delete",), True),
    ("GET", r"/download/storage/v1/b/(?P<b>[^/]+)/o/(?P<o>.+)", "object",
     ("storage.objects.get",), False),
    ("POST", r"/upload/storage/v1/b/(?P<b>[^/]+)/o", "upload", ("storage.objects.create",),
     True),
    ("PUT", r"/upload/storage/v1/b/(?P<b>[^/]+)/o", "chunk", (), True),
]]
# [roles] cloud.google.com/iam/docs/roles-permissions/storage: the storage roles a bucket
# binds, only permissions the real roles hold
_ROLES = {
    "roles/storage.admin": frozenset({
        "storage.buckets.create", "storage.buckets.delete", "storage.buckets.get",
        "storage.buckets.list", "storage.buckets.update", "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy", "storage.objects.create", "storage.objects.delete",
        "storage.objects.get", "storage.objects.list", "storage.objects.update"}),
    "roles/storage.objectCreator": frozenset({"storage.objects.create"}),
    "roles/storage.legacyBucketOwner": frozenset({
        "storage.buckets.get", "storage.buckets.update", "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy", "storage.objects.create", "storage.objects.delete",
        "storage.objects.list"}),
    "roles/storage.legacyBucketWriter": frozenset({
        "storage.buckets.get", "storage.objects.create", "storage.objects.delete",
        "storage.objects.list"}),
    "roles/storage.legacyObjectReader": frozenset({"storage.objects.get"}),
    "roles/storage.legacyObjectOwner": frozenset({
        "storage.objects.get", "storage.objects.update", "storage.objects.getIamPolicy"}),
}
for _role, _perms in _ROLES.items():
    ROLES[_role] = ROLES.get(_role, frozenset()) | _perms

Reply = tuple[int, dict[str, Any]]


def rfc3339(t: float) -> str:
    """GCS's timestamps: UTC with a Z (google-cloud-storage parses nothing else)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def gcs_error(code: int, message: str, reason: str) -> Reply:
    return code, {"error": {"code": code, "message": message, "errors": [
        {"message": message, "domain": "global", "reason": reason}]}}


def denied(member: str | None, permission: str) -> Reply:
    """[errors] GCS's refusal, naming the caller and the permission."""
    what = ("Google Cloud project" if permission in ("storage.buckets.create",
                                                      "storage.buckets.list")
            else "Google Cloud Storage bucket" if permission.startswith("storage.buckets.")
            or permission == "storage.objects.list" else "Google Cloud Storage object")
    who = member.split(":", 1)[-1] if member else "Anonymous caller"
    message = (f"{who} does not have {permission} access to the {what}. Permission "
               f"'{permission}' denied on resource (or it may not exist).")
    return gcs_error(403 if member else 401, message, "forbidden" if member else "required")


def location_type(location: str) -> str:
    return ("multi-region" if location in MULTI else "dual-region" if location in DUAL
            else "region")


class GcsIamProxy(Served):
    """The proxy, on loopback; `buckets` holds what the emulator drops for each bucket."""

    def __init__(self, emulator: GcsEmulator, gcp: FakeProject) -> None:
        self.upstream = ("127.0.0.1", emulator.port)
        self.gcp = gcp
        self.buckets: dict[str, dict[str, Any]] = {}  # name → spliced resource fields
        self.http = LoopbackServer(self._handler())
        self.token_uri = f"{self.url}/token"
        self._old_env: str | None = None

    def __enter__(self) -> GcsIamProxy:
        super().__enter__()
        self._old_env = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old_env is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = self._old_env
        super().__exit__(*exc)

    # ---- upstream ------------------------------------------------------------------------
    def forward(self, method: str, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            # a zero-byte upload is an object too: its Content-Length 0 is sent
            conn.request(method, path, body=body if method in ("POST", "PUT", "PATCH")
                         else body or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k: v for k, v in resp.getheaders()
                                 if k.lower() not in HOP}, resp.read()
        finally:
            conn.close()

    def exists(self, bucket: str, obj: str | None = None) -> bool:
        path = f"/storage/v1/b/{quote(bucket, safe='')}"
        if obj is not None:
            path += f"/o/{quote(obj, safe='')}"
        return self.forward("GET", path, b"", {})[0] == 200

    # ---- IAM -----------------------------------------------------------------------------
    @staticmethod
    def resource(bucket: str, obj: str | None = None) -> str:
        res = f"projects/_/buckets/{bucket}"
        # quoted: an object's "/" would break FakeProject.ancestry's (collection, id) pairs
        return res if obj is None else f"{res}/objects/{quote(obj, safe='')}"

    def adopted(self, bucket: str) -> str:
        """The bucket's IAM name; a bucket never seen is the project's (its default one)."""
        res = self.resource(bucket)
        with self.gcp.lock:
            if res not in self.gcp.parents:
                self.gcp.adopt(res)
        return res

    def check(self, member: str | None, permission: str, resource: str) -> Reply | None:
        if member is None or not self.gcp.allowed(member, permission, resource):
            return denied(member, permission)
        return None

    def default_policy(self, uniform: bool) -> Policy:
        """[policy] the bindings GCS gives a new bucket (convenience values)."""
        p = self.gcp.project
        owners = {f"projectOwner:{p}", f"projectEditor:{p}"}
        bindings = {"roles/storage.legacyBucketOwner": set(owners),
                    "roles/storage.legacyBucketReader": {f"projectViewer:{p}"}}
        if uniform:
            bindings |= {"roles/storage.legacyObjectOwner": set(owners),
                         "roles/storage.legacyObjectReader": {f"projectViewer:{p}"}}
        return Policy(bindings)

    def policy_json(self, bucket: str, requested_version: int = 1) -> dict[str, Any]:
        """[policy] at the query's optionsRequestedPolicyVersion: below 3, a conditional binding
        comes back without its condition under a mangled role (gcp_project.Policy)."""
        res = self.resource(bucket)
        with self.gcp.lock:
            pol = self.gcp.policy(res)
            return {"kind": "storage#policy", "resourceId": res,
                    **pol.to_json(requested_version)}

    def set_policy(self, bucket: str, body: dict[str, Any]) -> Reply:
        res = self.resource(bucket)
        bindings: dict[str, set[str]] = {}
        conditional: list[dict[str, Any]] = []
        for b in body.get("bindings") or []:
            role = str(b.get("role", ""))
            if not (role.startswith("roles/storage.") or "/roles/" in role):
                return gcs_error(400, f"Role {role} is not supported for this resource.",
                                 "invalid")
            if b.get("condition"):
                conditional.append({"role": role, "members": sorted(b.get("members") or ()),
                                    "condition": b["condition"]})
            else:
                bindings.setdefault(role, set()).update(b.get("members") or [])
        if conditional and int(body.get("version") or 1) < 3:
            # [versions] a policy with a condition is written as version 3
            return gcs_error(400, "Conditional role bindings require policy version 3.",
                             "invalid")
        if conditional and not self.uniform(bucket):
            # [conditions] "you must enable uniform bucket-level access on the bucket" to use
            # IAM Conditions; python-storage#52's system test sees BadRequest without it
            return gcs_error(400, "IAM Conditions can only be used on buckets with uniform "
                             "bucket-level access enabled.", "invalid")
        with self.gcp.lock:
            current = self.gcp.policy(res)
            if body.get("etag") and body["etag"] != current.etag:
                return gcs_error(412, "At least one of the pre-conditions you specified did "
                                 "not hold.", "conditionNotMet")
            self.gcp.policies[res] = Policy(bindings, int(body.get("version") or 1),
                                            conditional)
        return 200, self.policy_json(bucket, 3)

    def test_permissions(self, member: str | None, bucket: str,
                         query: dict[str, list[str]]) -> Reply:
        res = self.resource(bucket)
        held = [p for p in query.get("permissions", []) if member and self.gcp.allowed(
            member, p, res)]
        out: dict[str, Any] = {"kind": "storage#testIamPermissionsResponse"}
        return 200, (out | {"permissions": held}) if held else out

    # ---- bucket resources ----------------------------------------------------------------
    def create_error(self, query: dict[str, list[str]], body: dict[str, Any]) -> Reply | None:
        """[names] the bucket a buckets.insert asks for, before the emulator sees it."""
        if not query.get("project"):
            return gcs_error(400, "Required parameter: project", "required")
        name = str(body.get("name", ""))
        if not BUCKET_NAME.fullmatch(name) or name.startswith("goog") or ".." in name:
            return gcs_error(400, f"Invalid bucket name: '{name}'", "invalid")
        location = str(body.get("location") or "US").upper()
        if not (location in MULTI | DUAL or re.fullmatch(r"[A-Z]+-[A-Z]+\d+", location)):
            return gcs_error(400, "The specified location constraint is not valid.",
                             "invalid")
        return None

    def remember(self, name: str, body: dict[str, Any]) -> None:
        """What the emulator drops of a created bucket, and its default policy [ubla]."""
        location = str(body.get("location") or "US").upper()
        uniform = bool(((body.get("iamConfiguration") or {}).get("uniformBucketLevelAccess")
                        or {}).get("enabled"))
        self.buckets[name] = {"location": location, "locationType": location_type(location),
                              "projectNumber": str(self.gcp.number),
                              "iamConfiguration": self.iam_configuration(uniform, None)}
        with self.gcp.lock:
            self.gcp.adopt(self.resource(name))
            self.gcp.policies[self.resource(name)] = self.default_policy(uniform)

    @staticmethod
    def iam_configuration(uniform: bool, locked: str | None) -> dict[str, Any]:
        ubla: dict[str, Any] = {"enabled": uniform}
        if uniform:
            ubla["lockedTime"] = locked or rfc3339(time.time() + LOCK_SECONDS)
        return {"bucketPolicyOnly": dict(ubla), "uniformBucketLevelAccess": ubla,
                "publicAccessPrevention": "inherited"}

    def uniform(self, name: str) -> bool:
        ubla = self.buckets.get(name, {}).get("iamConfiguration", {}).get(
            "uniformBucketLevelAccess", {})
        return bool(ubla.get("enabled"))

    def patch_error(self, name: str, body: dict[str, Any]) -> Reply | None:
        """[ubla] an ACL change on a uniform bucket is refused; a uniform switch is kept."""
        current = self.buckets.get(name, {}).get("iamConfiguration", {})
        uniform = self.uniform(name)
        wanted = ((body.get("iamConfiguration") or {}).get("uniformBucketLevelAccess") or {})
        if "enabled" in wanted:
            uniform = bool(wanted["enabled"])
            locked = current.get("uniformBucketLevelAccess", {}).get("lockedTime")
            self.buckets.setdefault(name, {})["iamConfiguration"] = self.iam_configuration(
                uniform, locked)
        if uniform and ("acl" in body or "defaultObjectAcl" in body):
            return gcs_error(400, "Cannot use ACL API to update bucket policy when uniform "
                             "bucket-level access is enabled. Read more at https://cloud."
                             "google.com/storage/docs/uniform-bucket-level-access", "invalid")
        return None

    def splice(self, payload: Any) -> Any:
        """The kept fields into a bucket resource (or each of a list's items)."""
        if isinstance(payload, dict) and payload.get("kind") == "storage#buckets":
            payload["items"] = [self.splice(b) for b in payload.get("items", [])]
        elif isinstance(payload, dict) and payload.get("name") in self.buckets:
            for key, value in self.buckets[payload["name"]].items():
                if key in payload:
                    payload[key] = value
        return payload

    # ---- requests ------------------------------------------------------------------------
    def object_name(self, query: dict[str, list[str]], body: bytes) -> str | None:
        """An upload's object: ?name=, else the JSON metadata (the multipart's first part or
        a resumable upload's body)."""
        if query.get("name"):
            return query["name"][0]
        m = re.search(rb"\r\n\r\n(\{.*?\})\r\n--", body, re.S) or re.fullmatch(
            rb"\s*(\{.*\})\s*", body, re.S)
        try:
            return json.loads(m.group(1)).get("name") if m else None
        except ValueError:
            return None

    def checks(self, kind: str, perms: tuple[str, ...], g: dict[str, str],
               query: dict[str, list[str]], body: bytes) -> list[tuple[str, str]]:
        """(permission, resource) pairs a request needs [perms]."""
        if kind in ("create", "project"):
            return [(perms[0], f"projects/{(query.get('project') or ['_'])[0]}")]
        bucket = self.adopted(g["b"])
        if kind in ("bucket", "getIam", "setIam", "acl"):
            out = [(p, bucket) for p in perms]
            if kind == "bucket" and (b'"acl"' in body or b'"defaultObjectAcl"' in body):
                out.append(("storage.buckets.setIamPolicy", bucket))
            return out
        if kind == "object":
            return [(perms[0], self.resource(g["b"], g["o"]))]
        if kind == "upload" and "upload_id" not in query:
            return self.writes(g["b"], self.object_name(query, body) or "")
        if kind == "copy":
            self.adopted(g["db"])
            return ([("storage.objects.get", self.resource(g["b"], g["o"]))]
                    + self.writes(g["db"], g["do"]))
        if kind == "compose":
            sources = json.loads(body or b"{}").get("sourceObjects") or []
            return self.writes(g["b"], g["o"]) + [
                ("storage.objects.get", self.resource(g["b"], s.get("name", "")))
                for s in sources]
        return []  # testIamPermissions, a resumable upload's chunks

    def writes(self, bucket: str, obj: str) -> list[tuple[str, str]]:
        res = self.resource(bucket, obj)
        out = [("storage.objects.create", res)]
        if obj and self.exists(bucket, obj):
            out.append(("storage.objects.delete", res))  # an overwrite
        return out

    def serve(self, method: str, raw: str, body: bytes,
              headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        url = urlparse(raw)
        path, query = unquote(url.path), parse_qs(url.query)
        if path == "/token" and method == "POST":
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            return self.json(200, self.gcp.oauth_token(form.get("assertion", "")))
        member = self.gcp.member(next((v for k, v in headers.items()
                                       if k.lower() == "authorization"), None))
        route = next(((k, perms, mut, r.fullmatch(path).groupdict()) for m, r, k, perms, mut
                      in ROUTES if m == method and r.fullmatch(path)), None)
        if route is None:
            return self.json(*gcs_error(501, f"{method} {path} is not modelled by "
                                        "tests/fakes/gcs_iam.py", "notImplemented"))
        kind, perms, mutating, g = route
        needed = self.checks(kind, perms, g, query, body)
        status, out_headers, data = self.decide(method, raw, body, headers, member, kind,
                                                needed, g, query)
        self.gcp.record("storage", method, path, member, mutating=mutating,
                        permission=needed[0][0] if needed else None, status=status,
                        body=json_body(body, headers))
        return status, out_headers, data

    def decide(self, method: str, raw: str, body: bytes, headers: dict[str, str],
               member: str | None, kind: str, needed: list[tuple[str, str]],
               g: dict[str, str], query: dict[str, list[str]]) -> tuple[int, dict[str, str],
                                                                        bytes]:
        if member is not None and SERVICE not in self.gcp.enabled:
            return self.json(*self.gcp.service_disabled(SERVICE))
        for permission, resource in needed:
            err = self.check(member, permission, resource)
            if err:
                return self.json(*err)
        if member is None and kind != "chunk":
            return self.json(*denied(None, "storage.buckets.get"))
        payload = json_body(body, headers) or {}
        if kind in ("getIam", "setIam", "testIam") and not self.exists(g["b"]):
            return self.json(*gcs_error(404, "The specified bucket does not exist.",
                                        "notFound"))
        if kind == "getIam":
            return self.json(200, self.policy_json(g["b"], int(
                (query.get("optionsRequestedPolicyVersion") or ["1"])[0])))
        if kind == "setIam":
            return self.json(*self.set_policy(g["b"], payload))
        if kind == "testIam":
            return self.json(*self.test_permissions(member, g["b"], query))
        if kind == "acl" and self.uniform(g["b"]):
            return self.json(*gcs_error(400, "Cannot get legacy ACL for a bucket that has "
                                        "uniform bucket-level access. Read more at https://"
                                        "cloud.google.com/storage/docs/uniform-bucket-level-"
                                        "access", "invalid"))
        err = (self.create_error(query, payload) if kind == "create"
               else self.patch_error(g["b"], payload) if kind == "bucket"
               and method == "PATCH" else None)
        if err:
            return self.json(*err)
        return self.relay(method, raw, body, headers, kind, g, payload)

    def relay(self, method: str, raw: str, body: bytes, headers: dict[str, str], kind: str,
              g: dict[str, str], payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        status, out_headers, data = self.forward(method, raw, body, headers)
        if status == 200 and kind == "create":
            self.remember(payload["name"], payload)
        if status in (200, 204) and kind == "bucket" and method == "DELETE":
            self.buckets.pop(g["b"], None)
            with self.gcp.lock:
                self.gcp.policies.pop(self.resource(g["b"]), None)
        if status == 404 and not data:
            message = (f"No such object: {g['b']}/{g['o']}" if g.get("o")
                       else "The specified bucket does not exist.")
            return self.json(*gcs_error(404, message, "notFound"))
        if status == 200 and kind in ("create", "bucket", "project") and data[:1] == b"{":
            data = json.dumps(self.splice(json.loads(data))).encode()
        return status, out_headers, data

    @staticmethod
    def json(status: int, payload: Any) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json; charset=UTF-8"}, json.dumps(
            payload).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(JsonHandler):
            # Cloud Storage answers "Expect: 100-continue" at once (RFC 9110 §10.1.1); stdlib's
            # server does only as HTTP/1.1 (http.server's parse_request, handle_expect_100):
            # as HTTP/1.0 it said nothing, and curl -T waited its 1 s expect100-timeout for
            # every file the image build uploads. Each answer still closes its connection, as
            # before: server_close joins every handler thread, and one held open by a client's
            # idle keep-alive would never end.
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                body = self.read_body()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                status, out, data = proxy.serve(self.command, self.path, body, headers)
                ctype = next((v for k, v in out.items() if k.lower() == "content-type"),
                             "application/octet-stream")
                rest = {k: v for k, v in out.items() if k.lower() not in ("content-type",
                                                                           "server", "date")}
                rest["Connection"] = "close"
                self.send_body(status, data, ctype, rest)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

        return Handler
