"""A local Compute Engine v1 REST server, for driving the real google-cloud-compute client
(REST transport) without GCP.

Implemented (the subset the GCE node, `tasks.compute.gce.lifecycle.GceNode`, and the preflight use):
    GET  /compute/v1/projects/P/zones/Z/instances/I                    instances.get
    POST /compute/v1/projects/P/zones/Z/instances/I/start              instances.start
    POST /compute/v1/projects/P/zones/Z/instances/I/stop               instances.stop
    POST /compute/v1/projects/P/zones/Z/instances/I/setScheduling      instances.setScheduling
    POST /compute/v1/projects/P/zones/Z/instances/I/setMetadata        instances.setMetadata
    GET  /compute/v1/projects/P/zones/Z/instances/I/getGuestAttributes instances.getGuestAttributes
    POST /compute/v1/projects/P/zones/Z/instances/I/testIamPermissions instances.testIamPermissions
    GET  /compute/v1/projects/P/zones/Z/instances/I/getIamPolicy       instances.getIamPolicy
    POST /compute/v1/projects/P/zones/Z/instances/I/setIamPolicy       instances.setIamPolicy
         (with a FakeProject only: the instance's policy is the project's `policies[resource]`,
         checked by every later call on the instance; [iampolicy])
    GET  /compute/v1/projects/P/zones/Z/operations/O                   zoneOperations.get
    POST /compute/v1/projects/P/zones/Z/operations/O/wait              zoneOperations.wait
    GET  /compute/v1/projects/P/zones/Z/operations?filter=...          zoneOperations.list
    GET  /compute/v1/projects/P                                        projects.get (quotas)
    GET  /compute/v1/projects/P/regions/R                              regions.get (quotas)
    networks, subnetworks, routers, firewalls, addresses, images, global/region operations,
    instances.insert/delete                         tests/fakes/compute_network.py (`network`)
    POST /token                                                        OAuth token (service accounts)

Simulated behaviour, on the wall clock (durations are attributes, in seconds):
    operations       PENDING → RUNNING → DONE
    start            TERMINATED → STAGING → RUNNING after `boot_seconds` (per instance)
    stop             RUNNING → STOPPING → TERMINATED after `stop_seconds`
    stockout         `stock_out(zone, "SPOT")`: a start in that zone with that provisioning
                     model ends DONE with ZONE_RESOURCE_POOL_EXHAUSTED, as a real stockout does
    start errors     `fail_start(zone, model, kind)`: each start there fails as Compute fails it —
                     an operation error (stockout, stockout-details, quota, quota-regional,
                     unsupported), an HTTP error on the start call (503, 500, 429, rate-limit,
                     quota-http) or a preemption during boot (preempted); `clear_failures(zone)`
    transient errors `fail_next(verb, status, reason, times)`: the next `times` calls of one verb
                     ('get', 'wait', 'start', 'list', ...) answer that HTTP error (status 0: the
                     connection is reset without an answer)
    preemption       `preempt(zone, name)`: TERMINATED now, plus a compute.instances.preempted
                     operation, as GCE records it
    setScheduling    fields absent from the body are kept, an explicit null clears one; the
                     merged scheduling is validated as Compute validates it (see _set_scheduling)
    max run duration `scheduling.maxRunDuration` + instanceTerminationAction STOP: RUNNING for
                     longer than the duration (× `run_duration_scale`, so tests run in fractions
                     of a second) → STOPPING → TERMINATED, counted again from every RUNNING;
                     DELETE: the instance and its autoDelete disks are gone then
    IAM              principals from the credentials (the JWT assertion sent to /token, or a
                     self-signed JWT); `enforce_iam = True` checks each call against roles granted
                     with `grant(principal, role, resource)` (off by default: everyone may do
                     everything); setMetadata on an instance that runs as a service account also
                     needs iam.serviceAccounts.actAs on it (roles/iam.serviceAccountUser)
    guest attributes `put_guest_attribute(zone, name, path, value)` as the guest writes them —
                     refused unless metadata enable-guest-attributes=TRUE; read back with
                     getGuestAttributes?queryPath= / ?variableKey=
    missing instance 404 with Compute's error JSON
    every call       recorded in `calls` (method, path, Authorization header, principal, body)
    RUNNING time     per instance, `running_seconds(zone, name)`
    node runtime     optional `node_runtime` object: boot(inst) when an instance reaches RUNNING,
                     power_off(inst) when it leaves RUNNING (stop, preemption, max run duration),
                     metadata_changed(inst) on setMetadata while RUNNING (tests/fakes/node_runtime.py)
    node agent       optional `on_start` argv: launched when an instance reaches RUNNING and
                     killed on stop/preemption, as the node's startup script starts vLLM; the
                     metadata key `slm-engine` = "stopped" / "running" stops / restarts it, as
                     the node's watcher does.
    node worker      optional `node_worker` argv: launched when an instance reaches RUNNING
                     and killed (with everything it started) on stop/preemption only — the
                     node's Prefect worker on its own pool, as the startup script starts it.
    quotas           [quota] projects.get / regions.get answer `quotas` [{metric, limit,
                     usage}]: by default limits that let a few L4 nodes start (REGION_QUOTAS in
                     every region, PROJECT_QUOTAS); `set_quota(metric, limit, usage, region=R)`
                     (region None: a project-wide metric) changes one, e.g. a 0 limit
    networking       [subnet] each instance's nic0 is on the subnetwork `default` of its zone's
                     region (zone "us-central1-a" → region "us-central1"; "zone-a" → "zone"),
                     without accessConfigs (no external IP: `--no-address`) unless
                     add_instance(external_ip=...); `subnet(region)` is the subnet, with
                     privateIpGoogleAccess true unless a test sets it false; `add_nat(region)`
                     adds a Cloud NAT router ([router] routers.list) for all or listed subnets.
                     Quotas are not IAM-checked (enforce_iam applies to instances and operations
                     only), nor take fail_next faults. The state is `network`'s.
    FakeProject      optional `gcp`: every compute call needs compute.googleapis.com enabled
                     (SERVICE_DISABLED), IAM is gcp's (members "serviceAccount:EMAIL", /token
                     hands out its tokens), calls are recorded there (compute_network.py).
Internal IP: each VM has its own internal IP from its VPC subnet ([ref] networkInterfaces[].
networkIP; "IP addresses", cloud.google.com/vpc/docs/ip-addresses), so N nodes serve on the
same port side by side. The fake's networkIP is a loopback address: 127.0.0.1 unless
add_instance gives another (`network_ip="127.0.0.2"`, …: Linux routes all of 127.0.0.0/8 to
`lo`, so a server bound there is reachable at it), so whatever `on_start` launches on the
instance's address is reachable at the node's "VPC IP". The API server binds 127.0.0.1 only.

Sources the behaviour follows (read 2026-12; where a source is silent the fake takes the reading
that is harder on the code, and says so):
  [ref]   Compute Engine API v1 reference, instances.* and Scheduling
          (cloud.google.com/compute/docs/reference/rest/v1/instances), google-cloud-compute 1.x
          REST transport paths (compute_v1/services/instances/transports/rest_base.py).
  [limit] "Limit the run time of a VM" (cloud.google.com/compute/docs/instances/limit-vm-runtime):
          maxRunDuration 30 s … 120 days, action STOP or DELETE, the termination timestamp set
          whenever the VM enters RUNNING and cleared when it stops, not for legacy preemptible.
  [gcloud] gcloud's `compute instances set-scheduling` (googlecloudsdk/surface/compute/instances/
          set_scheduling.py): sends only the flags given and an explicit null to clear one —
          the API keeps fields a setScheduling body leaves out.
  [errors] Error texts as Compute returns them, from public reports: "Invalid value for field
          'resource.scheduling.instanceTerminationAction': 'STOP'. You cannot specify a
          termination action for a VM instance that has the standard provisioning model"
          (GoogleCloudPlatform/cluster-toolkit#4435), "For preemptible, only allowed
          provisioning_model value is SPOT" (terraform-google-modules/terraform-google-vm#254),
          "Instances with guest accelerators do not support live migration." (loft-sh/devpod#973),
          "Required 'iam.serviceAccounts.actAs' permission for '…'" 403 forbidden
          (googleapis/google-api-dotnet-client#2095), ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS)
          and QUOTA_EXCEEDED "Quota 'X' exceeded.  Limit: N in region R." as operation errors
          (GoogleCloudPlatform/ai-on-gke#849), cloud.google.com/compute/docs/troubleshooting/
          troubleshooting-resource-availability.
  [iampolicy] instances.getIamPolicy / setIamPolicy (cloud.google.com/compute/docs/reference/
          rest/v1/instances/setIamPolicy): GET …/instances/I/getIamPolicy?
          optionsRequestedPolicyVersion=N answers a Policy; POST …/setIamPolicy takes {policy:
          {bindings, etag, version}} and replaces the policy (a stale etag fails); a binding on
          the instance grants its role there only ("Grant access to a resource: instances",
          cloud.google.com/compute/docs/access/granting-access-to-resources).
  [quota] projects.get and regions.get (cloud.google.com/compute/docs/reference/rest/v1/
          projects/get, .../regions/get): `quotas[]` of {metric, limit, usage} (numbers), the
          regional GPU metrics NVIDIA_L4_GPUS and PREEMPTIBLE_NVIDIA_L4_GPUS, the project-wide
          GPUS_ALL_REGIONS; "Allocation quotas" (cloud.google.com/compute/resource-usage).
  [subnet] subnetworks.get (cloud.google.com/compute/docs/reference/rest/v1/subnetworks/get):
          name, network, ipCidrRange, region, privateIpGoogleAccess, selfLink; an instance's
          networkInterfaces[].subnetwork is that subnet's URL and accessConfigs is absent for
          an instance created with `--no-address`.
  [router] routers.list (cloud.google.com/compute/docs/reference/rest/v1/routers/list): items[]
          with network and nats[] {name, sourceSubnetworkIpRangesToNat
          (ALL_SUBNETWORKS_ALL_IP_RANGES | LIST_OF_SUBNETWORKS), subnetworks[] {name: URL}}.
  [guest] "Set and query guest attributes" (cloud.google.com/compute/docs/metadata/
          manage-guest-attributes): off unless metadata enable-guest-attributes=TRUE; the guest's
          write is refused then; a query of a path with nothing under it is a 404.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol, Self
from urllib.parse import parse_qs, urlparse

from tests.fakes.compute_network import NetworkState, Subnetwork
from tests.fakes.gcp_project import FakeProject
from tests.fakes.loopback import JsonHandler, LoopbackServer, Served
from tests.support.paths import ROOT

TOKEN = "ya29.fake-compute-token-7f3c"  # what /token hands out (+ a per-principal suffix)
AGENT_KEY = "slm-engine"
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
NODE_SA = "slm-node@{project}.iam.gserviceaccount.com"  # add_instance's default service account
MIN_RUN_SECONDS, MAX_RUN_SECONDS = 30, 120 * 86400  # [limit]
# [quota] what the fake answers unless set_quota says otherwise: enough for a few L4 nodes
REGION_QUOTAS = {"CPUS": 24.0, "NVIDIA_L4_GPUS": 8.0, "PREEMPTIBLE_NVIDIA_L4_GPUS": 8.0,
                 "PREEMPTIBLE_CPUS": 24.0, "IN_USE_ADDRESSES": 8.0}
PROJECT_QUOTAS = {"GPUS_ALL_REGIONS": 8.0, "NETWORKS": 5.0, "FIREWALLS": 100.0}
START_FAILURES = ("stockout", "stockout-details", "quota", "quota-regional", "unsupported",
                  "503", "500", "429", "rate-limit", "quota-http", "preempted")

# Roles → the permissions the fake checks ([ref] "IAM permissions" of each method; the roles'
# contents from cloud.google.com/iam/docs/understanding-roles, only the permissions used here).
_INSTANCE_ADMIN = frozenset({
    "compute.instances.get", "compute.instances.list", "compute.instances.start",
    "compute.instances.stop", "compute.instances.setScheduling", "compute.instances.setMetadata",
    "compute.instances.getGuestAttributes", "compute.zoneOperations.get",
    "compute.zoneOperations.list"})
ROLES: dict[str, frozenset[str]] = {
    "roles/compute.instanceAdmin.v1": _INSTANCE_ADMIN,
    "roles/compute.instanceAdmin": _INSTANCE_ADMIN,
    "roles/compute.viewer": frozenset({"compute.instances.get", "compute.instances.list",
                                       "compute.zoneOperations.get",
                                       "compute.zoneOperations.list"}),
    "roles/iam.serviceAccountUser": frozenset({"iam.serviceAccounts.actAs",
                                               "iam.serviceAccounts.get",
                                               "iam.serviceAccounts.list"}),
}
ALL = "*"  # roles/owner, roles/editor: everything
VERB_PERMISSION = {"get": "compute.instances.get", "start": "compute.instances.start",
                   "stop": "compute.instances.stop",
                   "setScheduling": "compute.instances.setScheduling",
                   "setMetadata": "compute.instances.setMetadata",
                   "getGuestAttributes": "compute.instances.getGuestAttributes",
                   "getIamPolicy": "compute.instances.getIamPolicy",
                   "setIamPolicy": "compute.instances.setIamPolicy"}


class NodeRuntime(Protocol):
    """What runs "on" a fake instance (tests/fakes/node_runtime.py). Called with the fake's lock held."""

    def boot(self, inst: FakeInstance) -> None: ...
    def power_off(self, inst: FakeInstance) -> None: ...
    def metadata_changed(self, inst: FakeInstance) -> None: ...


class GuestAttributesDisabled(RuntimeError):
    """The guest's write was refused: metadata enable-guest-attributes is not TRUE [guest]."""


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _jwt_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT, unverified (the fake trusts its callers; it only needs a name)."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        pad = "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + pad))
    except ValueError:
        return {}
    return claims if isinstance(claims, dict) else {}


def _error(code: int, message: str, reason: str, domain: str = "global",
           **extra: Any) -> tuple[int, dict[str, Any]]:
    """Compute's error JSON (v1 REST): error.code/message plus errors[] with domain/reason
    (`extra`: e.g. the gRPC-style status RESOURCE_EXHAUSTED of a 429)."""
    body: dict[str, Any] = {"code": code, "message": message,
                            "errors": [{"message": message, "domain": domain, "reason": reason}]}
    body.update(extra)
    return code, {"error": body}


@dataclass
class FakeInstance:
    project: str
    zone: str
    name: str
    id: int
    status: str = "TERMINATED"
    provisioning_model: str = "SPOT"
    boot_seconds: float = 0.3
    metadata: dict[str, str] = field(default_factory=dict)
    metadata_fingerprint: str = "fp-0"
    last_start: float | None = None
    last_stop: float | None = None
    running_since: float | None = None
    running_total: float = 0.0
    agent: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None  # the node's Prefect worker (node_worker)
    generation: int = 0  # bumps on every start/stop so stale scheduled events are dropped
    # scheduling, as Compute stores it (the rest of `scheduling()` derives from these)
    preemptible: bool = True
    automatic_restart: bool = False
    on_host_maintenance: str = "TERMINATE"
    termination_action: str | None = "STOP"
    max_run_seconds: int | None = None
    termination_at: float | None = None  # [limit] set on RUNNING when a duration is set
    max_run_stops: int = 0  # how often the max run duration stopped it
    service_account: str | None = None
    guest_attributes: dict[str, str] = field(default_factory=dict)  # "namespace/key" → value
    # what `gcloud compute instances create --machine-type=g2-standard-4` makes (a G2 comes
    # with its L4 attached); a test changes them to model a misbuilt instance
    machine_type: str = "g2-standard-4"
    accelerators: list[tuple[str, int]] = field(default_factory=lambda: [("nvidia-l4", 1)])
    network_ip: str = "127.0.0.1"  # its own "VPC IP" (module docstring: Internal IP)
    subnetwork: str = "default"  # [subnet] in its zone's region
    external_ip: str | None = None  # accessConfigs[0].natIP; None: `--no-address`
    tags: list[str] = field(default_factory=list)  # tags.items (instances.insert)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def link(self, base: str) -> str:
        return f"{base}/compute/v1/projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    def resource(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    def scheduling(self) -> dict[str, Any]:
        d: dict[str, Any] = {"provisioningModel": self.provisioning_model,
                             "preemptible": self.preemptible,
                             "automaticRestart": self.automatic_restart,
                             "onHostMaintenance": self.on_host_maintenance}
        if self.termination_action:
            d["instanceTerminationAction"] = self.termination_action
        if self.max_run_seconds is not None:
            d["maxRunDuration"] = {"seconds": str(self.max_run_seconds)}
        return d

    def guest_attributes_enabled(self) -> bool:
        return self.metadata.get(GUEST_ATTRIBUTES_KEY, "").strip().upper() == "TRUE"


FakeSubnet = Subnetwork  # [subnet] now tests/fakes/compute_network.py's


@dataclass
class FakeOperation:
    project: str
    zone: str
    name: str
    id: int
    op_type: str
    target: FakeInstance
    created: float
    running_at: float
    done_at: float
    error: dict[str, Any] | None = None
    http_status: tuple[int, str] = (503, "SERVICE UNAVAILABLE")
    user: str = "system"


@dataclass
class _Fault:
    verb: str
    status: int
    reason: str
    times: int
    kind: str | None  # "instances" | "operations" | None (both)


class _Reset(Exception):
    """Close the connection without an answer (a reset, as a dropped proxy connection)."""


class FakeComputeEngine(Served):
    """Use as a context manager; `url` is the api_endpoint to give the client."""

    def __init__(self, project: str = "test-project", op_pending_seconds: float = 0.05,
                 stop_seconds: float = 0.2, wait_cap_seconds: float = 2.0,
                 on_start: Callable[[FakeInstance], list[str]] | None = None,
                 agent_log: Path | None = None,
                 node_worker: Callable[[FakeInstance], list[str]] | None = None,
                 node_runtime: NodeRuntime | None = None,
                 run_duration_scale: float = 1.0, gcp: FakeProject | None = None) -> None:
        self.project = project
        self.gcp = gcp  # the shared project: its IAM, enabled services and call log
        self.op_pending_seconds = op_pending_seconds
        self.stop_seconds = stop_seconds
        self.wait_cap_seconds = wait_cap_seconds  # the real wait returns after ~2 minutes
        self.on_start = on_start
        self.agent_log = agent_log
        self.node_worker = node_worker
        self.node_runtime = node_runtime
        self.run_duration_scale = run_duration_scale  # fake seconds per maxRunDuration second
        self.instances: dict[tuple[str, str], FakeInstance] = {}
        self.operations: dict[tuple[str, str], FakeOperation] = {}
        self.stockouts: set[tuple[str, str]] = set()
        self.start_failures: dict[tuple[str, str], str] = {}
        self.faults: list[_Fault] = []
        self.enforce_iam = False
        self.grants: set[tuple[str, str, str]] = set()  # (principal, role, resource)
        self.tokens: dict[str, str] = {}  # access token → principal
        self.calls: list[dict[str, Any]] = []
        self.region_quotas: dict[str, dict[str, list[float]]] = {}  # region → metric → [l, u]
        self.project_quotas = {m: [v, 0.0] for m, v in PROJECT_QUOTAS.items()}
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count(1)
        self._lock = threading.RLock()
        self.http = LoopbackServer(self._handler())
        self.token_uri = f"{self.url}/token"
        self.network = NetworkState(self, gcp)  # networks, subnets, routers, …, inserts
        self._clock = threading.Thread(target=self._run_clock, daemon=True)
        self._closed = threading.Event()

    # ---- test controls -------------------------------------------------------------------
    def __enter__(self) -> Self:
        super().__enter__()
        self._clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        super().__exit__(*exc)
        with self._lock:
            for inst in self.instances.values():
                if inst.status in ("RUNNING", "STOPPING") and self.node_runtime is not None:
                    self.node_runtime.power_off(inst)
                self._kill_agent(inst)
                worker, inst.worker = inst.worker, None
                self._end(worker)

    def add_instance(self, zone: str, name: str, *, status: str = "TERMINATED",
                     provisioning_model: str = "SPOT", boot_seconds: float = 0.3,
                     service_account: str | None = "",
                     metadata: dict[str, str] | None = None,
                     network_ip: str = "127.0.0.1", subnetwork: str = "default",
                     external_ip: str | None = None) -> FakeInstance:
        """An instance as `gcloud compute instances create` leaves it: SPOT with STOP, or
        STANDARD with Compute's defaults for a GPU VM (automaticRestart true, TERMINATE).
        `service_account` "" → NODE_SA; None → an instance without a service account.
        `network_ip`: its internal IP, a loopback address of its own when several nodes serve
        on one port (module docstring). `subnetwork`: its subnet in the zone's region;
        `external_ip`: an accessConfig (None: no external IP, as `--no-address`)."""
        if not network_ip.startswith("127."):
            raise ValueError(f"network_ip {network_ip!r}: a loopback address (127.x.y.z)")
        with self._lock:
            spot = provisioning_model == "SPOT"
            inst = FakeInstance(
                self.project, zone, name, next(self._seq), status=status,
                provisioning_model=provisioning_model, boot_seconds=boot_seconds,
                preemptible=spot, automatic_restart=not spot,
                termination_action="STOP" if spot else None,
                service_account=(NODE_SA.format(project=self.project)
                                 if service_account == "" else service_account),
                metadata=dict(metadata or {}), network_ip=network_ip,
                subnetwork=subnetwork, external_ip=external_ip)
            self.instances[(zone, name)] = inst
            self.subnet(inst.region, subnetwork)
            if status == "RUNNING":
                self._enter_running(inst)
            return inst

    def set_quota(self, metric: str, limit: float, usage: float = 0.0,
                  region: str | None = None) -> None:
        """[quota] one metric's limit and usage: in `region` (regions.get), or project-wide
        (projects.get) when region is None."""
        with self._lock:
            table = self.project_quotas if region is None else self._region_quotas(region)
            table[metric] = [float(limit), float(usage)]

    def _region_quotas(self, region: str) -> dict[str, list[float]]:
        return self.region_quotas.setdefault(region, {m: [v, 0.0]
                                                      for m, v in REGION_QUOTAS.items()})

    @property
    def subnets(self) -> dict[tuple[str, str], Subnetwork]:
        return self.network.subnets

    @property
    def routers(self) -> dict[tuple[str, str], Any]:
        return self.network.routers

    def subnet(self, region: str, name: str = "default") -> Subnetwork:
        """[subnet] the subnet (made on first use, with Private Google Access on)."""
        return self.network.subnet(region, name)

    def add_nat(self, region: str, router: str = "nat-router", nat: str = "nat",
                subnetworks: list[str] | None = None) -> None:
        """[router] a Cloud Router with a NAT on the default network: for every subnet of the
        region, or (`subnetworks`) the named ones."""
        self.network.add_nat(region, router, nat, subnetworks)

    def stock_out(self, zone: str, *models: str) -> None:
        """Starts (and inserts of GPU instances) in `zone` with these provisioning models
        ("SPOT", "STANDARD") fail."""
        with self._lock:
            for m in models or ("SPOT",):
                self.stockouts.add((zone, m))

    def restock(self, zone: str) -> None:
        with self._lock:
            self.stockouts = {s for s in self.stockouts if s[0] != zone}

    def fail_start(self, zone: str, model: str, kind: str) -> None:
        """Every start in `zone` with `model` ("SPOT" | "STANDARD") fails as `kind` (one of
        START_FAILURES) until clear_failures(zone)."""
        if kind not in START_FAILURES:
            raise ValueError(f"kind {kind!r}: one of {START_FAILURES}")
        with self._lock:
            self.start_failures[(zone, model)] = kind

    def clear_failures(self, zone: str) -> None:
        with self._lock:
            self.start_failures = {k: v for k, v in self.start_failures.items() if k[0] != zone}
            self.stockouts = {s for s in self.stockouts if s[0] != zone}

    def fail_next(self, verb: str, status: int = 503, reason: str = "backendError",
                  times: int = 1, kind: str | None = None) -> None:
        """The next `times` calls of `verb` ('get', 'wait', 'start', 'stop', 'list',
        'setMetadata', ...; `kind` "instances"/"operations" to tell an instance get from an
        operation get) answer HTTP `status` with `reason`; status 0 resets the connection."""
        with self._lock:
            self.faults.append(_Fault(verb, status, reason, times, kind))

    def grant(self, principal: str, role: str, resource: str | None = None) -> None:
        """Grant `role` to `principal` (a service account email) on `resource`: "projects/P"
        (default), an instance "projects/P/zones/Z/instances/I" or a service account
        "projects/P/serviceAccounts/EMAIL". Checked only when `enforce_iam` is True."""
        if role not in ROLES and role not in ("roles/owner", "roles/editor"):
            raise ValueError(f"role {role!r} is not modelled: {sorted(ROLES)}")
        with self._lock:
            self.grants.add((principal, role, resource or f"projects/{self.project}"))

    def preempt(self, zone: str, name: str) -> None:
        """Spot preemption: the instance goes TERMINATED now and GCE records the operation."""
        with self._lock:
            self._tick()
            self._preempt(self.instances[(zone, name)])

    def put_guest_attribute(self, zone: str, name: str, path: str, value: str) -> None:
        """The guest writes `path` ("namespace/key") as it would through the metadata server;
        GuestAttributesDisabled unless metadata enable-guest-attributes=TRUE [guest]."""
        with self._lock:
            inst = self.instances[(zone, name)]
            if not inst.guest_attributes_enabled():
                raise GuestAttributesDisabled(
                    f"{inst.resource()}: Guest attributes endpoint access is disabled.")
            ns, _, key = path.strip("/").partition("/")
            if not ns or not key or "/" in key:
                raise ValueError(f"guest attribute path {path!r}: want namespace/key")
            inst.guest_attributes[f"{ns}/{key}"] = value

    def delete_guest_attribute(self, zone: str, name: str, path: str) -> None:
        with self._lock:
            self.instances[(zone, name)].guest_attributes.pop(path.strip("/"), None)

    def instance(self, zone: str, name: str) -> FakeInstance:
        with self._lock:
            self._tick()
            return self.instances[(zone, name)]

    def running_seconds(self, zone: str, name: str) -> float:
        with self._lock:
            self._tick()
            inst = self.instances[(zone, name)]
            extra = time.time() - inst.running_since if inst.running_since is not None else 0.0
            return inst.running_total + extra

    def seen(self, verb: str, zone: str | None = None, name: str | None = None) -> list[dict]:
        """Recorded calls of one kind: 'get', 'start', 'stop', 'setScheduling', ..."""
        return [c for c in self.calls if c["verb"] == verb
                and (zone is None or c.get("zone") == zone)
                and (name is None or c.get("instance") == name)]

    # ---- simulation ----------------------------------------------------------------------
    def _run_clock(self) -> None:
        """Time passes without callers too: a max run duration stops a node nobody polls."""
        while not self._closed.wait(0.05):
            with self._lock:
                self._tick()

    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self._events.append((when, next(self._seq), fn))
        self._events.sort(key=lambda e: (e[0], e[1]))

    def _tick(self) -> None:
        now = time.time()
        while self._events and self._events[0][0] <= now:
            _, _, fn = self._events.pop(0)
            fn()

    def _new_op(self, inst: FakeInstance, op_type: str, running_at: float,
                done_at: float, user: str = "system") -> FakeOperation:
        n = next(self._seq)
        name = f"operation-{int(time.time() * 1000)}-{n:06d}"
        op = FakeOperation(self.project, inst.zone, name, 7_000_000 + n, op_type, inst,
                           time.time(), running_at, done_at, user=user)
        self.operations[(inst.zone, name)] = op
        return op

    def _enter_running(self, inst: FakeInstance) -> None:
        now = time.time()
        inst.status = "RUNNING"
        inst.last_start = now
        inst.running_since = now
        if inst.max_run_seconds is not None and inst.termination_action in ("STOP", "DELETE"):
            # [limit]: the termination timestamp is set on every entry into RUNNING (a stopped
            # and restarted VM gets the whole duration again) and cleared when it stops
            inst.termination_at = now + inst.max_run_seconds * self.run_duration_scale
            gen = inst.generation

            def expire() -> None:
                if inst.generation == gen and inst.status == "RUNNING":
                    inst.max_run_stops += 1
                    if inst.termination_action == "DELETE":  # [limit]: the VM is deleted
                        self.network.delete_now(inst)
                    else:
                        self._stop(inst, user="system")

            self._at(inst.termination_at, expire)
        if self.on_start is not None and inst.metadata.get(AGENT_KEY, "running") != "stopped":
            self._launch_agent(inst)
        if self.node_worker is not None:
            inst.worker = self._spawn(self.node_worker(inst))
        if self.node_runtime is not None:
            self.node_runtime.boot(inst)

    def _leave_running(self, inst: FakeInstance, status: str) -> None:
        now = time.time()
        was_running = inst.running_since is not None
        if inst.running_since is not None:
            inst.running_total += now - inst.running_since
            inst.running_since = None
        if status == "TERMINATED":
            inst.last_stop = now
        inst.termination_at = None
        inst.status = status
        self._kill_agent(inst)
        worker, inst.worker = inst.worker, None
        self._end(worker)
        if was_running and self.node_runtime is not None:
            self.node_runtime.power_off(inst)

    def _preempt(self, inst: FakeInstance) -> None:
        now = time.time()
        op = self._new_op(inst, "compute.instances.preempted", now, now)
        op.running_at = op.done_at = now
        inst.generation += 1
        self._leave_running(inst, "TERMINATED")

    def _launch_agent(self, inst: FakeInstance) -> None:
        if inst.agent is not None and inst.agent.poll() is None or self.on_start is None:
            return
        inst.agent = self._spawn(self.on_start(inst))

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.agent_log, "ab") if self.agent_log else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]

    def _kill_agent(self, inst: FakeInstance) -> None:
        proc, inst.agent = inst.agent, None
        self._end(proc)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None) -> None:
        """Stop a node process and everything it started, as a powered-off VM ends all of its
        processes (a worker's flow-run processes run in sessions of their own)."""
        import psutil

        if proc is None or proc.poll() is not None:
            return
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        os.kill(proc.pid, signal.SIGTERM)  # our own child, by PID
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        for child in family:  # what it started, found before it went
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass

    def worker_running(self, zone: str, name: str) -> bool:
        with self._lock:
            w = self.instances[(zone, name)].worker
            return w is not None and w.poll() is None

    def agent_running(self, zone: str, name: str) -> bool:
        with self._lock:
            agent = self.instances[(zone, name)].agent
            return agent is not None and agent.poll() is None

    def _start_error(self, inst: FakeInstance, kind: str) -> dict[str, Any]:
        """The error of a start operation that ends DONE with an error, as Compute words it."""
        region = inst.zone.rsplit("-", 1)[0]
        where = f"projects/{self.project}/zones/{inst.zone}"
        if kind == "stockout":
            return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                                "message": f"The zone '{where}' does not have enough resources "
                                           "available to fulfill the request.  Try a different "
                                           "zone, or try again later."}]}
        if kind == "stockout-details":
            return {"errors": [{
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                "message": f"The zone '{where}' does not have enough resources available to "
                           "fulfill the request. '(resource type:compute)'.",
                "errorDetails": [{"errorInfo": {
                    "reason": "resource_availability", "domain": "compute.googleapis.com",
                    "metadatas": {"zone": inst.zone, "vmType": "g2-standard-4"}}}]}]}
        if kind in ("quota", "quota-regional"):
            # "quota": the spot L4 quota; "quota-regional": the regional L4 quota (on-demand)
            metric = ("PREEMPTIBLE_NVIDIA_L4_GPUS" if kind == "quota"
                      and inst.provisioning_model == "SPOT" else "NVIDIA_L4_GPUS")
            return {"errors": [{
                "code": "QUOTA_EXCEEDED",
                "message": f"Quota '{metric}' exceeded.  Limit: 0.0 in region {region}.",
                "errorDetails": [{"quotaInfo": {
                    "metricName": f"compute.googleapis.com/{metric.lower()}",
                    "limitName": f"{metric.replace('_', '-')}-per-project-region",
                    "dimensions": {"region": region}, "limit": 0}}]}]}
        # UNSUPPORTED_OPERATION: e.g. the machine type/GPU model pair not offered in the zone
        # (the wording is an example; the code is what a caller can rely on)
        return {"errors": [{"code": "UNSUPPORTED_OPERATION",
                            "message": f"The resource 'projects/{self.project}/zones/{inst.zone}"
                                       "/acceleratorTypes/nvidia-l4' is not supported with "
                                       f"provisioning model {inst.provisioning_model} in this "
                                       "zone."}]}

    def _start(self, inst: FakeInstance, user: str) -> tuple[int, dict[str, Any]]:
        now = time.time()
        pending = now + self.op_pending_seconds
        if inst.status != "TERMINATED":  # GCE: a start of a running instance is a no-op op
            return 200, self._op_json(self._new_op(inst, "start", pending, pending, user))
        kind = self.start_failures.get((inst.zone, inst.provisioning_model))
        if kind is None and (inst.zone, inst.provisioning_model) in self.stockouts:
            kind = "stockout"
        if kind in ("503", "500"):
            return _error(int(kind), "Internal error. Please try again or contact Google "
                          "Support. (Code: '-3411977538418203485')", "backendError")
        if kind == "429":
            return _error(429, "Quota exceeded for quota metric 'Queries' and limit 'Queries "
                          "per minute' of service 'compute.googleapis.com'.",
                          "rateLimitExceeded", "usageLimits", status="RESOURCE_EXHAUSTED")
        if kind == "rate-limit":
            return _error(403, "Rate Limit Exceeded", "rateLimitExceeded", "usageLimits")
        if kind == "quota-http":
            return _error(403, f"Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region "
                          f"{inst.zone.rsplit('-', 1)[0]}.", "quotaExceeded", "usageLimits")
        if kind is not None and kind != "preempted":
            op = self._new_op(inst, "start", pending, pending, user)
            op.error = self._start_error(inst, kind)
            op.http_status = ((403, "FORBIDDEN") if kind.startswith("quota") else
                              (400, "BAD REQUEST") if kind == "unsupported" else
                              (503, "SERVICE UNAVAILABLE"))
            return 200, self._op_json(op)
        op = self._new_op(inst, "start", pending, pending + inst.boot_seconds, user)
        inst.generation += 1
        gen = inst.generation

        def staging() -> None:
            if inst.generation == gen:
                inst.status = "STAGING"

        def running() -> None:
            if inst.generation == gen:
                self._enter_running(inst)

        def preempted() -> None:  # preemption during boot: the start op itself succeeded
            if inst.generation == gen:
                self._preempt(inst)

        self._at(pending, staging)
        if kind == "preempted":
            self._at(pending + inst.boot_seconds / 2, preempted)
        else:
            self._at(pending + inst.boot_seconds, running)
        return 200, self._op_json(op)

    def _stop(self, inst: FakeInstance, user: str = "system") -> FakeOperation:
        now = time.time()
        pending = now + self.op_pending_seconds
        if inst.status == "TERMINATED":
            return self._new_op(inst, "stop", pending, pending, user)
        op = self._new_op(inst, "stop", pending, pending + self.stop_seconds, user)
        inst.generation += 1
        gen = inst.generation
        self._leave_running(inst, "STOPPING")

        def terminated() -> None:
            if inst.generation == gen:
                self._leave_running(inst, "TERMINATED")

        self._at(pending + self.stop_seconds, terminated)
        return op

    # ---- JSON shapes ---------------------------------------------------------------------
    def _instance_json(self, inst: FakeInstance) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": "compute#instance", "id": str(inst.id), "name": inst.name,
            "zone": f"{self.url}/compute/v1/projects/{self.project}/zones/{inst.zone}",
            "machineType": f"{self.url}/compute/v1/projects/{self.project}/zones/{inst.zone}"
                           f"/machineTypes/{inst.machine_type}",
            "status": inst.status, "selfLink": inst.link(self.url),
            "scheduling": inst.scheduling(),
            # instances.get gives the accelerator type as its full URL
            "guestAccelerators": [
                {"acceleratorType": f"{self.url}/compute/v1/projects/{self.project}/zones/"
                                    f"{inst.zone}/acceleratorTypes/{kind}",
                 "acceleratorCount": count} for kind, count in inst.accelerators],
            "networkInterfaces": [self._nic_json(inst)],
            # an inserted instance's boot disk ([ref] instances: disks[].source); add_instance's
            # instances predate the disk model and list none
            "disks": [{"boot": d.get("boot", True), "autoDelete": d["autoDelete"],
                       "deviceName": d.get("deviceName", d["name"]),
                       "source": f"{self.url}/compute/v1/projects/{self.project}/zones/"
                                 f"{inst.zone}/disks/{d['name']}"}
                      for (z, _), d in self.network.disks.items()
                      if z == inst.zone and d["user"] == inst.name],
            "metadata": {"kind": "compute#metadata", "fingerprint": inst.metadata_fingerprint,
                         "items": [{"key": k, "value": v} for k, v in inst.metadata.items()]},
        }
        if inst.tags:
            d["tags"] = {"items": inst.tags, "fingerprint": f"tags-{len(inst.tags)}"}
        if inst.service_account:
            d["serviceAccounts"] = [{"email": inst.service_account,
                                     "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
        if inst.last_start:
            d["lastStartTimestamp"] = _rfc3339(inst.last_start)
        if inst.last_stop:
            d["lastStopTimestamp"] = _rfc3339(inst.last_stop)
        return d

    def _nic_json(self, inst: FakeInstance) -> dict[str, Any]:
        """[subnet] nic0 on its subnet's URL; accessConfigs only with an external IP."""
        base = f"{self.url}/compute/v1/projects/{self.project}"
        nic: dict[str, Any] = {
            "kind": "compute#networkInterface", "name": "nic0", "networkIP": inst.network_ip,
            "network": self.network.nic_network(inst.region, inst.subnetwork),
            "subnetwork": f"{base}/regions/{inst.region}/subnetworks/{inst.subnetwork}"}
        if inst.external_ip:
            nic["accessConfigs"] = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                                     "name": "External NAT", "natIP": inst.external_ip,
                                     "networkTier": "PREMIUM"}]
        return nic

    def _op_json(self, op: FakeOperation) -> dict[str, Any]:
        now = time.time()
        status = "DONE" if now >= op.done_at else "RUNNING" if now >= op.running_at else "PENDING"
        zone_url = f"{self.url}/compute/v1/projects/{self.project}/zones/{op.zone}"
        d: dict[str, Any] = {
            "kind": "compute#operation", "id": str(op.id), "name": op.name,
            "zone": zone_url, "operationType": op.op_type,
            "targetLink": op.target.link(self.url), "targetId": str(op.target.id),
            "status": status, "user": op.user,
            "progress": 100 if status == "DONE" else 0,
            "insertTime": _rfc3339(op.created), "selfLink": f"{zone_url}/operations/{op.name}",
        }
        if status != "PENDING":
            d["startTime"] = _rfc3339(op.running_at)
        if status == "DONE":
            d["endTime"] = _rfc3339(op.done_at)
            if op.error:
                d["error"] = op.error
                d["httpErrorStatusCode"], d["httpErrorMessage"] = op.http_status
        return d

    def _not_found(self, what: str) -> tuple[int, dict[str, Any]]:
        return _error(404, f"The resource '{what}' was not found", "notFound")

    # ---- IAM -----------------------------------------------------------------------------
    def _token(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """OAuth2 token endpoint: the service account's JWT-bearer grant, unverified."""
        if self.gcp is not None:
            return 200, self.gcp.oauth_token(str(body.get("assertion", "")))
        principal = _jwt_claims(str(body.get("assertion", ""))).get("iss") or "anonymous"
        token = f"{TOKEN}.{hashlib.sha256(principal.encode()).hexdigest()[:8]}"
        self.tokens[token] = principal
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    def principal(self, auth: str | None) -> str | None:
        """Who a call's Authorization header says it is: a token from /token, or a self-signed
        JWT (google-auth sends those for service accounts with some endpoints)."""
        if self.gcp is not None:  # members as IAM names them ("serviceAccount:EMAIL")
            return self.gcp.member(auth)
        if not auth or not auth.startswith("Bearer "):
            return None
        token = auth.split(" ", 1)[1]
        if token in self.tokens:
            return self.tokens[token]
        claims = _jwt_claims(token)
        return claims.get("sub") or claims.get("iss")

    def allowed(self, principal: str | None, permission: str, resource: str) -> bool:
        if self.gcp is not None:
            return self.gcp.allowed(principal, permission, resource)
        if not self.enforce_iam:
            return True
        if principal is None:
            return False
        for who, role, scope in self.grants:
            if who != principal or not (resource == scope or resource.startswith(scope + "/")):
                continue
            if role in ("roles/owner", "roles/editor") or permission in ROLES.get(role, ()):
                return True
        return False

    def _denied(self, permission: str, resource: str) -> tuple[int, dict[str, Any]]:
        # Compute's 403 for a missing permission [errors]
        return _error(403, f"Required '{permission}' permission for '{resource}'", "forbidden")

    # ---- routing -------------------------------------------------------------------------
    def _take_fault(self, verb: str, kind: str) -> _Fault | None:
        for f in self.faults:
            if f.verb == verb and f.kind in (None, kind) and f.times > 0:
                f.times -= 1
                if f.times == 0:
                    self.faults.remove(f)
                return f
        return None

    def handle(self, method: str, raw_path: str, body: dict[str, Any],
               auth: str | None) -> tuple[int, dict[str, Any]]:
        """The networking state first (its resources, and the gate with a FakeProject)."""
        reply = self.network.handle(method, raw_path, body, auth)
        if reply is None:
            reply = self._handle(method, raw_path, body, auth)
            self.network.after(method, raw_path, auth, reply[0])
        return reply

    def _handle(self, method: str, raw_path: str, body: dict[str, Any],
                auth: str | None) -> tuple[int, dict[str, Any]]:
        url = urlparse(raw_path)
        path = url.path
        if path == "/token":
            with self._lock:
                return self._token(body)
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)(?:/regions/([^/]+))?", path)
        if m and method == "GET":
            with self._lock:
                return self._regional(*m.groups(), auth)
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)"
                         r"(?:/([^/]+))?(?:/([A-Za-z]+))?", path)
        if not m:
            return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}
        project, zone, kind, name, verb = m.groups()
        query = parse_qs(url.query)
        with self._lock:
            self._tick()
            call_verb = verb or ("get" if name else "list")
            principal = self.principal(auth)
            self.calls.append({"method": method, "verb": call_verb, "kind": kind, "zone": zone,
                               "instance" if kind == "instances" else "operation": name,
                               "auth": auth, "principal": principal, "body": body,
                               "at": time.time()})
            fault = self._take_fault(call_verb, kind)
            if fault is not None:
                if fault.status == 0:
                    raise _Reset
                return self._fault_json(fault)
            if project != self.project:
                return _error(403, f"Project {project} not found or permission denied",
                              "forbidden")
            if kind == "operations":
                permission = "compute.zoneOperations." + ("list" if name is None else "get")
                if not self.allowed(principal, permission, f"projects/{project}"):
                    return self._denied(permission, f"projects/{project}/zones/{zone}")
                return self._operations(zone, name, verb, query)
            inst = self.instances.get((zone, name or ""))
            if inst is None:
                return self._not_found(f"projects/{project}/zones/{zone}/instances/{name}")
            permission = VERB_PERMISSION.get(call_verb)
            if permission and not self.allowed(principal, permission, inst.resource()):
                return self._denied(permission, inst.resource())
            user = principal or "anonymous"
            if method == "GET" and verb is None:
                return 200, self._instance_json(inst)
            if verb == "start":
                return self._start(inst, user)
            if verb == "stop":
                return 200, self._op_json(self._stop(inst, user))
            if verb == "setScheduling":
                return self._set_scheduling(inst, body, user)
            if verb == "setMetadata":
                return self._set_metadata(inst, body, principal, user)
            if verb == "getGuestAttributes":
                return self._guest_attributes(inst, query)
            if verb in ("getIamPolicy", "setIamPolicy") and self.gcp is not None:
                return self._iam_policy(inst, verb, query, body)
            if verb == "testIamPermissions":
                wanted = body.get("permissions") or []
                granted = [p for p in wanted if self.allowed(principal, p, inst.resource())]
                return 200, ({"permissions": granted} if granted else {})
        return 400, {"error": {"code": 400, "message": f"unsupported {method} {path}"}}

    def _iam_policy(self, inst: FakeInstance, verb: str, query: dict[str, list[str]],
                    body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """[iampolicy] instances.getIamPolicy (?optionsRequestedPolicyVersion=N) and
        setIamPolicy (body ZoneSetPolicyRequest {policy}), with the rules every setIamPolicy
        keeps (tests/fakes/gcp_iam.py): a stale etag is 409, an unknown member 400."""
        from tests.fakes.gcp_iam import bindings_of, policy_problem, store_policy

        assert self.gcp is not None
        current = self.gcp.policy(inst.resource())
        if verb == "getIamPolicy":
            return 200, current.to_json(int((query.get("optionsRequestedPolicyVersion")
                                             or ["1"])[0]))
        policy = body.get("policy") or {}
        plain = [b for b in policy.get("bindings") or () if not b.get("condition")]
        bindings = bindings_of({"bindings": plain})
        problem = policy_problem(bindings, current, policy.get("etag"),
                                 role_ok=lambda r: r.startswith("roles/compute."),
                                 account_ok=lambda e: True)
        if problem:
            return problem[0], problem[1]
        stored = store_policy(self.gcp, inst.resource(), bindings)
        return 200, stored.to_json(3)

    def _regional(self, project: str, region: str | None,
                  auth: str | None) -> tuple[int, dict[str, Any]]:
        """projects.get, regions.get [quota] (subnetworks and routers: compute_network.py)."""
        what = "regions" if region else "projects"
        self.calls.append({"method": "GET", "verb": "get", "kind": what, "region": region,
                           "name": None, "auth": auth, "principal": self.principal(auth),
                           "body": {}, "at": time.time()})
        if project != self.project:
            return _error(403, f"Project {project} not found or permission denied", "forbidden")
        base = f"{self.url}/compute/v1/projects/{project}"
        if region is None:
            return 200, {"kind": "compute#project", "name": project, "id": "4242",
                         "quotas": self._quota_json(self.project_quotas),
                         "selfLink": base}
        return 200, {"kind": "compute#region", "name": region, "status": "UP",
                     "quotas": self._quota_json(self._region_quotas(region)),
                     "selfLink": f"{base}/regions/{region}"}

    @staticmethod
    def _quota_json(table: dict[str, list[float]]) -> list[dict[str, Any]]:
        return [{"metric": m, "limit": lim, "usage": use} for m, (lim, use) in table.items()]

    @staticmethod
    def _fault_json(fault: _Fault) -> tuple[int, dict[str, Any]]:
        if fault.status == 429:
            return _error(429, "Quota exceeded for quota metric 'Read requests' and limit "
                          "'Read requests per minute' of service 'compute.googleapis.com'.",
                          fault.reason, "usageLimits", status="RESOURCE_EXHAUSTED")
        if fault.status == 403:
            return _error(403, "Rate Limit Exceeded", fault.reason, "usageLimits")
        if fault.status >= 500:
            return _error(fault.status, "Internal error. Please try again or contact Google "
                          "Support. (Code: '-3411977538418203485')", fault.reason)
        return _error(fault.status, f"injected {fault.status}", fault.reason)

    def _operations(self, zone: str, name: str | None, verb: str | None,
                    query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        if name is None:  # list, with the one filter shape GceNode sends
            wanted = re.findall(r'operationType\s*=\s*"([^"]+)"', query.get("filter", [""])[0])
            items = [self._op_json(o) for (z, _), o in self.operations.items()
                     if z == zone and (not wanted or o.op_type in wanted)]
            return 200, {"kind": "compute#operationList", "items": items}
        op = self.operations.get((zone, name))
        if op is None:
            return self._not_found(f"projects/{self.project}/zones/{zone}/operations/{name}")
        if verb == "wait":
            deadline = time.time() + self.wait_cap_seconds
            while time.time() < min(deadline, op.done_at):
                self._lock.release()
                try:
                    time.sleep(0.02)
                finally:
                    self._lock.acquire()
                self._tick()
        return 200, self._op_json(op)

    def _set_scheduling(self, inst: FakeInstance, body: dict[str, Any],
                        user: str) -> tuple[int, dict]:
        """[gcloud] fields absent from the body keep their value; an explicit null clears one
        (to Compute's default). The merged result is then validated [errors] [limit]."""
        fields = {"provisioningModel": ("provisioning_model", "STANDARD"),
                  "preemptible": ("preemptible", False),
                  "automaticRestart": ("automatic_restart", True),
                  "onHostMaintenance": ("on_host_maintenance", "MIGRATE"),
                  "instanceTerminationAction": ("termination_action", None),
                  "maxRunDuration": ("max_run_seconds", None)}
        new = {attr: getattr(inst, attr) for attr, _ in fields.values()}
        for key, (attr, default) in fields.items():
            if key not in body:
                continue
            value = body[key]
            if value is None:
                new[attr] = default
            elif key == "maxRunDuration":
                new[attr] = int(value.get("seconds", 0))
            else:
                new[attr] = value
        changes_model = any(new[a] != getattr(inst, a) for a in
                            ("provisioning_model", "termination_action", "max_run_seconds"))
        if inst.status != "TERMINATED" and changes_model:
            return _error(400, "Changing the provisioning model, termination action or run "
                          "duration requires the instance to be stopped.", "badRequest")
        field_ = "Invalid value for field 'resource.{}': '{}'. "
        if new["preemptible"] and new["provisioning_model"] != "SPOT":
            return _error(400, field_.format("provisioningModel", new["provisioning_model"])
                          + "For preemptible, only allowed provisioning_model value is SPOT.",
                          "invalid")
        if new["provisioning_model"] == "SPOT" and new["automatic_restart"]:
            return _error(400, field_.format("automaticRestart", "true") + "Preemptible and "
                          "Spot instances cannot be automatically restarted.", "invalid")
        if new["on_host_maintenance"] == "MIGRATE":  # every fake instance has an L4
            return _error(400, "Instances with guest accelerators do not support live "
                          "migration.", "badRequest")
        if new["max_run_seconds"] is not None and not (
                MIN_RUN_SECONDS <= new["max_run_seconds"] <= MAX_RUN_SECONDS):
            return _error(400, field_.format("scheduling.maxRunDuration.seconds",
                                             new["max_run_seconds"])
                          + f"Must be between {MIN_RUN_SECONDS} and {MAX_RUN_SECONDS}.",
                          "invalid")
        if new["max_run_seconds"] is not None and new["termination_action"] is None:
            # wording not from a report: the rule is [limit]'s (a time limit needs an action)
            return _error(400, field_.format("scheduling.instanceTerminationAction", "")
                          + "An instance termination action is required with "
                          "maxRunDuration.", "invalid")
        if new["termination_action"] not in (None, "STOP"):
            return _error(400, f"instanceTerminationAction {new['termination_action']} is not "
                          "modelled by the fake (only STOP)", "invalid")
        if (new["termination_action"] and new["provisioning_model"] == "STANDARD"
                and new["max_run_seconds"] is None):
            return _error(400, field_.format("scheduling.instanceTerminationAction",
                                             new["termination_action"])
                          + "You cannot specify a termination action for a VM instance that "
                          "has the standard provisioning model (default). To use instance "
                          "termination action, the VM instance must use the Spot or "
                          "Reservation-Bound provisioning model.", "invalid")
        for attr, value in new.items():
            setattr(inst, attr, value)
        now = time.time()
        op = self._new_op(inst, "setScheduling", now, now + self.op_pending_seconds, user)
        return 200, self._op_json(op)

    def _set_metadata(self, inst: FakeInstance, body: dict[str, Any], principal: str | None,
                      user: str) -> tuple[int, dict]:
        # [ref] instances.setMetadata: iam.serviceAccounts.actAs too "if the instance runs as
        # a service account"; the 403 is the shape of googleapis/google-api-dotnet-client#2095
        if inst.service_account:
            sa = f"projects/{self.project}/serviceAccounts/{inst.service_account}"
            if not self.allowed(principal, "iam.serviceAccounts.actAs", sa):
                return self._denied("iam.serviceAccounts.actAs", sa)
        if body.get("fingerprint") != inst.metadata_fingerprint:
            return _error(412, "Supplied fingerprint does not match current metadata "
                          "fingerprint.", "conditionNotMet")
        inst.metadata = {i["key"]: i.get("value", "") for i in body.get("items", [])}
        inst.metadata_fingerprint = "fp-" + hashlib.sha256(
            json.dumps(inst.metadata, sort_keys=True).encode()).hexdigest()[:12]
        if inst.status == "RUNNING":  # the node's watcher acts on the key
            if inst.metadata.get(AGENT_KEY) == "stopped":
                self._kill_agent(inst)
            elif self.on_start is not None:
                self._launch_agent(inst)
            if self.node_runtime is not None:
                self.node_runtime.metadata_changed(inst)
        now = time.time()
        op = self._new_op(inst, "setMetadata", now, now + self.op_pending_seconds, user)
        return 200, self._op_json(op)

    def _guest_attributes(self, inst: FakeInstance,
                          query: dict[str, list[str]]) -> tuple[int, dict]:
        """[guest]: ?variableKey=ns/key → that value; ?queryPath=ns/ (or ns/key) → the items
        under it; nothing there (always so while guest attributes are off) → 404."""
        base = {"kind": "compute#guestAttributes",
                "selfLink": f"{inst.link(self.url)}/guestAttributes"}
        key = (query.get("variableKey") or [""])[0].strip("/")
        if key:
            if key not in inst.guest_attributes:
                return self._not_found(f"{inst.resource()}/guestAttributes/{key}")
            return 200, {**base, "variableKey": key, "variableValue": inst.guest_attributes[key]}
        qpath = (query.get("queryPath") or [""])[0]
        prefix = qpath.strip("/")
        items = []
        for path, value in sorted(inst.guest_attributes.items()):
            ns, _, k = path.partition("/")
            if not prefix or path == prefix or ns == prefix:
                items.append({"namespace": ns, "key": k, "value": value})
        if not items:
            return self._not_found(f"{inst.resource()}/guestAttributes/{qpath}")
        return 200, {**base, "queryPath": qpath, "queryValue": {"items": items}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self, method: str) -> None:
                raw = self.read_body()
                body: dict[str, Any] = {}
                ctype = self.headers.get("Content-Type") or "json"
                if raw and "x-www-form-urlencoded" in ctype:  # the /token grant
                    body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                elif raw and "json" in ctype:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {}
                try:
                    status, payload = fake.handle(method, self.path, body,
                                                  self.headers.get("Authorization"))
                except _Reset:
                    self.close_connection = True
                    self.connection.shutdown(2)  # socket.SHUT_RDWR: the client sees a reset
                    return
                self.send_body(status, json.dumps(payload).encode(),
                               "application/json; charset=UTF-8")

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_PATCH(self) -> None:  # noqa: N802
                self._serve("PATCH")

            def do_PUT(self) -> None:  # noqa: N802
                self._serve("PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

        return Handler
