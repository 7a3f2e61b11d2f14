"""What a GCE node cost (tasks/compute/gce/cost.py), with values worked out by hand: seconds ×
rate / 3600."""

from typing import Any

import pytest

from tasks.compute.gce.cost import total_usage, zone_usage
from tasks.compute.gce.instance import Instance, timestamp

RATES = {"spot_usd_per_hour": 0.28, "on_demand_usd_per_hour": 0.71}


def _inst(*, status: Any, last_start: float | None, last_stop: float | None,
          spot: bool) -> Instance:
    """An instance as Compute lists it: what zone_usage reads of it, the rest any value."""
    return Instance(id="1", name="slm-node", zone="us-central1-a", status=status,
                    machine_type="g2-standard-4", internal_ip=None, external_ip=None,
                    provisioning_model="SPOT" if spot else "STANDARD", max_run_seconds=0,
                    last_start=last_start, last_stop=last_stop)


def test_a_stopped_spot_span_costs_its_seconds_at_the_spot_rate() -> None:
    used = zone_usage(_inst(status="TERMINATED", last_start=1000.0, last_stop=2800.0, spot=True),
                      since=1000.0, now=9000.0, **RATES)
    assert used is not None and used.model_dump() == {
        "running_seconds": 1800.0, "provisioning": "spot", "usd_per_hour": 0.28,
        "estimated_usd": 0.14, "status": "TERMINATED"}


def test_a_node_still_up_is_counted_to_now_at_the_on_demand_rate() -> None:
    # the last stop is from an earlier span (older than the last start): up until now
    used = zone_usage(_inst(status="RUNNING", last_start=1000.0, last_stop=900.0, spot=False),
                      since=0.0, now=4600.0, **RATES)
    assert used is not None
    assert (used.running_seconds, used.estimated_usd, used.provisioning) == \
        (3600.0, 0.71, "on-demand")
    # booting (STAGING) is billed like RUNNING, even with a newer stop recorded
    staging = zone_usage(_inst(status="STAGING", last_start=1000.0, last_stop=1500.0, spot=True),
                         since=0.0, now=1360.0, **RATES)
    assert staging is not None and staging.running_seconds == 360.0
    # no stop recorded yet: counted to now
    fresh = zone_usage(_inst(status="TERMINATED", last_start=1000.0, last_stop=None, spot=True),
                       since=0.0, now=1100.0, **RATES)
    assert fresh is not None and fresh.running_seconds == 100.0


@pytest.mark.parametrize(("last_start", "counted"), [
    (None, False),      # never started
    (998.5, False),     # before this run (more than 1 s of clock slack)
    (999.0, True),      # within the 1 s slack
    (1000.0, True),
])
def test_only_spans_that_began_this_run_count(last_start: float | None, counted: bool) -> None:
    used = zone_usage(_inst(status="TERMINATED", last_start=last_start, last_stop=1200.0, spot=True),
                      since=1000.0, now=2000.0, **RATES)
    assert (used is not None) is counted


def test_the_zones_add_up() -> None:
    zones = {"a": zone_usage(_inst(status="TERMINATED", last_start=0.0, last_stop=1800.0, spot=True),
                             since=0.0, now=0.0, **RATES),
             "b": zone_usage(_inst(status="TERMINATED", last_start=0.0, last_stop=3600.0, spot=False),
                             since=0.0, now=0.0, **RATES)}
    total = total_usage({k: v for k, v in zones.items() if v is not None})
    assert (total.running_seconds, total.gpu_hours, total.estimated_usd) == (5400.0, 1.5, 0.85)
    assert total.zones == zones and total.note.startswith("estimate from lastStart")
    empty = total_usage({})
    assert (empty.running_seconds, empty.gpu_hours, empty.estimated_usd) == (0, 0, 0)


def test_compute_timestamps() -> None:
    midnight = 1795996800.0  # 2026-11-30T00:00:00Z
    assert timestamp("2026-11-30T00:00:00Z") == midnight
    assert timestamp("2026-11-29T16:00:00.000-08:00") == midnight
    assert timestamp("2026-11-30T00:00:01.500+00:00") == midnight + 1.5
    assert timestamp("") is None and timestamp(None) is None
