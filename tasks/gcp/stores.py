"""The bucket and the secrets of `gcp setup`.

The bucket: uniform bucket-level access (IAM only, no object ACLs), in the nodes' region, the
two accounts granted what tasks/gcp/grants.py lists. Teardown keeps it unless it is named.

A secret's value comes from a file or stdin, never the command line (argv is readable by every
user of the machine in /proc). Setup adds a version only when the secret has no enabled
version, or when the value given differs from the latest one (read back and compared, never
printed), so running setup again with the same value changes nothing.
"""

from __future__ import annotations

from secrets import token_urlsafe
from typing import Any

import google_crc32c
from google.api_core.exceptions import Conflict
from google.cloud.storage import Bucket as GcsBucket

from tasks.gcp import grants
from tasks.gcp.clients import Clients
from tasks.gcp.identity import _describe, _missing, _passing, _want
from tasks.gcp.network import get_or_none
from tasks.gcp.reconcile import Found, GcpError, Resource, api_call, retry

MAX_SECRET_BYTES = 64 * 1024  # Secret Manager's payload limit


class Bucket(Resource):
    kind = "bucket"
    keep = True

    def __init__(self, spec: Any, clients: Clients, delete_named: str | None = None) -> None:
        super().__init__(spec.bucket)
        self.spec, self.clients = spec, clients
        self.keep = delete_named != spec.bucket

    def _get(self) -> Any:
        try:
            return api_call(str(self), lambda: self.clients.storage.lookup_bucket(self.name))
        except GcpError as e:
            # a bucket that does not exist is a 404 to anyone; a 403 to a project owner is
            # another project's bucket (cloud.google.com/storage/docs/buckets: names are global)
            if e.api_off or ": 403 " not in str(e):
                raise
            raise GcpError(f"{e} — bucket names are global: gs://{self.name} most likely "
                           "belongs to another project; set another [gcp] bucket (if it is "
                           "yours, run setup as a project owner)") from None

    def read(self) -> Found:
        b = self._get()
        if b is None:
            return Found(False)
        region = self.spec.home_region.upper()
        if b.location and b.location.upper() not in (region,):
            raise GcpError(f"{self}: in {b.location}, the nodes are in {region} (cross-region "
                           "reads are billed and slow) — name another [gcp] bucket")
        drift = [] if b.iam_configuration.uniform_bucket_level_access_enabled else [
            "uniform bucket-level access off (object ACLs could grant what IAM does not)"]
        return Found(True, drift, b.location or "")

    def plan(self) -> str:
        return f"buckets.insert in {self.spec.home_region}, uniform bucket-level access"

    def create(self) -> None:
        b = GcsBucket(self.clients.storage, name=self.name)
        b.iam_configuration.uniform_bucket_level_access_enabled = True
        try:
            api_call(f"{self}: create", lambda: self.clients.storage.create_bucket(
                b, project=self.spec.project, location=self.spec.home_region))
        except GcpError as e:
            if isinstance(e.__context__, Conflict) or "409" in str(e):
                raise GcpError(f"{e} — bucket names are global: this one belongs to someone "
                               "else; set another [gcp] bucket") from None
            raise

    def repair(self, found: Found) -> None:
        b = self._get()
        b.iam_configuration.uniform_bucket_level_access_enabled = True
        api_call(f"{self}: patch", b.patch)

    def delete(self) -> None:
        b = self._get()
        blobs = api_call(f"{self}: list", lambda: list(b.list_blobs()))
        for blob in blobs:
            api_call(f"{self}: delete {blob.name}", blob.delete)
        api_call(f"{self}: delete", b.delete)


class BucketGrants(Resource):
    kind = "grants"

    def __init__(self, spec: Any, clients: Clients) -> None:
        super().__init__(f"gs://{spec.bucket}")
        self.spec, self.clients = spec, clients
        # (condition, role → members): the bindings without one, then the node's writes, each
        # role under its condition (grants.py CONDITIONS)
        self.wants: list[tuple[dict[str, str] | None, dict[str, set[str]]]] = [
            (None, _want(spec, "bucket")),
            *((grants.condition(spec.bucket, where), _want(spec, where))
              for where in grants.CONDITIONS)]

    def _bucket(self) -> Any:
        return self.clients.storage.bucket(self.spec.bucket)

    @staticmethod
    def _gap(policy: Any, condition: dict[str, str] | None,
             want: dict[str, set[str]]) -> dict[str, set[str]]:
        """What the bindings under `condition` (None: none) lack of `want` — judged on the
        expression alone: a title or description edited by hand is no drift."""
        expression = condition["expression"] if condition else None
        return _missing([(b["role"], list(b["members"])) for b in policy.bindings
                         if (b.get("condition") or {}).get("expression") == expression], want)

    def read(self) -> Found:
        policy = get_or_none(f"{self}: getIamPolicy", lambda: self._bucket().get_iam_policy(
            requested_policy_version=3))
        want = sum(len(m) for _, w in self.wants for m in w.values())
        gaps = [(c, w if policy is None else self._gap(policy, c, w)) for c, w in self.wants]
        missing = [d for c, gap in gaps
                   for d in _describe(gap, f" (on {c['title']})" if c else "")]
        return Found(True, missing, "not made yet" if policy is None else
                     f"{want} member binding(s)")

    def plan(self) -> str:
        return "buckets.setIamPolicy"

    def repair(self, found: Found) -> None:
        def write() -> None:
            bucket = self._bucket()
            policy = bucket.get_iam_policy(requested_policy_version=3)
            for condition, want in self.wants:
                for role, members in sorted(self._gap(policy, condition, want).items()):
                    policy.bindings.append({"role": role, "members": set(members)} | (
                        {"condition": dict(condition)} if condition else {}))
            policy.version = 3  # a policy that holds a condition is written as version 3
            bucket.set_iam_policy(policy)

        api_call(f"{self}: setIamPolicy", lambda: retry(str(self), write, retry_on=_passing))

    def delete(self) -> None:
        pass  # the bindings go with the bucket


class Secret(Resource):
    """One secret and its value; `value` None means "keep what is there"."""

    kind = "secret"

    def __init__(self, name: str, spec: Any, clients: Clients, value: bytes | None) -> None:
        super().__init__(name)
        self.spec, self.clients, self.value = spec, clients, value
        if value is not None and len(value) > MAX_SECRET_BYTES:
            raise GcpError(f"secret {name}: {len(value)} bytes, Secret Manager takes at most "
                           f"{MAX_SECRET_BYTES}")

    @property
    def path(self) -> str:
        return f"projects/{self.spec.project}/secrets/{self.name}"

    def read(self) -> Found:
        sm = self.clients.secrets
        if get_or_none(str(self), lambda: sm.get_secret(request={"name": self.path})) is None:
            return Found(False, detail=self._source())
        enabled = api_call(str(self), lambda: list(sm.list_secret_versions(
            request={"parent": self.path, "filter": "state:ENABLED"})))
        if not enabled:
            return Found(True, ["no enabled version (no value)"], self._source())
        if self.value is not None:
            latest = api_call(f"{self}: access latest", lambda: sm.access_secret_version(
                request={"name": f"{self.path}/versions/latest"}))
            if latest.payload.data != self.value:
                return Found(True, ["the value given differs from the latest version"])
        return Found(True, [], f"{len(enabled)} enabled version(s)")

    def _source(self) -> str:
        return "value given" if self.value is not None else "no value given"

    def plan(self) -> str:
        return "secrets.create" + (" + addVersion" if self.value is not None else
                                   " (needs a value: --secret-file or --secret-stdin)")

    def _need_value(self) -> bytes:
        if self.value is None:
            raise GcpError(f"secret {self.name}: no value — pass --secret-file "
                           f"{self.name}=PATH, or --secret-stdin {self.name} and pipe it in")
        return self.value

    def create(self) -> None:
        value = self._need_value()
        api_call(f"{self}: create", lambda: self.clients.secrets.create_secret(request={
            "parent": f"projects/{self.spec.project}", "secret_id": self.name,
            "secret": {"replication": {"automatic": {}}, "labels": {"made-by": "slm-nightly"}}}))
        self._add(value)

    def _add(self, value: bytes) -> None:
        crc = google_crc32c.value(value)
        api_call(f"{self}: addVersion", lambda: retry(
            str(self), lambda: self.clients.secrets.add_secret_version(request={
                "parent": self.path, "payload": {"data": value, "data_crc32c": crc}}),
            retry_on=_passing))

    def repair(self, found: Found) -> None:
        self._add(self._need_value())

    def delete(self) -> None:
        api_call(f"{self}: delete", lambda: self.clients.secrets.delete_secret(
            request={"name": self.path}))


class GeneratedSecret(Secret):
    """A secret whose value setup makes once (the Prefect API's auth string, `user:password`)
    and never reads back, compares or prints."""

    def __init__(self, name: str, spec: Any, clients: Clients, user: str = "slm") -> None:
        super().__init__(name, spec, clients, None)
        self.user = user

    def _source(self) -> str:
        return "value generated"

    def plan(self) -> str:
        return "secrets.create + addVersion (a generated auth string)"

    def _need_value(self) -> bytes:
        return f"{self.user}:{token_urlsafe(32)}".encode()
