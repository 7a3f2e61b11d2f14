"""What a GCE node cost: pure arithmetic on the instances' lastStart/lastStopTimestamp and the
block's hourly rates (unit-tested with exact values in tests/unit/compute/test_cost.py)."""

from __future__ import annotations

from tasks.compute.gce.instance import UP, Instance
from tasks.records import NodeUsage, ZoneSpan

NOTE = ("estimate from lastStart/lastStopTimestamp × the block's hourly rates; disk and egress "
        "not included")


def zone_usage(inst: Instance, *, since: float, now: float, spot_usd_per_hour: float,
               on_demand_usd_per_hour: float) -> ZoneSpan | None:
    """The most recent RUNNING span of one instance that began at or after `since` (1 s of
    clock slack), and its cost; None when it did not run since then. A node still up (or one
    whose last stop is older than its last start) is counted up to `now`."""
    status, last_start, last_stop, spot = inst.status, inst.last_start, inst.last_stop, inst.spot
    if last_start is None or last_start < since - 1.0:
        return None
    up = status in UP or last_stop is None or last_stop < last_start
    seconds = max(0.0, (now if up else last_stop or now) - last_start)
    rate = spot_usd_per_hour if spot else on_demand_usd_per_hour
    return ZoneSpan(running_seconds=round(seconds, 3),
                    provisioning="spot" if spot else "on-demand", usd_per_hour=rate,
                    estimated_usd=round(seconds / 3600.0 * rate, 6), status=status)


def total_usage(zones: dict[str, ZoneSpan]) -> NodeUsage:
    """The node's usage this run: the zones' spans added up (a start → preemption → restart
    in another zone counts both)."""
    seconds = sum(z.running_seconds for z in zones.values())
    usd = sum(z.running_seconds / 3600.0 * z.usd_per_hour for z in zones.values())
    return NodeUsage(running_seconds=round(seconds, 3), gpu_hours=round(seconds / 3600.0, 6),
                     estimated_usd=round(usd, 6), zones=zones, note=NOTE)
