"""What `slm-nightly gcp …` makes in a project: every name, range and role, read from the
profile's [gcp] table (defaults below) and its [compute] table, before any block is built —
setup runs on an empty project, where no saved block can exist yet.

    [gcp]
    bucket = "my-project-slm"        # required: adapters, datasets, run records, the code
    neo4j = "aura"                   # or "self-hosted": opens 7687 to instances tagged slm-neo4j
    prefect = "server"               # or "cloud": the node's worker reads its API key secret
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.shared.errors import ConfigError, explain_validation

# IAP's TCP forwarding reaches instances from this range only
# (cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule)
IAP_RANGE = "35.235.240.0/20"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # Compute resource names (RFC 1035)
_ACCOUNT = re.compile(r"^[a-z]([-a-z0-9]{4,28}[a-z0-9])$")  # service account ids, 6–30 chars
_BUCKET = re.compile(r"^[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9]$")

# Every API a night touches, enabled first: the quota check needs Cloud Quotas on, and
# Compute's quotas exist only once Compute is on (finding 6 of issue 38).
APIS = ("compute.googleapis.com", "iam.googleapis.com", "storage.googleapis.com",
        "secretmanager.googleapis.com", "iap.googleapis.com", "cloudquotas.googleapis.com",
        "logging.googleapis.com", "cloudresourcemanager.googleapis.com")


class GcpSpec(BaseModel):
    """The [gcp] table, plus what it takes from [compute]."""

    model_config = ConfigDict(extra="forbid")

    project: str = Field(description="The project id ([compute] project).")
    zones: list[str] = Field(description="The node zones ([compute] zone, fallback_zones).")
    node_instance: str = Field(default="slm-node", description="[compute] instance.")
    nodes: int = Field(default=1, ge=1, description="[compute] nodes: L4s at once.")
    zone_instances: dict[str, str] = Field(default_factory=dict,
                                           description="[compute] zone_instances.")
    provisioning: Literal["spot", "on-demand"] = Field(default="spot")
    on_demand_fallback: bool = Field(default=False)
    bucket: str = Field(description="The bucket: code, datasets, adapters, run records.")
    region: str | None = Field(default=None, description="Default: the region of the first "
                               "zone. Every zone must be in it (one subnet, one NAT).")
    network: str = Field(default="slm-net", description="The VPC setup makes (custom mode).")
    subnet: str = Field(default="slm-subnet")
    subnet_range: str = Field(default="10.20.0.0/24", description="The subnet's private range.")
    router: str = Field(default="slm-router", description="The Cloud Router holding the NAT.")
    nat: str = Field(default="slm-nat")
    orchestrator: str = Field(default="slm-orchestrator",
                              description="The orchestrator VM and its service account's id.")
    orchestrator_zone: str | None = Field(default=None, description="Default: the first zone.")
    orchestrator_ip: str = Field(default="slm-orchestrator-ip",
                                 description="The orchestrator's static internal address.")
    node_account: str = Field(default="slm-node", description="The node's service account id.")
    neo4j: Literal["aura", "self-hosted"] = Field(
        default="aura", description="self-hosted: a firewall rule opens 7687 from the subnet "
        "to instances tagged slm-neo4j.")
    prefect: Literal["server", "cloud"] = Field(default="server")
    # Google's Deep Learning VM images ship the NVIDIA driver and a CUDA toolkit with nvcc
    # (cloud.google.com/deep-learning-vm/docs/images: "Base" images, family
    # common-cu<CUDA>-ubuntu-2204-nvidia-<driver>, project deeplearning-platform-release). The
    # driver branch must be 580 or later: PyPI's torch pin is built for CUDA 13
    # (tasks/engine/cuda_driver.py checks it at install). Google's pages list no families; this
    # one is what public L4 deployments boot (e.g. image common-cu129-ubuntu-2204-nvidia-580-
    # v20260818), and the operator guide's appendix says how to confirm it.
    base_image: str = Field(
        default="projects/deeplearning-platform-release/global/images/family/"
        "common-cu129-ubuntu-2204-nvidia-580",
        description="The node image's base (`gcp image build`): a Deep Learning VM family "
        "with the NVIDIA driver and the CUDA toolkit (nvcc) for the L4.")
    secrets: list[str] = Field(default_factory=list, description="Secret Manager secrets the "
                               "node reads (from [compute.node] *_secret keys, plus these).")
    data_dirs: list[str] = Field(default_factory=list, description="Folders on the "
                                 "orchestrator the night reads ([sources], [corpus] root): the "
                                 "orchestrator's install makes them, owned by its user.")
    prefect_auth_secret: str = Field(
        default="slm-prefect-auth", description="prefect = \"server\": the secret setup makes "
        "with a generated auth string for the Prefect API (the server, the orchestrator's "
        "worker and CLI, the node's worker read it).")
    prefect_key_secret: str | None = Field(
        default=None, description="[compute.node] prefect_api_key_secret (Prefect Cloud).")

    @field_validator("network", "subnet", "router", "nat", "orchestrator", "orchestrator_ip")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} is not a Compute resource name (lowercase letter first, "
                             "then up to 62 of a-z, 0-9, '-', not ending in '-')")
        return v

    @field_validator("node_account", "orchestrator")
    @classmethod
    def _account_id(cls, v: str) -> str:
        if not _ACCOUNT.match(v):
            raise ValueError(f"{v!r} is not a service account id (6–30 of a-z, 0-9, '-', a "
                             "letter first)")
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        v = v.removeprefix("gs://").rstrip("/")
        if not _BUCKET.match(v) or ".." in v:
            raise ValueError(f"{v!r} is not a bucket name (3–63 of a-z, 0-9, '-', '_', '.')")
        return v

    @field_validator("subnet_range")
    @classmethod
    def _range(cls, v: str) -> str:
        net = ipaddress.ip_network(v, strict=True)
        if not net.is_private or not 8 <= net.prefixlen <= 29:
            raise ValueError(f"{v!r}: a private IPv4 range from /8 to /29")
        return str(net)

    # ---- derived names -----------------------------------------------------------------
    @property
    def home_region(self) -> str:
        return self.region or region_of(self.zones[0])

    @property
    def home_zone(self) -> str:
        return self.orchestrator_zone or self.zones[0]

    def account(self, account_id: str) -> str:
        return f"{account_id}@{self.project}.iam.gserviceaccount.com"

    @property
    def orchestrator_email(self) -> str:
        return self.account(self.orchestrator)

    @property
    def node_email(self) -> str:
        return self.account(self.node_account)

    @property
    def network_url(self) -> str:
        return f"projects/{self.project}/global/networks/{self.network}"

    @property
    def subnet_url(self) -> str:
        return f"projects/{self.project}/regions/{self.home_region}/subnetworks/{self.subnet}"


def region_of(zone: str) -> str:
    """us-central1-a → us-central1."""
    return zone.rsplit("-", 1)[0]


def spec_from_profile(path: Path, data: dict[str, Any]) -> GcpSpec:
    """The spec of a profile's TOML (tasks.profile.read_profile); ConfigError naming the key."""
    compute = data.get("compute", {})
    table = dict(data.get("gcp", {}))
    if "block" in compute and not {"project", "zones"} <= set(table):
        raise ConfigError(f"profile {path}: `gcp` commands read [compute] project and zones "
                          "inline, and [compute] names the saved block "
                          f"{compute['block']!r} — put project, zone and fallback_zones in "
                          "[gcp] (project = …, zones = […])")
    if "project" not in table and "project" in compute:
        table["project"] = compute["project"]
    if "zones" not in table and "zone" in compute:
        table["zones"] = [compute["zone"], *compute.get("fallback_zones", [])]
    for key, field_ in (("instance", "node_instance"), ("nodes", "nodes"),
                        ("zone_instances", "zone_instances"),
                        ("provisioning", "provisioning"),
                        ("on_demand_fallback", "on_demand_fallback")):
        if key in compute:
            table.setdefault(field_, compute[key])
    if "data_dirs" not in table:  # absolute paths only: relative ones live in the checkout
        sources = data.get("sources", {})  # a stream without a field of its own: [sources.other]
        named = [*sources.values(), *(sources.get("other") or {}).values(),
                 data.get("corpus", {}).get("root")]
        table["data_dirs"] = [p for p in named if isinstance(p, str) and p.startswith("/")]
    node = compute.get("node", {})
    if node.get("prefect_api_key_secret"):
        table.setdefault("prefect_key_secret", node["prefect_api_key_secret"])
    named = [node[k] for k in ("prefect_api_key_secret", "engine_api_key_secret") if node.get(k)]
    auth = table.get("prefect_auth_secret", "slm-prefect-auth")  # setup makes it, generated
    table["secrets"] = [s for s in dict.fromkeys([*named, *table.get("secrets", [])])
                        if s != auth]
    try:
        spec = GcpSpec(**table)
    except ValidationError as e:
        raise ConfigError(explain_validation(
            e, f"profile {path}: [gcp] is not valid:", "fix: the keys above in the profile's "
            "[gcp] table (tasks/gcp/spec.py lists them)")) from None
    if spec.project in ("my-gcp-project", "") or spec.bucket.startswith("my-"):
        raise ConfigError(f"profile {path}: [compute] project {spec.project!r} / [gcp] bucket "
                          f"{spec.bucket!r} are the shipped placeholders — set your project id "
                          "and a bucket name of your own")
    outside = [z for z in spec.zones + [spec.home_zone] if region_of(z) != spec.home_region]
    if outside:
        raise ConfigError(f"profile {path}: zones {outside} are not in region "
                          f"{spec.home_region!r} — one subnet and one NAT serve one region; "
                          "list zones of one region")
    if spec.prefect == "cloud" and spec.prefect_key_secret is None:
        raise ConfigError(f"profile {path}: [gcp] prefect = \"cloud\" needs [compute.node] "
                          "prefect_api_key_secret (the secret the node's worker reads its key "
                          "from)")
    return spec

