"""The APIs, the two service accounts, their grants, the bucket and the secrets of `gcp setup`.

IAM policies are read, added to and written back with the etag they were read with: a
concurrent change fails the write (409 ABORTED) and the loop reads again, so setup never drops
a binding someone else added, and never removes one. A service account is usable in a policy
only some time after it is created ("you might need to wait for 60 seconds or more",
cloud.google.com/iam/docs/service-accounts-create); the write is retried while Google says it
does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from google.api_core.exceptions import Aborted, BadRequest, Conflict, InvalidArgument
from google.iam.v1 import policy_pb2

from tasks.gcp import grants
from tasks.gcp.clients import Clients
from tasks.gcp.network import get_or_none, not_found
from tasks.gcp.reconcile import Found, Resource, api_call, retry
from tasks.gcp.spec import APIS, GcpSpec

ENABLE_BATCH = 20  # services.batchEnable takes at most 20 ids
OPERATION_SECONDS = 600.0
PROPAGATION_SECONDS = 180.0


def _passing(e: Exception) -> bool:
    """Errors that pass with time: a concurrent policy write, a service account that IAM does
    not see yet."""
    if isinstance(e, Aborted | Conflict):
        return True
    return isinstance(e, BadRequest | InvalidArgument) and "does not exist" in str(e)


class Apis(Resource):
    kind = "apis"

    def __init__(self, spec: GcpSpec, clients: Clients) -> None:
        super().__init__(f"{len(APIS)} services")
        self.spec, self.clients = spec, clients

    def _disabled(self) -> list[str]:
        p = self.spec.project
        got = api_call(str(self), lambda: self.clients.services.batch_get_services(request={
            "parent": f"projects/{p}", "names": [f"projects/{p}/services/{a}" for a in APIS]}))
        on = {s.name.rsplit("/", 1)[-1] for s in got.services if s.state.name == "ENABLED"}
        return [a for a in APIS if a not in on]

    def read(self) -> Found:
        off = self._disabled()
        return Found(True, [f"disabled: {', '.join(off)}"] if off else [], "all enabled")

    def plan(self) -> str:
        return "services.batchEnable"

    def repair(self, found: Found) -> None:
        off = self._disabled()
        # without a billing account the enable call itself is refused (400, "Billing must be
        # enabled for activation of service(s) …")
        billing = (f"link a billing account to the project (`gcloud billing projects link "
                   f"{self.spec.project} --billing-account=…`), then run setup again")
        for at in range(0, len(off), ENABLE_BATCH):
            ids = off[at:at + ENABLE_BATCH]
            fix = billing if "compute.googleapis.com" in ids else ""
            op: Any = api_call(f"{self}: batchEnable {ids}", partial(
                self.clients.services.batch_enable_services, request={
                    "parent": f"projects/{self.spec.project}", "service_ids": ids}), fix=fix)
            api_call(f"{self}: enabling {ids}", partial(op.result, OPERATION_SECONDS), fix=fix)

    def delete(self) -> None:
        pass  # teardown leaves APIs on: other things in the project may use them


class ServiceAccount(Resource):
    kind = "service account"

    def __init__(self, account_id: str, why: str, spec: GcpSpec, clients: Clients) -> None:
        super().__init__(spec.account(account_id))
        self.account_id, self.why = account_id, why
        self.spec, self.clients = spec, clients

    @property
    def path(self) -> str:
        return f"projects/{self.spec.project}/serviceAccounts/{self.name}"

    def read(self) -> Found:
        acct = get_or_none(str(self), lambda: self.clients.iam.get_service_account(
            request={"name": self.path}))
        if acct is None:
            return Found(False)
        return Found(True, ["disabled"] if acct.disabled else [], self.why)

    def plan(self) -> str:
        return f"serviceAccounts.create ({self.why})"

    def create(self) -> None:
        api_call(f"{self}: create", lambda: self.clients.iam.create_service_account(request={
            "name": f"projects/{self.spec.project}", "account_id": self.account_id,
            "service_account": {"display_name": f"slm-nightly {self.account_id}",
                                "description": self.why}}))

    def repair(self, found: Found) -> None:
        api_call(f"{self}: enable", lambda: self.clients.iam.enable_service_account(
            request={"name": self.path}))

    def delete(self) -> None:
        api_call(f"{self}: delete", lambda: self.clients.iam.delete_service_account(
            request={"name": self.path}))


def _missing(bindings: list[tuple[str, list[str]]], want: dict[str, set[str]]
             ) -> dict[str, set[str]]:
    have: dict[str, set[str]] = {}
    for role, members in bindings:
        have.setdefault(role, set()).update(members)
    out = {role: members - have.get(role, set()) for role, members in want.items()}
    return {r: m for r, m in out.items() if m}


def bind(bindings: Any, role: str, members: Iterable[str], binding: Callable[..., Any]) -> None:
    """`members` added to the unconditional binding of `role` in a policy's `bindings`, made
    with `binding(role=…)` (the API's Binding type) where there is none."""
    found = next((b for b in bindings if b.role == role and not b.condition.expression), None)
    if found is None:
        bindings.append(binding(role=role))
        found = bindings[-1]  # the stored copy: appending copies a message
    found.members.extend(sorted(members))


def _describe(missing: dict[str, set[str]], where: str = "") -> list[str]:
    return [f"{m.split(':', 1)[-1]} lacks {r}{where}" for r, ms in sorted(missing.items())
            for m in sorted(ms)]


class PolicyGrants(Resource):
    """Bindings on one resource whose IAM policy is a google.iam.v1 Policy (a project, a
    service account, a secret), through its API's client: added, never removed."""

    kind = "grants"

    def __init__(self, name: str, want: dict[str, set[str]], client: Any, resource: str,
                 new_account: bool = False) -> None:
        super().__init__(name)
        self.want, self.client, self.resource = want, client, resource
        self.new_account = new_account

    def _get(self) -> Any:
        # at version 3, as IAM asks of any code that writes a policy back: a lower version
        # returns conditional bindings without their conditions, under mangled role names that
        # cannot be written (cloud.google.com/iam/docs/policies#versions); written back, the
        # policy keeps the version it was read at
        return self.client.get_iam_policy(request={
            "resource": self.resource, "options": {"requested_policy_version": 3}})

    def _set(self, policy: Any) -> None:
        self.client.set_iam_policy(request={"resource": self.resource, "policy": policy})

    def _gap(self, policy: Any) -> dict[str, set[str]]:
        return _missing([(b.role, list(b.members)) for b in policy.bindings if not
                         b.condition.expression], self.want)

    def read(self) -> Found:
        policy = get_or_none(f"{self}: getIamPolicy", self._get)
        if policy is None:  # what it grants on is not made yet (or not yet seen by IAM)
            return Found(True, _describe(self.want), "not made yet")
        return Found(True, _describe(self._gap(policy)),
                     f"{sum(map(len, self.want.values()))} member binding(s)")

    def plan(self) -> str:
        return "setIamPolicy"

    def repair(self, found: Found) -> None:
        def write() -> None:
            # a service account just made is not found by IAM for a while: read again
            policy = retry(str(self), self._get, retry_on=not_found,
                           seconds=PROPAGATION_SECONDS) if self.new_account else self._get()
            for role, members in sorted(self._gap(policy).items()):
                bind(policy.bindings, role, members, policy_pb2.Binding)
            self._set(policy)

        api_call(f"{self}: setIamPolicy", lambda: retry(
            str(self), write, retry_on=_passing, seconds=PROPAGATION_SECONDS))

    def delete(self) -> None:
        pass  # the bindings go with their accounts; setup never removes bindings


def _want(spec: GcpSpec, where: grants.Where) -> dict[str, set[str]]:
    want: dict[str, set[str]] = {}
    for who, email in (("orchestrator", spec.orchestrator_email), ("node", spec.node_email)):
        for role in grants.roles(who, where):  # type: ignore[arg-type]
            want.setdefault(role, set()).add(f"serviceAccount:{email}")
    return want


def project_grants(spec: GcpSpec, clients: Clients) -> PolicyGrants:
    resource = f"projects/{spec.project}"
    return PolicyGrants(resource, _want(spec, "project"), clients.projects, resource)


def node_account_grants(spec: GcpSpec, clients: Clients) -> PolicyGrants:
    """The orchestrator acts as the node's account (on that account only, not the project)."""
    resource = f"projects/{spec.project}/serviceAccounts/{spec.node_email}"
    return PolicyGrants(spec.node_email, _want(spec, "node-account"), clients.iam, resource,
                        new_account=True)


def secret_grants(spec: GcpSpec, clients: Clients, secret: str,
                  where: grants.Where = "secrets") -> PolicyGrants:
    resource = f"projects/{spec.project}/secrets/{secret}"
    return PolicyGrants(f"secret {secret}", _want(spec, where), clients.secrets, resource)
