"""Compute Engine's networking, images and instance creation for FakeComputeEngine
(tests/fakes/compute_engine.py), which asks `NetworkState.handle` first: the VPC resources
`gcp setup` makes, driven through the real google-cloud-compute 1.57 REST client.

Served (paths from compute_v1/services/*/transports/rest_base.py; P the project):
    networks        GET/POST global/networks, GET/DELETE global/networks/N
    subnetworks     GET/POST regions/R/subnetworks, GET/DELETE …/S,
                    POST …/S/setPrivateIpGoogleAccess
    routers         GET/POST regions/R/routers, GET/PATCH/DELETE …/N
    firewalls       GET/POST global/firewalls, GET/PATCH/PUT/DELETE …/F
    addresses       GET/POST regions/R/addresses, GET/DELETE …/A
    images          GET global/images, GET …/I, GET …/family/F (any project: public images)
    instances       POST zones/Z/instances, DELETE zones/Z/instances/I (compute_network_vm.py)
    operations      GET/POST(wait) global/operations/O, regions/R/operations/O
Every other compute path (the old instance verbs, quotas) is FakeComputeEngine's own; with a
`FakeProject` it passes this gate too.

Modelled:
  gate       with `gcp` (the shared FakeProject): no credentials → 401; compute.googleapis.com
             not in gcp.enabled → 403 SERVICE_DISABLED (gcp.service_disabled plus Compute's
             errors[] reason accessNotConfigured) for every compute call, old verbs included;
             IAM through gcp.allowed (members "serviceAccount:EMAIL"); a missing permission is
             Compute's 403 "Required 'PERM' permission for 'RESOURCE'" reason forbidden
             [errors]. IAM looks global resources up without their `global/` segment
             ("projects/P/networks/N": FakeProject.ancestry walks (collection, id) pairs;
             rules.iam_name); the texts keep the real name. Every call is recorded
             (gcp.record, api "compute"; mutating unless GET, wait or testIamPermissions) and
             in the engine's `calls`. Without gcp the engine's own grant()/enforce_iam
             decides, as before.
  operations inserts, deletes, patches and updates answer a global or region operation
             PENDING → RUNNING → DONE (the engine's op_pending_seconds each); the change is
             visible only when it is DONE (harder on a caller that does not wait): a get
             before that is 404, a second create of the name 409, another change of the
             resource 400 resourceNotReady. wait returns when DONE or after the engine's
             wait_cap_seconds [ref-ops].
  deferred   deleting a network or subnet something still uses is accepted and its operation
             ends DONE with RESOURCE_IN_USE_BY_ANOTHER_RESOURCE "The network resource '…' is
             already being used by '…'" (httpErrorStatusCode 400): reported as "Error waiting
             for Deleting Network" [in-use].
  networks   name RFC1035 (400 "Must be a match of regex"); autoCreateSubnetworks must be set:
             the reference says an unset one makes a legacy network, which new projects cannot
             make, so the fake refuses it (400); 409 alreadyExists; `default` (auto mode) exists
             with its four firewall rules [fw-default], as in a new project.
  subnets    network must exist (404); ipCidrRange a CIDR with clear host bits, /8…/29, not a
             prohibited range, no overlap with another subnet of the network ("Invalid
             IPCidrRange: X conflicts with existing subnetwork 'S' in region 'R'."), not in
             10.128.0.0/9 on an auto-mode network [subnets]. The default network's subnet of a
             region exists once a test touches it (add_instance, subnet()): the fake has no
             region list; Private Google Access on there, as the engine always had it.
  routers    network must exist; nats[] validated (natIpAllocateOption, the three
             sourceSubnetworkIpRangesToNat values, LIST_OF_SUBNETWORKS with subnets of the
             router's region and network); bgp.asn private; PATCH is a JSON merge patch
             (arrays such as nats replaced whole, absent fields kept) [patch] [nat].
  firewalls  [fw] direction INGRESS|EGRESS (default INGRESS), priority 0…65535 (default
             1000), exactly one of allowed/denied, protocols and port ranges, CIDRs, service
             accounts as e-mail addresses, sourceServiceAccounts not with sourceTags or
             targetTags, targetServiceAccounts not with targetTags or sourceTags, an INGRESS
             rule needs a source; the network must exist (absent: global/networks/default);
             create/update/patch/delete also need compute.networks.updatePolicy on the network.
             update (PUT) replaces the rule, patch merges. Rules do not filter the loopback
             traffic of the fake's nodes.
  addresses  INTERNAL (compute.addresses.createInternal) in a subnet, given address inside
             its range and free, else the first free host; EXTERNAL (compute.addresses.create)
             from 203.0.113.0/24. status IN_USE with users[] while an instance has the IP.
  images     add_image(); getFromFamily is the newest (creationTimestamp) image of the family
             with no deprecated.state; images of another project are public (no IAM check);
             OBSOLETE/DELETED images are refused by instances.insert [images].
See compute_network_vm.py for instances.insert/delete.

Sources (read 2026-12; a text marked "constructed" in compute_network_rules.py is worded from
the reference where no report of the wire text was found):
  [ref-*]   Compute Engine API v1 reference: networks, subnetworks (+ setPrivateIpGoogleAccess),
            routers, firewalls, addresses, images (+ getFromFamily), globalOperations,
            regionOperations, instances.insert/delete (cloud.google.com/compute/docs/reference/
            rest/v1/…), google-cloud-compute 1.57 compute_v1/types/compute.py (field names).
  [ref-ops] globalOperations.wait: "returns when the operation is DONE or when the request
            reaches the 2 minute deadline".
  [errors]  "Required 'compute.networks.create' permission for 'projects/P'" reason forbidden
            (StreisandEffect/streisand#831); "The resource '…' already exists" / "… was not
            found"; "Invalid value for field 'resource.ipCidrRange': '…'. Invalid IPCidrRange:
            … conflicts with existing subnetwork '…' in region '…'., invalid"
            (terraform-google-modules/terraform-google-network#20); "Extended subnetworks in
            auto subnet mode networks cannot overlap with 10.128.0.0/9."
            (cloudfoundry/bosh-google-cpi-release#262); "Service accounts must be valid RFC
            822 email addresses." (hashicorp/terraform#24713).
  [in-use]  "Error waiting for Deleting Network: The network resource 'projects/…/networks/…'
            is already being used by 'projects/…/firewalls/…'"
            (GoogleCloudPlatform/terraform-google-three-tier-web-app#167, murphye/
            cheap-gke-cluster#8).
  [subnets] cloud.google.com/vpc/docs/subnets (valid and prohibited IPv4 ranges, the four
            reserved addresses, the auto mode ranges).
  [fw]      Firewall resource reference (sourceServiceAccounts "cannot be used at the same
            time as sourceTags or targetTags", "For INGRESS traffic, one of sourceRanges,
            sourceTags or sourceServiceAccounts is required"); firewalls.insert/update need
            compute.networks.updatePolicy on the network.
  [fw-default] cloud.google.com/firewall/docs/firewalls#more_rules_default_vpc.
  [nat]     Cloud NAT / Cloud Router references (RouterNat fields, private ASNs).
  [patch]   "This method supports PATCH semantics and uses the JSON merge patch format".
  [images]  "Image families" (cloud.google.com/compute/docs/images/image-families-best-
            practices): the newest non-deprecated image; DeprecationStatus.state: OBSOLETE or
            DELETED "will be rejected and result in an error"; public images readable by all.
  [roles]   cloud.google.com/iam/docs/roles-permissions/compute (compute_network_rules.py).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlparse

from tests.fakes import compute_network_rules as rules
from tests.fakes.compute_network_rules import Call, Image, NetOp, Router, Subnetwork
from tests.fakes.compute_network_vm import VmVerbs
from tests.fakes.compute_network_vpc import VpcVerbs
from tests.fakes.gcp_project import FakeProject

if TYPE_CHECKING:
    from collections.abc import Callable

Reply = tuple[int, dict[str, Any]]
PREFIX = re.compile(r"/compute/v1/projects/([^/]+)(?:/(.*))?")
SERVICE = "compute.googleapis.com"
READ_ONLY_POSTS = ("wait", "testIamPermissions")
_N, _R = r"(?P<name>[^/]+)", r"regions/(?P<region>[^/]+)"
# (method, path after projects/P/, handler, verb, kind)
ROUTES = [(m, re.compile(p), h, v, k) for m, p, h, v, k in [
    ("GET", "global/networks", "_net_list", "list", "networks"),
    ("POST", "global/networks", "_net_insert", "insert", "networks"),
    ("GET", f"global/networks/{_N}", "_net_get", "get", "networks"),
    ("DELETE", f"global/networks/{_N}", "_net_delete", "delete", "networks"),
    ("GET", f"{_R}/subnetworks", "_sub_list", "list", "subnetworks"),
    ("POST", f"{_R}/subnetworks", "_sub_insert", "insert", "subnetworks"),
    ("GET", f"{_R}/subnetworks/{_N}", "_sub_get", "get", "subnetworks"),
    ("DELETE", f"{_R}/subnetworks/{_N}", "_sub_delete", "delete", "subnetworks"),
    ("POST", f"{_R}/subnetworks/{_N}/setPrivateIpGoogleAccess", "_sub_pga",
     "setPrivateIpGoogleAccess", "subnetworks"),
    ("GET", f"{_R}/routers", "_router_list", "list", "routers"),
    ("POST", f"{_R}/routers", "_router_insert", "insert", "routers"),
    ("GET", f"{_R}/routers/{_N}", "_router_get", "get", "routers"),
    ("PATCH", f"{_R}/routers/{_N}", "_router_patch", "patch", "routers"),
    ("DELETE", f"{_R}/routers/{_N}", "_router_delete", "delete", "routers"),
    ("GET", "global/firewalls", "_fw_list", "list", "firewalls"),
    ("POST", "global/firewalls", "_fw_insert", "insert", "firewalls"),
    ("GET", f"global/firewalls/{_N}", "_fw_get", "get", "firewalls"),
    ("PATCH", f"global/firewalls/{_N}", "_fw_patch", "patch", "firewalls"),
    ("PUT", f"global/firewalls/{_N}", "_fw_update", "update", "firewalls"),
    ("DELETE", f"global/firewalls/{_N}", "_fw_delete", "delete", "firewalls"),
    ("GET", f"{_R}/addresses", "_addr_list", "list", "addresses"),
    ("POST", f"{_R}/addresses", "_addr_insert", "insert", "addresses"),
    ("GET", f"{_R}/addresses/{_N}", "_addr_get", "get", "addresses"),
    ("DELETE", f"{_R}/addresses/{_N}", "_addr_delete", "delete", "addresses"),
    ("GET", "global/images", "_image_list", "list", "images"),
    ("GET", "global/images/family/(?P<family>[^/]+)", "_image_family", "getFromFamily",
     "images"),
    ("GET", f"global/images/{_N}", "_image_get", "get", "images"),
    ("POST", "global/images", "_image_insert", "insert", "images"),
    ("GET", f"global/operations/{_N}", "_op_get", "get", "operations"),
    ("POST", f"global/operations/{_N}/wait", "_op_wait", "wait", "operations"),
    ("GET", f"{_R}/operations/{_N}", "_op_get", "get", "operations"),
    ("POST", f"{_R}/operations/{_N}/wait", "_op_wait", "wait", "operations"),
    ("POST", "zones/(?P<zone>[^/]+)/instances", "_vm_insert", "insert", "instances"),
    ("DELETE", f"zones/(?P<zone>[^/]+)/instances/{_N}", "_vm_delete", "delete", "instances"),
    ("GET", f"zones/(?P<zone>[^/]+)/disks/{_N}", "_disk_get", "get", "disks"),
]]
# the old instance verbs' permissions, for the gate and the record (the engine checks them too)
LEGACY = {None: "get", "start": "start", "stop": "stop", "setScheduling": "setScheduling",
          "setMetadata": "setMetadata", "getGuestAttributes": "getGuestAttributes"}


class Host(Protocol):
    """What NetworkState uses of FakeComputeEngine (same package: its private parts too)."""

    project: str
    url: str
    op_pending_seconds: float
    stop_seconds: float
    wait_cap_seconds: float
    instances: dict[tuple[str, str], Any]
    operations: dict[tuple[str, str], Any]
    calls: list[dict[str, Any]]
    _lock: threading.RLock
    _seq: itertools.count[int]

    def principal(self, auth: str | None) -> str | None: ...
    def allowed(self, principal: str | None, permission: str, resource: str) -> bool: ...
    def _tick(self) -> None: ...
    def _at(self, when: float, fn: Callable[[], None]) -> None: ...
    def _new_op(self, inst: Any, op_type: str, running_at: float, done_at: float,
                user: str = "system") -> Any: ...
    def _op_json(self, op: Any) -> dict[str, Any]: ...
    def _enter_running(self, inst: Any) -> None: ...
    def _leave_running(self, inst: Any, status: str) -> None: ...


class NetworkState(VpcVerbs, VmVerbs):
    """The networking state of one project, served under FakeComputeEngine's URL."""

    def __init__(self, host: Host, gcp: FakeProject | None = None) -> None:
        self.host = host
        self.gcp = gcp
        self.project = host.project
        self.networks: dict[str, dict[str, Any]] = {}
        self.subnets: dict[tuple[str, str], Subnetwork] = {}  # (region, name)
        self.routers: dict[tuple[str, str], Router] = {}  # (region, name)
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.addresses: dict[tuple[str, str], dict[str, Any]] = {}  # (region, name)
        self.images: dict[tuple[str, str], Image] = {}  # (project, name)
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name): boot disks
        self.operations: dict[tuple[str, str], NetOp] = {}  # (region or "global", name)
        self.creating: set[str] = set()  # resource names with an insert in flight
        self.busy: set[str] = set()  # resource names with any change in flight
        self._ids = itertools.count(4_100_000_000_001)
        self.networks["default"] = self._network_json("default", True, "Default network "
                                                      "for the project")
        self.add_default_firewalls()

    # ---- test controls -------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"{self.host.url}/compute/v1/projects/{self.project}"

    def subnet(self, region: str, name: str = "default") -> Subnetwork:
        """The subnet (region, name); the default network's made on first use [auto]."""
        with self.host._lock:
            if (region, name) not in self.subnets:
                self.subnets[(region, name)] = Subnetwork(
                    self.project, region, name, True,
                    rules.AUTO_SUBNETS.get(region, "10.128.0.0/20"), name, next(self._ids),
                    description="auto subnet of the default network")
            return self.subnets[(region, name)]

    def add_nat(self, region: str, router: str = "nat-router", nat: str = "nat",
                subnetworks: list[str] | None = None) -> None:
        """A Cloud NAT on the default network (a router of that name gets one more NAT)."""
        entry: dict[str, Any] = {"name": nat, "natIpAllocateOption": "AUTO_ONLY",
                                 "sourceSubnetworkIpRangesToNat":
                                     "ALL_SUBNETWORKS_ALL_IP_RANGES"}
        if subnetworks is not None:
            entry["sourceSubnetworkIpRangesToNat"] = "LIST_OF_SUBNETWORKS"
            entry["subnetworks"] = [{"name": f"{self.base}/regions/{region}/subnetworks/{s}",
                                     "sourceIpRangesToNat": ["ALL_IP_RANGES"]}
                                    for s in subnetworks]
        with self.host._lock:
            r = self.routers.setdefault((region, router), Router(
                self.project, region, router, f"{self.base}/global/networks/default",
                id=next(self._ids)))
            r.nats.append(entry)

    def add_image(self, name: str, family: str | None = None, disk_size_gb: int = 10, *,
                  created: float | None = None, project: str | None = None,
                  deprecated: str | None = None) -> Image:
        """An image (in `project`: another project's images are public, as debian-cloud's);
        `created` orders a family (default: now, so a later image is newer); `deprecated`:
        DEPRECATED, OBSOLETE or DELETED [images]."""
        if deprecated not in (None, "ACTIVE", "DEPRECATED", "OBSOLETE", "DELETED"):
            raise ValueError(f"deprecated {deprecated!r}")
        with self.host._lock:
            img = Image(project or self.project, name, family, disk_size_gb,
                        time.time() if created is None else created,
                        None if deprecated == "ACTIVE" else deprecated, next(self._ids))
            self.images[(img.project, name)] = img
            return img

    def add_default_firewalls(self) -> None:
        """[fw-default] default-allow-internal/-ssh/-rdp/-icmp on the default network."""
        with self.host._lock:
            for rule in rules.default_firewalls(f"{self.base}/global/networks/default"):
                self.firewalls[rule["name"]] = self._stamp(rule, "firewall",
                                                           f"global/firewalls/{rule['name']}")

    def nic_network(self, region: str, subnet: str) -> str:
        sub = self.subnets.get((region, subnet))
        return f"{self.base}/global/networks/{sub.network if sub else 'default'}"

    # ---- the gate ------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: dict[str, Any] | None,
               auth: str | None) -> Reply | None:
        """A reply for this module's calls or a refused call; None: the engine's own."""
        url = urlparse(raw_path)
        m = PREFIX.fullmatch(url.path)
        if m is None:
            return None
        project, rest = m.group(1), m.group(2) or ""
        route = next(((h, v, k, r.fullmatch(rest)) for meth, r, h, v, k in ROUTES
                      if meth == method and r.fullmatch(rest)), None)
        with self.host._lock:
            call = Call(method, url.path, parse_qs(url.query), body or {},
                        self.host.principal(auth), auth)
            if route is None:
                return self._legacy_gate(call, project, rest)
            handler, call.verb, call.kind, match = route
            call.project = project
            reply = self._gate(call)
            if reply is None:
                self.host._tick()
                if project != self.project and call.kind != "images":
                    reply = rules.cerror(403, f"Project {project} not found or permission "
                                         "denied", "forbidden")
                else:
                    reply = getattr(self, handler)(call, **match.groupdict())
            self._record(call, reply[0], match.groupdict())
            return reply

    def _gate(self, call: Call) -> Reply | None:
        if self.gcp is None:
            return None
        if call.member is None:
            return 401, {"error": {
                "code": 401, "status": "UNAUTHENTICATED",
                "message": "Request is missing required authentication credential. Expected "
                           "OAuth 2 access token, login cookie or other valid authentication "
                           "credential.",
                "errors": [{"message": "Login Required.", "domain": "global",
                            "reason": "required", "location": "Authorization",
                            "locationType": "header"}]}}
        if not self.gcp.serves(SERVICE):
            status, payload = self.gcp.service_disabled(SERVICE)
            err = payload["error"]
            err["errors"] = [{"message": err["message"], "domain": "usageLimits",
                              "reason": "accessNotConfigured",
                              "extendedHelp": "https://console.developers.google.com"}]
            return status, payload
        return None

    def _legacy(self, method: str, project: str, rest: str) -> tuple[str, str, str, str | None]:
        """(verb, kind, resource, permission) of an engine call [ref]."""
        where = f"projects/{project}"
        m = re.fullmatch(r"zones/([^/]+)/(instances|operations)(?:/([^/]+))?(?:/([A-Za-z]+))?",
                         rest)
        if m is None:
            region = rest.removeprefix("regions/") if rest.startswith("regions/") else None
            if region is None:
                return "get", "projects", where, "compute.projects.get"
            return "get", "regions", f"{where}/regions/{region}", "compute.regions.get"
        zone, kind, name, verb = m.groups()
        if name is None and kind == "instances":
            return "list", kind, f"{where}/zones/{zone}", "compute.instances.list"
        if kind == "operations":
            op = "list" if name is None else "get"
            return verb or op, kind, f"{where}/zones/{zone}", f"compute.zoneOperations.{op}"
        resource = f"{where}/zones/{zone}/instances/{name}"
        perm = LEGACY.get(verb) if method == "GET" or verb else None
        return verb or "get", kind, resource, perm and f"compute.instances.{perm}"

    def _legacy_gate(self, call: Call, project: str, rest: str) -> Reply | None:
        """The engine's calls: with gcp, the gate and their permission first."""
        if self.gcp is None:
            return None
        call.verb, call.kind, resource, perm = self._legacy(call.method, project, rest)
        reply = self._gate(call)
        if reply is None and perm is not None and project == self.project:
            reply = self.check(call, perm, resource)
        if reply is not None:
            self._record(call, reply[0], {})
        return reply

    def after(self, method: str, raw_path: str, auth: str | None, status: int) -> None:
        """Record one of the engine's own calls (with gcp), once it has answered."""
        url = urlparse(raw_path)
        m = PREFIX.fullmatch(url.path)
        if self.gcp is None or m is None:
            return
        call = Call(method, url.path, {}, {}, self.host.principal(auth), auth)
        call.verb, call.kind, _, call.permission = self._legacy(method, m.group(1),
                                                                m.group(2) or "")
        self._record(call, status, None)

    def _record(self, call: Call, status: int, where: dict[str, Any] | None) -> None:
        mutating = call.method != "GET" and call.verb not in READ_ONLY_POSTS
        if self.gcp is not None:
            self.gcp.record("compute", call.method, call.path, call.member, mutating=mutating,
                            permission=call.permission, status=status, body=call.body or None)
        if where is not None:  # the engine records its own calls itself
            entry = {"method": call.method, "verb": call.verb, "kind": call.kind,
                     "auth": call.auth, "principal": call.member, "body": call.body,
                     "status": status, "at": time.time(), **(where or {})}
            if call.kind == "instances":
                entry["instance"] = entry.pop("name", None) or call.body.get("name")
            self.host.calls.append(entry)

    def check(self, call: Call, permission: str, resource: str) -> Reply | None:
        """[errors] Compute's 403 unless the caller holds `permission` on `resource`."""
        call.permission = call.permission or permission
        if self.gcp is None and call.kind != "instances":
            # without the shared project the engine's own IAM applies to instances and
            # operations only, as compute_engine.py's docstring says (the preflight's
            # networking reads are not checked there)
            return None
        if self.host.allowed(call.member, permission, rules.iam_name(resource)):
            return None
        return rules.denied(permission, resource)

    # ---- operations ----------------------------------------------------------------------
    def operate(self, call: Call, op_type: str, rel: str, target_id: str,
                effect: Callable[[], None] | None, region: str | None = None,
                error: dict[str, Any] | None = None) -> Reply:
        """An operation on `rel` ("global/networks/N"): `effect` runs when it is DONE."""
        now = time.time()
        running = now + self.host.op_pending_seconds
        done = running + self.host.op_pending_seconds
        n = next(self.host._seq)
        op = NetOp(f"operation-{int(now * 1000)}-{n:06d}", region, op_type, f"{self.base}/{rel}",
                   target_id, now, running, done, rules.email(call.member), error)
        self.operations[(region or "global", op.name)] = op
        name = f"projects/{self.project}/{rel}"
        self.busy.add(name)
        if op_type == "insert" and error is None:
            self.creating.add(name)

        def finish() -> None:
            self.busy.discard(name)
            self.creating.discard(name)
            if effect is not None and error is None:
                effect()

        self.host._at(done, finish)
        return 200, self.op_json(op)

    def op_json(self, op: NetOp) -> dict[str, Any]:
        now = time.time()
        status = "DONE" if now >= op.done_at else "RUNNING" if now >= op.running_at else "PENDING"
        scope = f"{self.base}/regions/{op.region}" if op.region else f"{self.base}/global"
        d: dict[str, Any] = {
            "kind": "compute#operation", "id": str(abs(hash(op.name)) % 10**18),
            "name": op.name, "operationType": op.op_type, "targetLink": op.target,
            "targetId": op.target_id, "status": status, "user": op.user,
            "progress": 100 if status == "DONE" else 0, "insertTime": rules.rfc3339(op.created),
            "selfLink": f"{scope}/operations/{op.name}"}
        if op.region:
            d["region"] = scope
        if status != "PENDING":
            d["startTime"] = rules.rfc3339(op.running_at)
        if status == "DONE":
            d["endTime"] = rules.rfc3339(op.done_at)
            if op.error:
                d["error"] = op.error
                d["httpErrorStatusCode"], d["httpErrorMessage"] = 400, "BAD REQUEST"
        return d

    def _op_get(self, call: Call, name: str, region: str | None = None) -> Reply:
        where = f"projects/{self.project}" + (f"/regions/{region}" if region else "")
        kind = "regionOperations" if region else "globalOperations"
        err = self.check(call, f"compute.{kind}.get", where)
        op = self.operations.get((region or "global", name))
        if err or op is None:
            return err or rules.not_found(f"{where}/{'' if region else 'global/'}operations/"
                                          f"{name}")
        return 200, self.op_json(op)

    def _op_wait(self, call: Call, name: str, region: str | None = None) -> Reply:
        op = self.operations.get((region or "global", name))
        deadline = time.time() + self.host.wait_cap_seconds
        while op is not None and time.time() < min(deadline, op.done_at):
            self.host._lock.release()  # let the clock and other callers run
            try:
                time.sleep(0.02)
            finally:
                self.host._lock.acquire()
            self.host._tick()
        return self._op_get(call, name, region)

    def in_use(self, name: str, users: list[str]) -> dict[str, Any] | None:
        """[in-use] the operation error of deleting `name` while `users` use it."""
        if not users:
            return None
        kind = name.split("/")[-2].removesuffix("s")
        return {"errors": [{"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
                            "message": f"The {kind} resource '{name}' is already being used "
                                       f"by '{users[0]}'"}]}

    # ---- shared helpers ------------------------------------------------------------------
    def _stamp(self, body: dict[str, Any], kind: str, rel: str) -> dict[str, Any]:
        return {**body, "kind": f"compute#{kind}", "id": str(next(self._ids)),
                "creationTimestamp": rules.rfc3339(time.time()), "selfLink": f"{self.base}/{rel}"}

    def listing(self, kind: str, rel: str, items: list[dict[str, Any]],
                call: Call) -> Reply:
        if call.query.get("filter"):
            # a filter the fake ignored would hand back more than the caller asked for
            return rules.cerror(400, "filter is not modelled by the fake", "invalid")
        out: dict[str, Any] = {"kind": f"compute#{kind}List", "id": f"projects/"
                               f"{self.project}/{rel}", "selfLink": f"{self.base}/{rel}"}
        if items:
            out["items"] = items
        return 200, out

    def mutable(self, name: str, present: bool) -> Reply | None:
        """404 for a missing resource, 400 resourceNotReady for one with a change in flight."""
        if not present:
            return rules.not_found(name)
        return rules.not_ready(name) if name in self.busy else None

    def new(self, name: str, present: bool) -> Reply | None:
        return rules.exists(name) if present or name in self.creating else None

    def network_of(self, value: str | None, field_: str) -> tuple[str | None, Reply | None]:
        """The network name a reference names, or the reply refusing it."""
        project, _, name = rules.ref(value, "networks")
        if not value:
            return None, rules.required(field_)
        if name is None or (project or self.project) != self.project:
            return None, rules.invalid(field_, value, "Must be a network URL.")
        if name not in self.networks:
            return None, rules.not_found(f"projects/{self.project}/global/networks/{name}")
        return name, None
