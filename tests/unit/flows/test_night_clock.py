"""The night's one deadline (tasks/night/clock.py NightClock): what each step gets, with the clock
pinned. The figures are the issue's: a 4-hour night, 7200 s phase timeouts."""

from __future__ import annotations

import pytest

import tasks.night.clock as clock_mod
from tasks.night.clock import NightClock
from tasks.night.fleet import merge_usage
from tasks.records import NodeUsage


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [1_000_000.0]
    monkeypatch.setattr(clock_mod.time, "time", lambda: t[0])
    return t


def test_each_step_gets_its_own_timeout_or_what_is_left(now: list[float]) -> None:
    clock = NightClock(14_400)
    assert clock.give(600) == 600  # the boot wait: its own timeout
    now[0] += 900  # the boot and readiness took 15 minutes
    # phase 1: 13,500 s left; phase 2's share set aside: its 7200 s, at most half → 6750 s
    assert clock.phase1(7200, 7200) == 6750
    now[0] += 6750
    assert clock.give(7200) == 6750  # phase 2: what is left, under its timeout
    now[0] += 6550
    assert clock.give(7200) == 200
    now[0] += 500
    assert clock.give(7200) == 0 and clock.left() == 0


def test_phase_2_is_set_aside_at_most_half_of_what_is_left(now: list[float]) -> None:
    clock = NightClock(20_000)
    now[0] += 4000  # 16,000 s left: phase 2's whole 7200 is set aside; phase 1 its own 7200
    assert clock.phase1(7200, 7200) == 7200
    now[0] += 6000  # 10,000 s left: 7200 for phase 2 would leave phase 1 2800; half → 5000
    assert clock.phase1(7200, 7200) == 5000
    assert clock.phase1(3000, 7200) == 3000
    assert NightClock(100_000).phase1(7200, 7200) == 7200  # a long night: phase 1's own timeout


def test_usage_of_several_nodes_adds_up_and_keeps_each_zone() -> None:
    spot = {"running_seconds": 3600.0, "provisioning": "spot", "usd_per_hour": 0.28,
            "estimated_usd": 0.28, "status": "TERMINATED"}
    on_demand = {"running_seconds": 1800.0, "provisioning": "on-demand", "usd_per_hour": 0.71,
                 "estimated_usd": 0.355, "status": "RUNNING"}
    a = NodeUsage.model_validate({"running_seconds": 3600.0, "gpu_hours": 1.0,
                                  "estimated_usd": 0.28, "zones": {"us-central1-a": spot}})
    b = NodeUsage.model_validate({"running_seconds": 1800.0, "gpu_hours": 0.5,
                                  "estimated_usd": 0.355, "zones": {"us-central1-a": on_demand}})
    merged = merge_usage([a, b, None])
    assert merged is not None and merged.model_dump() == {
        "running_seconds": 5400.0, "gpu_hours": 1.5, "estimated_usd": pytest.approx(0.635),
        "zones": {"us-central1-a": spot, "us-central1-a (node 2)": on_demand},
        "note": "usage unavailable for node 3"}
    assert merge_usage([a]) is a and merge_usage([None]) is None
