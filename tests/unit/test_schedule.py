"""prefect.yaml's cron schedules, run through Prefect's own schedule code across the
daylight-saving changes: each nightly fires exactly once every calendar day, the reaper once
every hour with no gap and no repeat.

The runs are those Prefect's scheduler service would insert: it refills each deployment from
`now` again and again (prefect/server/models/deployments.py, `_generate_scheduled_flow_runs`,
Prefect 3.9.1), and a run whose time it already inserted is dropped by its idempotency key — so
the set of times over many refills, not one `get_dates` call, is what runs.

Measured with Prefect 3.9.1 (this file's helpers, refills every 30 min): `0 1 * * *`
Europe/London also fires once per London date — on the spring change day at 02:00 BST (the first
time after the missing hour), in autumn at the first 01:00 only. Prefect's hourly `30 * * * *`
Europe/London fires at the first 01:30 only in autumn: a two-hour gap, which the reaper test
catches; UTC avoids both, whatever a later scheduler's DST policy.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from prefect.server.schemas.schedules import CronSchedule

ROOT = Path(__file__).resolve().parents[2]
LONDON = ZoneInfo("Europe/London")
UTC = dt.UTC
# The next three changes in London (01:00 UTC each): autumn 2026, spring 2027, autumn 2027.
CHANGES = [dt.date(2026, 10, 25), dt.date(2027, 3, 28), dt.date(2027, 10, 31)]
REFILL = dt.timedelta(minutes=30)


def deployment_schedules(name: str) -> list[dict[str, Any]]:
    """The schedules of the deployment `flow/name` in prefect.yaml (flow from the entrypoint's
    file: nightly, reaper, …)."""
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flow, _, dep = name.partition("/")
    found = [d for d in doc["deployments"] if d["name"] == dep
             and Path(d["entrypoint"].partition(":")[0]).stem == flow]
    assert len(found) == 1, f"{name}: {len(found)} deployments in prefect.yaml"
    return list(found[0].get("schedules") or [])


def scheduled_times(schedule: dict[str, Any], first: dt.datetime,
                    last: dt.datetime) -> list[dt.datetime]:
    """The distinct UTC times Prefect's scheduler would insert between `first` and `last` when
    it refills every REFILL (three runs ahead each time, as its min_runs default does)."""
    cron = CronSchedule(**{k: v for k, v in schedule.items() if k != "active"})
    times: set[dt.datetime] = set()

    async def refill_all() -> None:
        now = first
        while now < last:
            for d in await cron.get_dates(n=3, start=now):
                times.add(d.astimezone(UTC))
            now += REFILL

    asyncio.run(refill_all())
    return sorted(t for t in times if first <= t < last)


def window(change: dt.date) -> tuple[dt.datetime, dt.datetime, list[dt.date]]:
    """Three whole London days around a change day, and those dates."""
    days = [change + dt.timedelta(days=k) for k in (-1, 0, 1)]
    first = dt.datetime.combine(days[0], dt.time(), LONDON).astimezone(UTC)
    last = dt.datetime.combine(days[-1] + dt.timedelta(days=1), dt.time(), LONDON).astimezone(UTC)
    return first, last, days


@pytest.mark.parametrize("deployment", ["nightly/production", "nightly/local"])
@pytest.mark.parametrize("change", CHANGES, ids=str)
def test_a_nightly_runs_exactly_once_every_day_across_the_clock_change(
        deployment: str, change: dt.date) -> None:
    (schedule,) = deployment_schedules(deployment)
    first, last, days = window(change)
    runs = scheduled_times(schedule, first, last)
    per_london_day = Counter(t.astimezone(LONDON).date() for t in runs)
    assert per_london_day == dict.fromkeys(days, 1), [t.isoformat() for t in runs]


@pytest.mark.parametrize("change", CHANGES, ids=str)
def test_the_reaper_runs_every_hour_without_gap_or_repeat(change: dt.date) -> None:
    (schedule,) = deployment_schedules("reaper/production")
    first, last, _ = window(change)
    runs = scheduled_times(schedule, first, last)
    gaps = Counter(int((b - a).total_seconds()) for a, b in zip(runs, runs[1:], strict=False))
    hours = int((last - first).total_seconds()) // 3600  # 71 or 73 across a change
    assert (len(runs), gaps) == (hours, {3600: hours - 1}), [t.isoformat() for t in runs]


def test_the_production_schedules_are_deployed_paused() -> None:
    """Active only once preflight and the smoke have passed: the guide resumes them
    (docs/operator-gcp.md, section 9; tests/integration/test_operator_guide.py runs it)."""
    assert [s["active"] for s in deployment_schedules("nightly/production")] == [False]
    assert [s["active"] for s in deployment_schedules("reaper/production")] == [False]
