"""The reaper's policy: it stops the nodes (each of GceCompute.nodes) a nightly run left up (a worker
killed with SIGKILL, a crash after the `finally` lost its 30 s of grace, a run started by hand
and forgotten).

Who may be using the node: only the holder of the `nightly` concurrency slot (tasks/shared/slots.py). A
nightly run holds that slot, as a lease it keeps renewing, from its start until its node is
stopped; a process killed with -9 stops renewing and the slot frees itself within ~75 s. So:

- slot held → some nightly run is alive and owns the node: leave it (`skipped`);
- slot free → a nightly run in the API is still "active" only while it is PENDING or
  CANCELLING (its `finally` is stopping the node), or RUNNING for less than
  `startup_grace_seconds` (it has not taken the slot yet). A RUNNING run past that grace without
  the slot is `orphaned`: its process died without reporting, and the run keeps its RUNNING
  state forever. A run RUNNING for more than `max_run_hours` is `stale` whatever the slot says.
- nothing active → the node is stopped if it is up.

`reap()` is also called by every nightly run at its start, while it holds the slot: then no
other run can be using the node, and a node found up is one a dead run left behind.
The `node-reaper` flow (flows/reaper.py) runs it on a schedule, e.g. hourly (prefect.yaml).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

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

from tasks.records import ReaperResult
from tasks.shared.slots import NIGHTLY_LIMIT, active_slots

if TYPE_CHECKING:
    from tasks.profile import Profile

ACTIVE = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]


def active_nightly_runs(exclude: str | None = None, flow_name: str = "nightly",
                        max_run_hours: float = 12.0) -> tuple[list[dict[str, Any]], list[dict]]:
    """(active, stale) nightly flow runs from the Prefect API, each as {id, name, state,
    start_time, age_seconds}. `exclude`: a flow run id to leave out (the caller's own)."""
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
        age_s = (now - started).total_seconds() if started else 0.0
        info = {"id": str(r.id), "name": r.name, "state": r.state_type.value if r.state_type
                else None, "start_time": started.isoformat() if started else None,
                "age_seconds": round(age_s, 1)}
        if r.state_type == StateType.RUNNING and age_s / 3600 > max_run_hours:
            stale.append(info)
        else:
            active.append(info)
    return active, stale


def reap(cfg: Profile, *, exclude: str | None = None, holding_slot: bool = False,
         max_run_hours: float = 12.0, startup_grace_seconds: float = 300.0,
         logger: Any = None) -> ReaperResult:
    """Stop the profile's nodes that are up if no live nightly run owns them (module docstring).
    `holding_slot`: the caller is a nightly run holding the `nightly` slot. Returns a record of
    what was found and done (`action`: skipped | none | stopped)."""
    log = logger or logging.getLogger("slm_nightly.reaper")
    active, stale = active_nightly_runs(exclude=exclude, max_run_hours=max_run_hours)
    slot_held = active_slots(NIGHTLY_LIMIT) > 0
    result: dict[str, Any] = {"profile": cfg.name, "nightly_slot_held": slot_held,
                              "active_runs": [], "orphaned_runs": [], "stale_runs": stale}
    for r in active:
        if holding_slot:
            # we own the node: any other run is waiting for the slot or dead
            result["orphaned_runs" if r["state"] == "RUNNING" else "active_runs"].append(r)
        elif r["state"] == "RUNNING" and not slot_held and r["age_seconds"] > startup_grace_seconds:
            result["orphaned_runs"].append(r)
        else:
            result["active_runs"].append(r)
    if not holding_slot and (slot_held or result["active_runs"]):
        result["action"] = "skipped"
        result["reason"] = "the nightly slot is held by a live run" if slot_held else \
            f"{len(result['active_runs'])} nightly run(s) active: " + ", ".join(
                f"{r['name']} ({r['state']})" for r in result["active_runs"])
        log.info("reaper: %s", result["reason"])
        return ReaperResult.model_validate(result)
    if result["orphaned_runs"]:
        log.warning("reaper: nightly run(s) with no live process: %s", ", ".join(
            f"{r['name']} ({r['id']})" for r in result["orphaned_runs"]))
    # Every node of the profile (GceCompute.nodes): a dead run leaves all it booted up. A
    # node past the first is named "(node i)" beside its zones; each node is read and stopped
    # on its own, so one that cannot be stopped does not leave the others up.
    result["found"], result["stopped_zones"] = {}, []
    errors: list[BaseException] = []
    for i, node in enumerate(cfg.nodes, 1):
        tag = "" if i == 1 else f" (node {i})"
        try:
            up = node.running()
            result["found"].update({f"{where}{tag}": status for where, status in up.items()})
            if up:
                result["stopped_zones"] += [f"{where}{tag}" for where in node.stop()]
        except Exception as e:  # noqa: BLE001 - the next node is stopped all the same
            log.error("reaper: node %d of profile %s: %s: %s", i, cfg.name, type(e).__name__, e)
            errors.append(e)
    if errors:
        raise errors[0]
    if not result["found"]:
        del result["stopped_zones"]
        result["action"] = "none"
        log.info("reaper: %s stopped; nothing to do",
                 "node is" if len(cfg.nodes) == 1 else f"all {len(cfg.nodes)} nodes are")
        return ReaperResult.model_validate(result)
    result["action"] = "stopped"
    log.warning("reaper: stopped the node(s) of profile %s left up (%s) with no nightly run "
                "using them", cfg.name, result["found"])
    return ReaperResult.model_validate(result)
