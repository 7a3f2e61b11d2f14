"""The VPC of `gcp setup`: a custom-mode network, one subnet with Private Google Access, a
Cloud Router with NAT (the VMs have no external address; `apt-get`, PyPI and Prefect Cloud are
outside Google), the firewall rules, and the orchestrator's static internal address.

Firewall rules name service accounts, not tags (cloud.google.com/firewall/docs/firewalls#
serviceaccounts): any VM can set any tag on itself, but only a principal allowed to act as an
account can run a VM as it. A custom-mode network has only the implied rules (deny all
ingress, allow all egress), so what these rules open is everything inbound; `gcp check` lists
any other ingress rule on the network as drift.

Compute's operations are waited with the operations clients' `wait` (the `.result()` helpers
poll through a client that ignores a custom api_endpoint; tasks/compute/gce/api.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.api_core.exceptions import NotFound

from tasks.gcp.clients import Clients
from tasks.gcp.reconcile import Found, GcpError, Resource, api_call
from tasks.gcp.spec import IAP_RANGE, GcpSpec

WAIT_ROUNDS = 30  # each wait returns after at most ~2 minutes on the real API


def not_found(e: Exception) -> bool:
    return isinstance(e, NotFound)


def get_or_none(what: str, fn: Any) -> Any:
    """fn()'s resource, or None on 404; any other error is a GcpError."""
    def call() -> Any:
        try:
            return fn()
        except NotFound:
            return None

    return api_call(what, call)


def wait_operation(clients: Clients, project: str, what: str, op: Any,
                   region: str | None = None, zone: str | None = None) -> None:
    """Wait for a zone, region or global operation to be DONE; its errors raised naming
    `what`."""
    if zone is not None:
        ops = clients.compute("ZoneOperationsClient")
        wait = lambda: ops.wait(project=project, zone=zone, operation=op.name)  # noqa: E731
    elif region is None:
        ops = clients.compute("GlobalOperationsClient")
        wait = lambda: ops.wait(project=project, operation=op.name)  # noqa: E731
    else:
        ops = clients.compute("RegionOperationsClient")
        wait = lambda: ops.wait(project=project, region=region, operation=op.name)  # noqa: E731
    for _ in range(WAIT_ROUNDS):
        if op.status.name == "DONE":
            break
        op = api_call(f"{what} (waiting on {op.name})", wait)
    else:
        raise GcpError(f"{what}: operation {op.name} still {op.status.name} after "
                       f"{WAIT_ROUNDS} waits — see it with `gcloud compute operations "
                       f"describe {op.name}`, then run the command again")
    errors = list(op.error.errors) if op.error else []
    if errors:
        raise GcpError(f"{what}: " + "; ".join(f"{e.code}: {e.message}" for e in errors))


class ComputeResource(Resource):
    """A Compute resource: its operations waited, their errors raised with the resource."""

    def __init__(self, name: str, spec: GcpSpec, clients: Clients) -> None:
        super().__init__(name)
        self.spec = spec
        self.clients = clients

    def wait(self, op: Any, region: str | None = None, zone: str | None = None) -> None:
        wait_operation(self.clients, self.spec.project, str(self), op, region, zone)

    def call(self, verb: str, fn: Any, region: str | None = None,
             zone: str | None = None) -> None:
        self.wait(api_call(f"{self}: {verb}", fn), region, zone)


class Network(ComputeResource):
    kind = "network"

    def read(self) -> Found:
        nets = self.clients.compute("NetworksClient")
        net = get_or_none(str(self), lambda: nets.get(project=self.spec.project,
                                                      network=self.name))
        if net is None:
            return Found(False)
        drift = ["auto-mode (a subnet in every region): not the network setup makes — delete "
                 "it or name another [gcp] network"] if net.auto_create_subnetworks else []
        return Found(True, drift)

    def plan(self) -> str:
        return "networks.insert (custom mode: no subnets of its own)"

    def create(self) -> None:
        from google.cloud import compute_v1

        body = compute_v1.Network(name=self.name, auto_create_subnetworks=False,
                                  description="slm-nightly (gcp setup)")
        nets = self.clients.compute("NetworksClient")
        self.call("insert", lambda: nets.insert_unary(project=self.spec.project,
                                                      network_resource=body))

    def repair(self, found: Found) -> None:
        raise GcpError(f"{self}: {'; '.join(found.drift)}")

    def delete(self) -> None:
        nets = self.clients.compute("NetworksClient")
        self.call("delete", lambda: nets.delete_unary(project=self.spec.project,
                                                      network=self.name))


class Subnet(ComputeResource):
    kind = "subnet"

    def _client(self) -> Any:
        return self.clients.compute("SubnetworksClient")

    def read(self) -> Found:
        s = self.spec
        sub = get_or_none(str(self), lambda: self._client().get(
            project=s.project, region=s.home_region, subnetwork=self.name))
        if sub is None:
            return Found(False)
        drift = []
        if not sub.network.endswith(s.network_url):
            raise GcpError(f"{self}: belongs to {sub.network}, not {s.network} — name another "
                           "[gcp] subnet")
        if sub.ip_cidr_range != s.subnet_range:
            raise GcpError(f"{self}: range {sub.ip_cidr_range}, the profile says "
                           f"{s.subnet_range} — set [gcp] subnet_range = "
                           f"\"{sub.ip_cidr_range}\" (a subnet's range cannot shrink)")
        if not sub.private_ip_google_access:
            drift.append("Private Google Access off (the node reaches the bucket and Secret "
                         "Manager through it)")
        return Found(True, drift, sub.ip_cidr_range)

    def plan(self) -> str:
        return (f"subnetworks.insert {self.spec.subnet_range} in {self.spec.home_region}, "
                "Private Google Access on")

    def create(self) -> None:
        from google.cloud import compute_v1

        s = self.spec
        body = compute_v1.Subnetwork(name=self.name, network=s.network_url,
                                     ip_cidr_range=s.subnet_range, region=s.home_region,
                                     private_ip_google_access=True)
        self.call("insert", lambda: self._client().insert_unary(
            project=s.project, region=s.home_region, subnetwork_resource=body), s.home_region)

    def repair(self, found: Found) -> None:
        from google.cloud import compute_v1

        s = self.spec
        body = compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(
            private_ip_google_access=True)
        self.call("setPrivateIpGoogleAccess", lambda: self._client(
        ).set_private_ip_google_access_unary(
            project=s.project, region=s.home_region, subnetwork=self.name,
            subnetworks_set_private_ip_google_access_request_resource=body), s.home_region)

    def delete(self) -> None:
        s = self.spec
        self.call("delete", lambda: self._client().delete_unary(
            project=s.project, region=s.home_region, subnetwork=self.name), s.home_region)


class RouterNat(ComputeResource):
    """The Cloud Router and its NAT for every subnet range of the region."""

    kind = "router+nat"

    def _client(self) -> Any:
        return self.clients.compute("RoutersClient")

    def _nat(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.RouterNat(
            name=self.spec.nat, nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES")

    def read(self) -> Found:
        s = self.spec
        router = get_or_none(str(self), lambda: self._client().get(
            project=s.project, region=s.home_region, router=self.name))
        if router is None:
            return Found(False)
        nat = next((n for n in router.nats if n.name == s.nat), None)
        if nat is None:
            return Found(True, [f"no NAT {s.nat!r}: apt-get, PyPI and Prefect Cloud are "
                                "unreachable from VMs without external addresses"])
        if nat.source_subnetwork_ip_ranges_to_nat != "ALL_SUBNETWORKS_ALL_IP_RANGES":
            return Found(True, [f"NAT {s.nat!r} covers only some subnets "
                                f"({nat.source_subnetwork_ip_ranges_to_nat})"])
        return Found(True)

    def plan(self) -> str:
        return f"routers.insert with NAT {self.spec.nat} (all subnets, auto-allocated IPs)"

    def create(self) -> None:
        from google.cloud import compute_v1

        s = self.spec
        body = compute_v1.Router(name=self.name, network=s.network_url, region=s.home_region,
                                 nats=[self._nat()])
        self.call("insert", lambda: self._client().insert_unary(
            project=s.project, region=s.home_region, router_resource=body), s.home_region)

    def repair(self, found: Found) -> None:
        from google.cloud import compute_v1

        s = self.spec
        router = self._client().get(project=s.project, region=s.home_region, router=self.name)
        nats = [n for n in router.nats if n.name != s.nat] + [self._nat()]
        body = compute_v1.Router(nats=nats)
        self.call("patch", lambda: self._client().patch_unary(
            project=s.project, region=s.home_region, router=self.name, router_resource=body),
            s.home_region)

    def delete(self) -> None:
        s = self.spec
        self.call("delete", lambda: self._client().delete_unary(
            project=s.project, region=s.home_region, router=self.name), s.home_region)


@dataclass(frozen=True)
class Ingress:
    """What one INGRESS rule allows in: TCP on `port`, from the service accounts `sources` (or
    the address `ranges`) to the service accounts `targets` (or the VMs tagged `target_tags`),
    and why."""

    port: int
    why: str
    ranges: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    target_tags: tuple[str, ...] = ()


class Firewall(ComputeResource):
    """One INGRESS allow rule; `sources`/`targets` are service accounts unless `ranges` or
    `target_tags` say otherwise."""

    kind = "firewall"

    def __init__(self, name: str, spec: GcpSpec, clients: Clients, rule: Ingress) -> None:
        super().__init__(name, spec, clients)
        self.port, self.why = rule.port, rule.why
        self.ranges, self.sources = rule.ranges, rule.sources
        self.targets, self.target_tags = rule.targets, rule.target_tags

    def _client(self) -> Any:
        return self.clients.compute("FirewallsClient")

    def _want(self) -> dict[str, Any]:
        return {"network": self.spec.network_url, "direction": "INGRESS",
                "allowed": [("tcp", (str(self.port),))],
                "source_ranges": sorted(self.ranges),
                "source_service_accounts": sorted(self.sources),
                "target_service_accounts": sorted(self.targets),
                "target_tags": sorted(self.target_tags)}

    @staticmethod
    def _have(rule: Any) -> dict[str, Any]:
        return {"network": rule.network.split("/compute/v1/")[-1], "direction": rule.direction,
                "allowed": [(a.I_p_protocol, tuple(a.ports)) for a in rule.allowed],
                "source_ranges": sorted(rule.source_ranges),
                "source_service_accounts": sorted(rule.source_service_accounts),
                "target_service_accounts": sorted(rule.target_service_accounts),
                "target_tags": sorted(rule.target_tags)}

    def read(self) -> Found:
        rule = get_or_none(str(self), lambda: self._client().get(
            project=self.spec.project, firewall=self.name))
        if rule is None:
            return Found(False)
        have, want = self._have(rule), self._want()
        drift = [f"{k}: {have[k]} (want {want[k]})" for k in want if have[k] != want[k]]
        if rule.disabled:
            drift.append("disabled")
        return Found(True, drift, self.why)

    def plan(self) -> str:
        src = ", ".join(self.ranges or self.sources)
        dst = ", ".join(self.targets or self.target_tags)
        return f"firewalls.insert tcp:{self.port} from {src} to {dst} ({self.why})"

    def _body(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.Firewall(
            name=self.name, network=self.spec.network_url, direction="INGRESS", priority=1000,
            description=f"slm-nightly: {self.why}", disabled=False,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=[str(self.port)])],
            source_ranges=list(self.ranges), source_service_accounts=list(self.sources),
            target_service_accounts=list(self.targets), target_tags=list(self.target_tags))

    def create(self) -> None:
        body = self._body()
        self.call("insert", lambda: self._client().insert_unary(
            project=self.spec.project, firewall_resource=body))

    def repair(self, found: Found) -> None:
        # update (PUT) replaces the whole rule: a patch would keep a stray source list
        body = self._body()
        self.call("update", lambda: self._client().update_unary(
            project=self.spec.project, firewall=self.name, firewall_resource=body))

    def delete(self) -> None:
        self.call("delete", lambda: self._client().delete_unary(
            project=self.spec.project, firewall=self.name))


def firewalls(spec: GcpSpec, clients: Clients) -> list[Firewall]:
    """What is open inbound, and nothing else (issue 38, What to build 1)."""
    orch, node = spec.orchestrator_email, spec.node_email
    rules = [
        Firewall("slm-allow-iap-ssh", spec, clients, Ingress(
            port=22, ranges=(IAP_RANGE,), targets=(orch, node),
            why="SSH through IAP to both VMs")),
        # IAP forwards only the ports a rule admits from its range ("Using IAP for TCP
        # forwarding": cloud.google.com/iap/docs/using-tcp-forwarding): the operator's tunnel to
        # the Prefect UI needs its own, to the orchestrator alone
        Firewall("slm-allow-iap-prefect", spec, clients, Ingress(
            port=4200, ranges=(IAP_RANGE,), targets=(orch,),
            why="the Prefect UI through an IAP tunnel")),
        Firewall("slm-allow-prefect", spec, clients, Ingress(
            port=4200, sources=(node,), targets=(orch,),
            why="the node's worker reaches the Prefect server")),
        Firewall("slm-allow-engine", spec, clients, Ingress(
            port=9080, sources=(orch,), targets=(node,),
            why="the orchestrator reaches the node's engine")),
    ]
    if spec.neo4j == "self-hosted":
        rules.append(Firewall("slm-allow-neo4j", spec, clients, Ingress(
            port=7687, ranges=(spec.subnet_range,), target_tags=("slm-neo4j",),
            why="Bolt to the self-hosted Neo4j (VMs tagged slm-neo4j)")))
    return rules


class StrayIngress(ComputeResource):
    """Check only: any other enabled INGRESS rule on the network is drift (nothing else
    inbound). Setup never deletes a rule it did not make; check names it and the command."""

    kind = "inbound"
    report_only = True

    def __init__(self, spec: GcpSpec, clients: Clients, ours: list[str]) -> None:
        super().__init__(f"other rules on {spec.network}", spec, clients)
        self.ours = set(ours)

    def read(self) -> Found:
        s = self.spec
        rules = api_call(str(self), lambda: list(self.clients.compute("FirewallsClient").list(
            project=s.project)))
        stray = [r.name for r in rules if r.network.endswith(s.network_url)
                 and r.direction == "INGRESS" and not r.disabled and r.name not in self.ours]
        return Found(True, [f"rule {n!r} opens more (`gcloud compute firewall-rules delete "
                            f"{n}` if it is not yours)" for n in stray], "none")

    def delete(self) -> None:  # teardown: not ours
        pass


class InternalAddress(ComputeResource):
    """The orchestrator's static internal IP, so the node's Prefect URL never changes."""

    kind = "address"

    def _client(self) -> Any:
        return self.clients.compute("AddressesClient")

    def read(self) -> Found:
        s = self.spec
        addr = get_or_none(str(self), lambda: self._client().get(
            project=s.project, region=s.home_region, address=self.name))
        if addr is None:
            return Found(False)
        drift = [] if addr.subnetwork.endswith(s.subnet_url) else [
            f"in {addr.subnetwork}, not {s.subnet}"]
        return Found(True, drift, addr.address)

    def plan(self) -> str:
        return f"addresses.insert INTERNAL in {self.spec.subnet}"

    def create(self) -> None:
        from google.cloud import compute_v1

        s = self.spec
        body = compute_v1.Address(name=self.name, address_type="INTERNAL",
                                  subnetwork=s.subnet_url, region=s.home_region,
                                  description="slm-nightly: the orchestrator's address")
        self.call("insert", lambda: self._client().insert_unary(
            project=s.project, region=s.home_region, address_resource=body), s.home_region)

    def delete(self) -> None:
        s = self.spec
        self.call("delete", lambda: self._client().delete_unary(
            project=s.project, region=s.home_region, address=self.name), s.home_region)
