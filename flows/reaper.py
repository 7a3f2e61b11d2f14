"""The reaper: stops a node that a nightly run left up (a worker killed with SIGKILL, a crash
after the `finally` lost its 30 s of grace, a run started by hand and forgotten).

It stops the node only when no nightly flow run is active (RUNNING, PENDING or CANCELLING in
the Prefect API, other than the reaper's own run). A run that has been RUNNING for more than
`max_run_hours` is treated as stale — a process that died without reporting keeps its RUNNING
state forever, and that is exactly the case the reaper exists for. Schedule it e.g. hourly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run as current_run

from blocks.gce import GceCompute
from blocks.profile import load_profile

ACTIVE = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]


def active_nightly_runs(exclude: str | None = None, flow_name: str = "nightly",
                        max_run_hours: float = 12.0) -> tuple[list[dict[str, Any]], list[dict]]:
    """(active, stale) nightly flow runs from the Prefect API, each as {id, name, state,
    start_time}. `exclude`: a flow run id to leave out (the caller's own)."""
    run_filter = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE)))
    if exclude:
        run_filter.id = FlowRunFilterId(not_any_=[exclude])  # type: ignore[list-item]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                     flow_run_filter=run_filter)
    now = datetime.now(UTC)
    active, stale = [], []
    for r in runs:
        started = r.start_time or (r.state.timestamp if r.state else None)
        info = {"id": str(r.id), "name": r.name, "state": r.state_type.value if r.state_type
                else None, "start_time": started.isoformat() if started else None}
        age_h = (now - started).total_seconds() / 3600 if started else 0.0
        if r.state_type == StateType.RUNNING and age_h > max_run_hours:
            stale.append(info)
        else:
            active.append(info)
    return active, stale


@flow(name="node-reaper")
def reaper(profile: str, max_run_hours: float = 12.0) -> dict[str, Any]:
    """Stop the profile's node if it is up and no nightly run is using it; return what was done."""
    logger = get_run_logger()
    cfg = load_profile(profile)
    active, stale = active_nightly_runs(exclude=current_run.get_id(), max_run_hours=max_run_hours)
    result: dict[str, Any] = {"profile": cfg.name, "active_runs": active, "stale_runs": stale}
    if active:
        result["action"] = "skipped"
        result["reason"] = f"{len(active)} nightly run(s) active: " + \
            ", ".join(f"{r['name']} ({r['state']})" for r in active)
        logger.info("reaper: %s", result["reason"])
        return result
    compute = cfg.compute
    if isinstance(compute, GceCompute):
        up = compute.running_nodes()
        result["found"] = up
        if not up:
            result["action"] = "none"
            logger.info("reaper: node is stopped; nothing to do")
            return result
        result["stopped_zones"] = compute.stop()
        result["action"] = "stopped"
        logger.warning("reaper: stopped node %s left up (%s) with no nightly run active",
                       compute.instance, up)
        return result
    if compute.inference_running():
        compute.stop()
        result["action"] = "stopped"
        result["found"] = {"local": "inference server running"}
        logger.warning("reaper: stopped a local inference server left running")
    else:
        result["action"] = "none"
    return result
