"""A Compute Engine instance as this project reads it: built once from the `compute_v1.Instance`
protobuf that instances.get answers, so the rest of the package reads plain typed fields and
never a protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

from tasks.compute.gce.placement import ProvisioningModel

# Compute's instance statuses (compute/docs/instances/instance-life-cycle)
Status = Literal["PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING",
                 "SUSPENDED", "REPAIRING", "TERMINATED"]
UP: frozenset[Status] = frozenset({"PROVISIONING", "STAGING", "RUNNING"})  # billed as running
STOPPED: frozenset[Status] = frozenset({"TERMINATED", "STOPPED"})


def timestamp(value: str | None) -> float | None:
    """An RFC 3339 timestamp as Compute writes it (e.g. 2026-11-30T01:02:03.456-08:00 or …Z)
    as epoch seconds; None when empty."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()


@dataclass(frozen=True)
class Instance:
    """What the lifecycle reads of one instance."""

    id: str
    name: str
    zone: str
    status: Status
    machine_type: str  # the type's name (g2-standard-4), not its URL
    internal_ip: str | None  # the first interface's VPC address: what the engine listens on
    external_ip: str | None
    provisioning_model: ProvisioningModel | None  # None: Compute's default (STANDARD)
    max_run_seconds: int  # scheduling.maxRunDuration; 0 when unset
    metadata: dict[str, str] = field(default_factory=dict)
    metadata_fingerprint: str = ""  # setMetadata's compare-and-swap token
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    last_start: float | None = None  # epoch seconds of lastStartTimestamp
    last_stop: float | None = None

    @property
    def spot(self) -> bool:
        return self.provisioning_model == "SPOT"

    @classmethod
    def from_proto(cls, inst: Any, zone: str) -> Instance:
        """The view of a `compute_v1.Instance`."""
        nic = inst.network_interfaces[0] if inst.network_interfaces else None
        access = nic.access_configs[0] if nic is not None and nic.access_configs else None
        sched = inst.scheduling
        duration = sched.max_run_duration
        return cls(
            id=str(inst.id), name=inst.name, zone=zone, status=cast(Status, inst.status),
            machine_type=(inst.machine_type or "").rsplit("/", 1)[-1],
            internal_ip=(nic.network_i_p or None) if nic is not None else None,
            external_ip=(access.nat_i_p or None) if access is not None else None,
            provisioning_model=cast(ProvisioningModel, sched.provisioning_model or None),
            max_run_seconds=int(duration.seconds) if duration else 0,
            metadata={i.key: i.value for i in inst.metadata.items},
            metadata_fingerprint=inst.metadata.fingerprint,
            service_account=(inst.service_accounts[0].email if inst.service_accounts
                             else None),
            labels=dict(inst.labels),
            last_start=timestamp(inst.last_start_timestamp),
            last_stop=timestamp(inst.last_stop_timestamp))
