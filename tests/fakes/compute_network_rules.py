"""Compute Engine's validation rules and error texts for the networking fake
(tests/fakes/compute_network.py): pure functions over request bodies, no state. Each rule
names its source; see compute_network.py's docstring for the source list ([ref-*], [errors],
[fw], [subnets], [nat], [auto], [roles]). A text marked "constructed" is worded from the
reference's own sentence where no report of the wire text was found.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.fakes.gcp_project import ROLES

Reply = tuple[int, dict[str, Any]]

# [ref-*] every Compute name: RFC1035, 1-63 characters
NAME_RE = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
NAME = re.compile(NAME_RE)
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")

# [roles] cloud.google.com/iam/docs/roles-permissions/compute and .../storage: only permissions
# the real roles hold, merged (union) into the shared ROLES
_ROLES: dict[str, frozenset[str]] = {
    # "create, modify, and delete networking resources, except for firewall rules": no
    # compute.firewalls.create/update/delete and no compute.networks.updatePolicy
    "roles/compute.networkAdmin": frozenset({
        "compute.networks.create", "compute.networks.delete", "compute.networks.get",
        "compute.networks.list", "compute.networks.update", "compute.networks.use",
        "compute.subnetworks.create", "compute.subnetworks.delete", "compute.subnetworks.get",
        "compute.subnetworks.list", "compute.subnetworks.update", "compute.subnetworks.use",
        "compute.subnetworks.setPrivateIpGoogleAccess", "compute.routers.create",
        "compute.routers.delete", "compute.routers.get", "compute.routers.list",
        "compute.routers.update", "compute.addresses.create",
        "compute.addresses.createInternal", "compute.addresses.delete",
        "compute.addresses.get", "compute.addresses.list", "compute.firewalls.get",
        "compute.firewalls.list", "compute.globalOperations.get",
        "compute.regionOperations.get"}),
    "roles/compute.securityAdmin": frozenset({
        "compute.firewalls.create", "compute.firewalls.delete", "compute.firewalls.get",
        "compute.firewalls.list", "compute.firewalls.update", "compute.networks.updatePolicy",
        "compute.globalOperations.get"}),
    "roles/compute.imageUser": frozenset({
        "compute.images.get", "compute.images.getFromFamily", "compute.images.list",
        "compute.images.useReadOnly"}),
    "roles/compute.viewer": frozenset({
        "compute.networks.get", "compute.networks.list", "compute.subnetworks.get",
        "compute.subnetworks.list", "compute.routers.get", "compute.routers.list",
        "compute.firewalls.get", "compute.firewalls.list", "compute.addresses.get",
        "compute.addresses.list", "compute.images.get", "compute.images.getFromFamily",
        "compute.images.list", "compute.instances.get", "compute.instances.list",
        "compute.globalOperations.get", "compute.regionOperations.get",
        "compute.zoneOperations.get"}),
    # what the v1 instance admin also holds that instances.insert checks
    "roles/compute.instanceAdmin.v1": frozenset({
        "compute.disks.create", "compute.instances.setServiceAccount",
        "compute.instances.setLabels", "compute.subnetworks.useExternalIp"}),
}
for _role, _perms in _ROLES.items():
    ROLES[_role] = ROLES.get(_role, frozenset()) | _perms

# [subnets] "Prohibited IPv4 subnet ranges" (cloud.google.com/vpc/docs/subnets#prohibited-ranges)
PROHIBITED = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32")]
AUTO_RANGE = ipaddress.ip_network("10.128.0.0/9")
# [auto] the auto mode IPv4 ranges (cloud.google.com/vpc/docs/subnets#ip-ranges); a region
# the table lacks (the tests' "zone") gets us-central1's, as the fake always gave
AUTO_SUBNETS = {"us-central1": "10.128.0.0/20", "europe-west1": "10.132.0.0/20",
                "us-west1": "10.138.0.0/20", "asia-east1": "10.140.0.0/20",
                "us-east1": "10.142.0.0/20", "asia-northeast1": "10.146.0.0/20",
                "asia-southeast1": "10.148.0.0/20", "us-east4": "10.150.0.0/20",
                "europe-west2": "10.154.0.0/20", "europe-west3": "10.156.0.0/20",
                "europe-west4": "10.164.0.0/20"}
PROTOCOLS = {"tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all"}
PORTED = {"tcp", "udp", "sctp"}  # [fw] ports only with these
NAT_RANGES = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES",
              "LIST_OF_SUBNETWORKS")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def email(member: str | None) -> str:
    """The e-mail part of an IAM member ("serviceAccount:a@b" → "a@b")."""
    return (member or "anonymous").split(":", 1)[-1]


# ---- records (NetworkState's state) ----------------------------------------------------------
@dataclass
class Subnetwork:
    """A subnetwork; `private_ip_google_access` is what tests flip (FakeSubnet before)."""

    project: str
    region: str
    name: str
    private_ip_google_access: bool = True
    ip_cidr_range: str = "10.128.0.0/20"
    network: str = "default"  # the network's name
    id: int = 0
    created: float = field(default_factory=time.time)
    description: str = ""

    def link(self, base: str) -> str:
        return (f"{base}/compute/v1/projects/{self.project}/regions/{self.region}/subnetworks/"
                f"{self.name}")


@dataclass
class Router:
    project: str
    region: str
    name: str
    network: str  # URL
    nats: list[dict[str, Any]] = field(default_factory=list)
    bgp: dict[str, Any] | None = None
    id: int = 0
    created: float = field(default_factory=time.time)
    description: str = ""


@dataclass
class Image:
    project: str
    name: str
    family: str | None
    disk_size_gb: int
    created: float
    deprecated: str | None = None  # DEPRECATED | OBSOLETE | DELETED
    id: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    description: str = ""
    source_disk: str | None = None  # the URL of the disk it was made from (images.insert)


@dataclass
class NetOp:
    """A global (region None) or region operation [ref-ops]."""

    name: str
    region: str | None
    op_type: str
    target: str
    target_id: str
    created: float
    running_at: float
    done_at: float
    user: str
    error: dict[str, Any] | None = None


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any]
    member: str | None
    auth: str | None
    verb: str = ""
    kind: str = ""
    permission: str | None = None
    project: str = ""


# ---- error JSON ([errors]: Compute's v1 shape, errors[] with domain/reason) -------------------
def cerror(code: int, message: str, reason: str, domain: str = "global") -> Reply:
    return code, {"error": {"code": code, "message": message, "errors": [
        {"message": message, "domain": domain, "reason": reason}]}}


def denied(permission: str, resource: str) -> Reply:
    return cerror(403, f"Required '{permission}' permission for '{resource}'", "forbidden")


def not_found(resource: str) -> Reply:
    return cerror(404, f"The resource '{resource}' was not found", "notFound")


def exists(resource: str) -> Reply:
    return cerror(409, f"The resource '{resource}' already exists", "alreadyExists")


def not_ready(resource: str) -> Reply:
    return cerror(400, f"The resource '{resource}' is not ready", "resourceNotReady")


def invalid(field: str, value: Any, why: str) -> Reply:
    """[errors] "Invalid value for field 'resource.F': 'V'. WHY" (reason invalid)."""
    return cerror(400, f"Invalid value for field 'resource.{field}': '{value}'. {why}", "invalid")


def required(field: str) -> Reply:
    return cerror(400, f"Required field 'resource.{field}' not specified", "required")


def bad_name(field: str, value: Any) -> Reply | None:
    if isinstance(value, str) and NAME.fullmatch(value):
        return None
    return invalid(field, value if value is not None else "",
                   f"Must be a match of regex '(?:{NAME_RE})'")


# ---- references (a URL, a partial URL or a bare name) ----------------------------------------
def ref(value: str | None, kind: str) -> tuple[str | None, str | None, str | None]:
    """(project, scope, name) of a reference to `kind` ("networks", "subnetworks", "images"):
    a full or partial URL; scope is the region/zone or None for global ones."""
    if not value:
        return None, None, None
    m = re.search(rf"(?:projects/([^/]+)/)?(?:global|(?:regions|zones)/([^/]+))/{kind}/"
                  r"([^/?]+)$", value)
    if m:
        return m.group(1), m.group(2), m.group(3)
    return None, None, value if "/" not in value else None


def iam_name(resource: str) -> str:
    """The name IAM looks a resource up by: FakeProject.ancestry walks (collection, id) pairs,
    so Compute's single `global` segment (and an image family's `family`) is dropped —
    "projects/P/global/networks/N" → "projects/P/networks/N". Error texts keep the real name."""
    return re.sub(r"/(?:global|family)(?=/)", "", resource)


def cidr(value: Any) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except (ValueError, TypeError):
        return None


# ---- subnetworks [subnets] -------------------------------------------------------------------
def subnet_range_error(value: Any, auto_mode: bool,
                       others: list[tuple[str, str, str]]) -> Reply | None:
    """ipCidrRange: a CIDR with its host bits clear, /8…/29, not prohibited, not overlapping
    another subnet of the network (others: (name, region, range)); in an auto-mode network, not
    in 10.128.0.0/9."""
    if not value:
        return required("ipCidrRange")
    net = cidr(value)
    if net is None:
        # constructed: the reference says "a valid IPv4 CIDR"
        return invalid("ipCidrRange", value, f"Invalid IPCidrRange: {value} is not a valid "
                       "IPv4 CIDR range.")
    if not 8 <= net.prefixlen <= 29:
        return invalid("ipCidrRange", value, f"Invalid IPCidrRange: {value}: the prefix "
                       "length must be between /8 and /29.")  # constructed
    if any(net.overlaps(p) for p in PROHIBITED):
        return invalid("ipCidrRange", value, f"Invalid IPCidrRange: {value} is in a "
                       "prohibited range.")  # constructed
    if auto_mode and net.overlaps(AUTO_RANGE):
        return invalid("ipCidrRange", value, "Extended subnetworks in auto subnet mode "
                       "networks cannot overlap with 10.128.0.0/9.")
    for name, region, other in others:
        if net.overlaps(ipaddress.IPv4Network(other)):
            return invalid("ipCidrRange", value, f"Invalid IPCidrRange: {value} conflicts "
                           f"with existing subnetwork '{name}' in region '{region}'.")
    return None


def usable_hosts(range_: str) -> list[str]:
    """[subnets] the addresses of a primary range a VM or reservation may get: all but the
    network, the gateway (.1), the second-to-last and the broadcast address."""
    hosts = [str(h) for h in ipaddress.IPv4Network(range_).hosts()]
    return hosts[1:-1]


# ---- firewalls [fw] --------------------------------------------------------------------------
def _rules_error(kind: str, rules: Any) -> Reply | None:
    for i, rule in enumerate(rules or []):
        proto = str(rule.get("IPProtocol", "")).lower()
        number = proto.isdigit() and 0 <= int(proto) <= 255
        if proto not in PROTOCOLS and not number:
            return invalid(f"{kind}[{i}].IPProtocol", rule.get("IPProtocol", ""),
                           "Must be one of [tcp, udp, icmp, esp, ah, sctp, ipip, all] or an "
                           "IP protocol number.")  # constructed from the reference
        ports = rule.get("ports") or []
        if ports and proto not in PORTED:
            return invalid(f"{kind}[{i}].ports", ",".join(ports), "Ports can only be "
                           "specified for protocols tcp, udp and sctp.")  # constructed
        for j, port in enumerate(ports):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", str(port))
            lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (1, 0)
            if not (m and 0 <= lo <= hi <= 65535):
                return invalid(f"{kind}[{i}].ports[{j}]", port, "Must be a port or a port "
                               "range within 0-65535.")  # constructed
    return None


def _ranges_error(body: dict[str, Any]) -> Reply | None:
    for key in ("sourceRanges", "destinationRanges"):
        for i, value in enumerate(body.get(key) or []):
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                return invalid(f"{key}[{i}]", value, "Must be a CIDR address range.")
    for key in ("sourceServiceAccounts", "targetServiceAccounts"):
        for i, value in enumerate(body.get(key) or []):
            if not EMAIL.fullmatch(str(value)):
                return invalid(f"{key}[{i}]", value, "Service accounts must be valid RFC 822 "
                               "email addresses.")
    for key in ("sourceTags", "targetTags"):
        for i, value in enumerate(body.get(key) or []):
            if not NAME.fullmatch(str(value)):
                return invalid(f"{key}[{i}]", value, f"Must be a match of regex '{NAME_RE}'")
    return None


def _sources_error(body: dict[str, Any]) -> Reply | None:
    """[fw] which source and target kinds a rule may combine."""
    has = {k: bool(body.get(k)) for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts",
                                          "targetTags", "targetServiceAccounts")}
    if has["sourceServiceAccounts"] and (has["sourceTags"] or has["targetTags"]):
        return invalid("sourceServiceAccounts", "", "sourceServiceAccounts cannot be used at "
                       "the same time as sourceTags or targetTags.")
    if has["targetServiceAccounts"] and (has["targetTags"] or has["sourceTags"]):
        return invalid("targetServiceAccounts", "", "targetServiceAccounts cannot be used at "
                       "the same time as targetTags or sourceTags.")
    if body["direction"] == "EGRESS" and (has["sourceTags"] or has["sourceServiceAccounts"]):
        return invalid("direction", "EGRESS", "sourceTags and sourceServiceAccounts cannot be "
                       "used with EGRESS rules.")  # constructed
    if body["direction"] == "INGRESS" and not (
            has["sourceRanges"] or has["sourceTags"] or has["sourceServiceAccounts"]):
        return invalid("sourceRanges", "", "For INGRESS traffic, one of sourceRanges, "
                       "sourceTags or sourceServiceAccounts is required.")
    return None


def firewall_error(body: dict[str, Any]) -> Reply | None:
    """The whole rule as firewalls.insert/update/patch checks it ([fw], [ref-firewalls])."""
    err = bad_name("name", body.get("name"))
    if err:
        return err
    if body["direction"] not in ("INGRESS", "EGRESS"):
        return invalid("direction", body["direction"], "Must be one of [EGRESS, INGRESS].")
    priority = body["priority"]
    if not isinstance(priority, int) or not 0 <= priority <= 65535:
        return invalid("priority", priority, "Must be between 0 and 65535.")  # constructed
    if bool(body.get("allowed")) == bool(body.get("denied")):
        return invalid("allowed", "", "Exactly one of allowed or denied must be specified.")
    return (_rules_error("allowed", body.get("allowed"))
            or _rules_error("denied", body.get("denied"))
            or _ranges_error(body) or _sources_error(body))


def firewall_defaults(body: dict[str, Any]) -> dict[str, Any]:
    """[ref-firewalls] what an absent field means: INGRESS, priority 1000, enabled."""
    out = {k: v for k, v in body.items() if v is not None}
    out.setdefault("direction", "INGRESS")
    out.setdefault("priority", 1000)
    out.setdefault("disabled", False)
    out.setdefault("logConfig", {"enable": False})
    out["priority"] = int(out["priority"]) if str(out["priority"]).isdigit() else out["priority"]
    return out


def default_firewalls(network_url: str) -> list[dict[str, Any]]:
    """[fw-default] the rules the `default` network comes with, priority 65534."""
    any_ = ["0.0.0.0/0"]
    rules = {"default-allow-internal": (["10.128.0.0/9"], [
                 {"IPProtocol": "tcp", "ports": ["0-65535"]},
                 {"IPProtocol": "udp", "ports": ["0-65535"]}, {"IPProtocol": "icmp"}],
                 "Allow internal traffic on the default network"),
             "default-allow-ssh": (any_, [{"IPProtocol": "tcp", "ports": ["22"]}],
                                   "Allow SSH from anywhere"),
             "default-allow-rdp": (any_, [{"IPProtocol": "tcp", "ports": ["3389"]}],
                                   "Allow RDP from anywhere"),
             "default-allow-icmp": (any_, [{"IPProtocol": "icmp"}],
                                    "Allow ICMP from anywhere")}
    return [firewall_defaults({"name": name, "network": network_url, "priority": 65534,
                               "sourceRanges": ranges, "allowed": allowed,
                               "description": desc})
            for name, (ranges, allowed, desc) in rules.items()]


# ---- routers [nat] ---------------------------------------------------------------------------
def nat_error(i: int, nat: dict[str, Any], subnet_ok: Any) -> Reply | None:
    """One nats[] entry; `subnet_ok(url)` says whether a listed subnet is in the router's
    region and network."""
    field = f"nats[{i}]"
    err = bad_name(f"{field}.name", nat.get("name"))
    if err:
        return err
    option = nat.get("natIpAllocateOption")
    if option not in ("AUTO_ONLY", "MANUAL_ONLY"):
        return invalid(f"{field}.natIpAllocateOption", option or "",
                       "Must be one of [AUTO_ONLY, MANUAL_ONLY].")
    if option == "MANUAL_ONLY" and not nat.get("natIps"):
        return invalid(f"{field}.natIps", "", "natIps must be specified with MANUAL_ONLY.")
    ranges = nat.get("sourceSubnetworkIpRangesToNat")
    if ranges not in NAT_RANGES:
        return invalid(f"{field}.sourceSubnetworkIpRangesToNat", ranges or "",
                       f"Must be one of [{', '.join(NAT_RANGES)}].")
    subnets = nat.get("subnetworks") or []
    if ranges == "LIST_OF_SUBNETWORKS" and not subnets:
        return invalid(f"{field}.subnetworks", "", "At least one subnetwork must be "
                       "specified with LIST_OF_SUBNETWORKS.")  # constructed
    if ranges != "LIST_OF_SUBNETWORKS" and subnets:
        return invalid(f"{field}.subnetworks", "", "Subnetworks can only be listed with "
                       "LIST_OF_SUBNETWORKS.")  # constructed
    for j, sub in enumerate(subnets):
        if not subnet_ok(sub.get("name")):
            return invalid(f"{field}.subnetworks[{j}].name", sub.get("name", ""),
                           "The subnetwork must be in the router's region and network.")
    return None


def bgp_error(bgp: Any) -> Reply | None:
    """[nat] a Cloud Router's ASN: a private ASN (64512-65534, 4200000000-4294967294)."""
    if not bgp or "asn" not in bgp:
        return None
    asn = int(bgp["asn"])
    if 64512 <= asn <= 65534 or 4200000000 <= asn <= 4294967294:
        return None
    return invalid("bgp.asn", asn, "Must be a private ASN (64512-65534 or "
                   "4200000000-4294967294).")  # constructed


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """[patch] RFC 7396 JSON merge patch: a field given replaces (arrays whole), null clears,
    an absent field is kept."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out
