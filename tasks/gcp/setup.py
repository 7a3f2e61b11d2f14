"""`gcp setup`, `gcp check`, `gcp teardown`: the resources of a project in the order they
depend on each other, run through tasks/gcp/reconcile.py.

Order: the APIs first (nothing else answers before them; the quota check needs Cloud Quotas
and Compute's quotas exist only once Compute is on), then the accounts (firewall rules and
grants name them), the network, the grants, the bucket, the secrets; the quota last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tasks.gcp import quota
from tasks.gcp.clients import Clients
from tasks.gcp.identity import (
    Apis,
    ServiceAccount,
    node_account_grants,
    project_grants,
    secret_grants,
)
from tasks.gcp.network import (
    InternalAddress,
    Network,
    RouterNat,
    StrayIngress,
    Subnet,
    firewalls,
)
from tasks.gcp.reconcile import GcpError, Mode, Outcome, Resource, run
from tasks.gcp.spec import GcpSpec
from tasks.gcp.stores import Bucket, BucketGrants, GeneratedSecret, Secret


@dataclass
class Result:
    outcomes: list[Outcome]
    quotas: list[quota.QuotaNeed] = field(default_factory=list)
    quota_request: Path | None = None

    @property
    def drifted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.state in ("missing", "drifted")]

    @property
    def ok(self) -> bool:
        return not self.drifted and not any(q.short for q in self.quotas)


def resources(spec: GcpSpec, clients: Clients, values: dict[str, bytes] | None = None,
              delete_bucket: str | None = None) -> list[Resource]:
    values = values or {}
    unknown = sorted(set(values) - set(spec.secrets))
    if unknown:
        raise GcpError(f"secret value(s) given for {unknown}, which the profile does not name "
                       f"— the node reads {spec.secrets or 'no secrets'} ([compute.node] "
                       "*_secret keys, [gcp] secrets)")
    if delete_bucket is not None and delete_bucket != spec.bucket:
        raise GcpError(f"--delete-bucket {delete_bucket!r} is not the profile's bucket "
                       f"{spec.bucket!r}: teardown deletes a bucket only when named exactly")
    fw = firewalls(spec, clients)
    out: list[Resource] = [
        Apis(spec, clients),
        ServiceAccount(spec.orchestrator, "runs the Prefect server and starts the node",
                       spec, clients),
        ServiceAccount(spec.node_account, "runs on the GPU node: the bucket, its secrets",
                       spec, clients),
        Network(spec.network, spec, clients),
        Subnet(spec.subnet, spec, clients),
        RouterNat(spec.router, spec, clients),
        *fw,
        StrayIngress(spec, clients, [f.name for f in fw]),
        InternalAddress(spec.orchestrator_ip, spec, clients),
        project_grants(spec, clients),
        node_account_grants(spec, clients),
        Bucket(spec, clients, delete_named=delete_bucket),
        BucketGrants(spec, clients),
    ]
    if spec.prefect == "server":
        name = spec.prefect_auth_secret
        out += [GeneratedSecret(name, spec, clients),
                secret_grants(spec, clients, name, "auth-secret")]
    for name in spec.secrets:
        out += [Secret(name, spec, clients, values.get(name)), secret_grants(spec, clients, name)]
    return out


@dataclass(frozen=True)
class ApplyOptions:
    """What the command line gives beside the profile: the secrets' values (`gcp setup
    --secret-file`, `--secret-stdin`; None: none) and the bucket `gcp teardown
    --delete-bucket` names (None: the bucket is kept)."""

    values: dict[str, bytes] | None = None
    delete_bucket: str | None = None


def apply(spec: GcpSpec, clients: Clients, mode: Mode, *, state_dir: Path,
          options: ApplyOptions = ApplyOptions(), say: Callable[[str], None] = print) -> Result:
    """Setup, check or teardown (or their dry runs); the quota is read after setup and check."""
    items = resources(spec, clients, options.values, options.delete_bucket)
    if mode.startswith("teardown"):
        # teardown removes what setup made; grants go with the accounts and the bucket
        items = [r for r in items if r.kind not in ("apis", "grants", "inbound")]
    result = Result(run(items, mode, say))
    if mode in ("setup", "check", "dry-run"):
        try:
            result.quotas = quota.read(clients, spec.project, quota.needs(
                spec.home_region, spec.nodes, spec.provisioning, spec.on_demand_fallback))
        except GcpError as e:
            if mode not in ("dry-run", "check") or not e.api_off:
                raise
            # a new project: Cloud Quotas (and Compute's quotas) appear once setup enables them
            say(f"  {'unknown':13} GPU quota — its API is not enabled yet (setup enables it, "
                "then reads the quota)")
        for q in result.quotas:
            say(q.line())
        short = [q for q in result.quotas if q.short]
        if short:
            result.quota_request = quota.write_request(state_dir / "gcp-quota-request.json",
                                                       spec.project, short)
            say(f"  GPU quota short: the request to file is in {result.quota_request} (console "
                "→ IAM & Admin → Quotas, or the gcloud commands in it); Google reviews it by "
                "hand, often in hours to days")
    return result
