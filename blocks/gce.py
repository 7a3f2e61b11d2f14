"""The GPU node on Compute Engine, as configuration: a g2-standard-4 (one NVIDIA L4) that
already exists, is stopped between runs, and runs the inference engine (llama.cpp or vLLM) on
port 9080 from its startup script.

Zones and fallbacks. A spot start fails when the zone has no L4 capacity (Compute answers the
start operation with ZONE_RESOURCE_POOL_EXHAUSTED). The node then tries `fallback_zones` in
order, and after that — if `on_demand_fallback` — the same zones again on-demand
(tasks/compute/gce/placement.py). Each zone has its own pre-built instance (same image, disk with
the weights, startup script): by default the instance has the same name in every zone
(`instance`); `zone_instances` overrides the name per zone. Instances are never created or
deleted by the flow. With `nodes` = N > 1 the nightly boots N such nodes: node i ≥ 2 is the
instance `{name}-{i}` of each zone (`node_blocks`), pre-built like the first. On-demand is
reached by changing the stopped instance's provisioning model (instances.setScheduling); the
next spot run sets it back to SPOT before starting. Quota errors, UNSUPPORTED_OPERATION,
5xx/429 on the start call and a preemption during boot also move on to the next placement
(tasks/compute/gce/lifecycle.py).

Self-stop. Every start sets scheduling.maxRunDuration (`max_run_seconds`, or the night's
budget the nightly passes) with termination action STOP: Compute stops a node whose
orchestrator died, whatever the reaper does.

This block holds the fields, the credentials and the client factory
(`get_compute_clients`); the lifecycle — start, readiness of the engine, stop, cost — is
tasks/compute/gce/lifecycle.py (GceNode), built from this block by tasks/compute/protocol.py
(node_for, nodes_for).
"""

from __future__ import annotations

from typing import Any, Literal

from google.api_core.client_options import ClientOptions
from prefect.blocks.core import Block
from prefect_gcp import GcpCredentials
from pydantic import Field, field_validator, model_validator

from blocks.node_serve import NodeServeSettings


class GceCompute(Block):
    """A Compute Engine VM as the node (see the module docstring for zones and fallbacks)."""

    _block_type_name = "SLM GCE Compute"
    _description = "Starts/stops a pre-built GPU VM (g2-standard-4 + L4) serving on port 9080."

    project: str = Field(description="GCP project id.")
    zone: str = Field(description="Primary zone, e.g. us-central1-a.")
    instance: str = Field(description="Instance name (the same name in each fallback zone unless "
                                      "zone_instances says otherwise).")
    fallback_zones: list[str] = Field(default_factory=list,
                                      description="Zones tried in order when a zone is stocked out.")
    zone_instances: dict[str, str] = Field(default_factory=dict,
                                           description="Per-zone instance name overrides.")
    nodes: int = Field(
        default=1, ge=1, le=16,
        description="How many nodes the nightly boots and spreads phase 1 across (training "
        "runs on the first). Node i ≥ 2 is the instance `{instance}-{i}` in each zone (each "
        "zone_instances name likewise suffixed), built like the first and started with the "
        "same zones and fallbacks.")
    provisioning: Literal["spot", "on-demand"] = Field(default="spot")
    on_demand_fallback: bool = Field(default=False, description="After every zone is stocked out "
                                     "for spot, try the zones again on-demand (~2.5x the price).")
    gcp_credentials: GcpCredentials | None = Field(
        default=None, description="prefect-gcp GcpCredentials block; empty = Application Default "
        "Credentials (gcloud login, or the orchestrator's service account).")
    api_endpoint: str | None = Field(default=None, description="Compute API endpoint override "
                                     "(private endpoint, or a local fake in tests).")
    secret_manager_endpoint: str | None = Field(
        default=None, description="Secret Manager API endpoint override for preflight's check "
        "of the node's secrets (private endpoint, or a local fake in tests); empty = "
        "https://secretmanager.googleapis.com.")
    boot_timeout_seconds: float = Field(default=600.0, gt=0,
                                        description="Start call → instance RUNNING with an IP.")
    stop_timeout_seconds: float = Field(default=300.0, gt=0)
    inference_port: int = Field(default=9080, ge=1, le=65535)
    poll_seconds: float = Field(
        default=30.0, gt=0, description="Instance status polling interval (boot, stop) and how "
        "often the watch of a node run checks the node; the first boot polls start at 0.5 s "
        "and back off to it. 30-60 s in production (each poll is an API call).")
    max_run_seconds: float = Field(
        default=18000.0, ge=30, le=120 * 86400,
        description="Compute stops the node after this long RUNNING (scheduling.maxRunDuration, "
        "action STOP), set on every start. A nightly (and node smoke) passes its own run limit "
        "instead: the night's budget + stop_timeout_seconds + 1800 s (tasks/night/clock.py "
        "night_budget); this is the limit of every other start.")
    api_retries: int = Field(default=6, ge=0, description="Retries of a Compute call that "
                             "failed transiently (5xx, 429, rate limit, reset, timeout).")
    retry_base_seconds: float = Field(default=1.0, gt=0, description="First backoff before a "
                                      "retry; doubles each time, with full jitter.")
    retry_max_seconds: float = Field(default=30.0, gt=0, description="Longest backoff.")
    progress_seconds: float = Field(default=60.0, gt=0, description="How often the wait for "
                                    "the engine logs where the server is.")
    spot_usd_per_hour: float = Field(
        default=0.28, ge=0,
        description="g2-standard-4 spot, us-central1, late 2025 (~$0.28/h; spot prices move "
                    "monthly). Disk not included. Configure for your region.")
    on_demand_usd_per_hour: float = Field(
        default=0.71, ge=0,
        description="g2-standard-4 on-demand incl. the L4, us-central1 (~$0.7068/h). Configure "
                    "for your region.")
    node: NodeServeSettings = Field(default_factory=NodeServeSettings,
                                    description="How the node's startup script runs the engine "
                                    "(llama.cpp or vLLM) and the Prefect worker.")
    state_dir: str = Field(default=".slm-nightly", description="Where the node record is kept.")

    @field_validator("api_endpoint", "secret_manager_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with https:// (or http:// for a local fake)")
        return v.rstrip("/") if v else v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "vllm" in data:
            raise ValueError("the `vllm` table is now `node` (the engine is a choice: llama.cpp "
                             "or vLLM) — rename [compute.vllm] to [compute.node] in the profile")
        return data

    @model_validator(mode="after")
    def _zones(self) -> GceCompute:
        zones = self.zones()
        if len(set(zones)) != len(zones):
            raise ValueError(f"fallback_zones repeat a zone: {zones}")
        extra = sorted(set(self.zone_instances) - set(zones))
        if extra:
            raise ValueError(f"zone_instances names zones not in zone/fallback_zones: {extra}")
        return self

    def node_blocks(self) -> list[GceCompute]:
        """One block per node, the primary (this one) first: node i ≥ 2 is a copy whose
        instance — in every zone — carries the suffix `-{i}`. Its node record is its own
        (<state_dir>/gce-<instance>.json)."""
        return [self] + [self.model_copy(update={
            "nodes": 1, "instance": f"{self.instance}-{i}",
            "zone_instances": {z: f"{name}-{i}" for z, name in self.zone_instances.items()},
        }) for i in range(2, self.nodes + 1)]

    def zones(self) -> list[str]:
        """The primary zone, then the fallback zones, in the order a start tries them."""
        return [self.zone, *self.fallback_zones]

    def instance_in(self, zone: str) -> str:
        return self.zone_instances.get(zone, self.instance)

    def where(self, zone: str) -> str:
        """The instance's resource path in `zone` (for messages)."""
        return f"projects/{self.project}/zones/{zone}/instances/{self.instance_in(zone)}"

    def get_credentials(self) -> Any:
        """The credentials every Compute client of this block uses (the node's, the
        preflight's). With no GcpCredentials block, an empty one: prefect-gcp's own fallback
        is Application Default Credentials (google.auth.default(), which raises google.auth's
        DefaultCredentialsError when there are none)."""
        return (self.gcp_credentials or GcpCredentials(project=self.project)
                ).get_credentials_from_service_account()

    def get_compute_clients(self) -> tuple[Any, Any]:
        """(InstancesClient, ZoneOperationsClient), REST transport, on the block's credentials
        (get_credentials) and api_endpoint."""
        from google.cloud import compute_v1

        creds = self.get_credentials()
        opts = ClientOptions(api_endpoint=self.api_endpoint) if self.api_endpoint else None
        return (compute_v1.InstancesClient(transport="rest", credentials=creds, client_options=opts),
                compute_v1.ZoneOperationsClient(transport="rest", credentials=creds,
                                                client_options=opts))
