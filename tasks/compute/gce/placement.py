"""Where a GCE node start is tried, in order: pure functions of the block's policy (no
clients), so the order is unit-tested exactly (tests/unit/compute/test_placement.py).

The policy: every zone (primary, then `fallback_zones` in order) with the configured
provisioning model; then, for a spot policy with `on_demand_fallback`, every zone again
on-demand. A start stops at the first (zone, model) that comes up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

Provisioning = Literal["spot", "on-demand"]  # the profile's words
ProvisioningModel = Literal["SPOT", "STANDARD"]  # Compute's
MODEL: dict[Provisioning, ProvisioningModel] = {"spot": "SPOT", "on-demand": "STANDARD"}
# Why one placement did not come up when the next one may: the first three from a start's
# errors (start_failure), the rest from the lifecycle (tasks/compute/gce/lifecycle.py)
StartFailureKind = Literal["stocked out", "quota exceeded", "unsupported", "server error",
                           "rate limited", "connection", "preempted while booting", "skipped",
                           "state", "scheduling"]

# Compute's error codes for "no capacity in this zone" (a start operation's errors, or the
# reason of a refused call); a stockout sends the start on to the next placement.
STOCKOUT_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED",
                            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                            "STOCKOUT", "RESOURCE_POOL_EXHAUSTED"})
STOCKOUT_TEXT = "does not have enough resources"  # the message Compute gives with them
# Other start errors another placement may not repeat: a GPU quota is per region and per
# provisioning model (PREEMPTIBLE_NVIDIA_L4_GPUS for spot, NVIDIA_L4_GPUS for on-demand), as an
# operation error QUOTA_EXCEEDED or a refused call's reason quotaExceeded; UNSUPPORTED_OPERATION
# when the zone does not offer what the instance asks for (cloud.google.com/compute/docs/
# troubleshooting/troubleshooting-resource-availability; …/docs/gpus/gpu-regions-zones).
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
UNSUPPORTED_CODES = frozenset({"UNSUPPORTED_OPERATION"})


def placements(zones: Sequence[str], provisioning: Provisioning,
               on_demand_fallback: bool) -> list[tuple[str, ProvisioningModel]]:
    """(zone, provisioning model as Compute names it: SPOT | STANDARD) in the order a start
    tries them."""
    models = [MODEL[provisioning]]
    if provisioning == "spot" and on_demand_fallback:
        models.append(MODEL["on-demand"])
    return [(zone, model) for model in models for zone in zones]


def is_stockout(errors: Iterable[tuple[str, str]]) -> bool:
    """Whether (code, message) errors of a start say the zone has no capacity."""
    return any(code in STOCKOUT_CODES or STOCKOUT_TEXT in message for code, message in errors)


def start_failure(errors: Iterable[tuple[str, str]]) -> StartFailureKind | None:
    """Why a start failed, from its (code, message) errors, when the next placement may do
    better: "stocked out", "quota exceeded" or "unsupported"; None otherwise."""
    errors = list(errors)
    if is_stockout(errors):
        return "stocked out"
    if any(code in QUOTA_CODES for code, _ in errors):
        return "quota exceeded"
    if any(code in UNSUPPORTED_CODES for code, _ in errors):
        return "unsupported"
    return None


def region_of(zone: str) -> str:
    """The region of a zone: us-central1-a → us-central1."""
    return zone.rsplit("-", 1)[0]


def provisioning_name(model: ProvisioningModel) -> Provisioning:
    """Compute's provisioning model (SPOT | STANDARD) in the profile's words."""
    return "spot" if model == "SPOT" else "on-demand"
