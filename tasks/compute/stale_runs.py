"""Node runs nobody is waiting for, cancelled before the node boots again.

A nightly submits each bucket's training as a `train/node` flow run (tasks/compute/node.py,
`run_on_node`) and the node's Prefect worker takes it once the node is up. When the orchestrator
dies first (its VM stops, the process is killed), the run stays in the API — Scheduled, later
Late, or AwaitingRetry, Pending or Running — and the node's worker, started again at the next
boot, picks it up: the night trains yesterday's data first, beside the inference server.

Who can own a node run: only the nightly run that submitted it (the outermost flow run above
it: run_deployment records its caller as the node run's parent task run, in the nightly or in a
subflow of it), and only while that nightly holds the `nightly` slot — it takes the slot at its
start and submits node runs only while it holds it (flows/nightly.py, tasks/shared/slots.py). So a
node run whose nightly is final (Completed, Failed, Cancelled, Crashed), gone, or absent
(submitted by hand) has no owner. A nightly still Running may be a dead process that never
reported: when the caller holds the `nightly` slot itself (the nightly at its start), no other
nightly can be using the node, so every other nightly's runs are stale; otherwise a nightly
still Running counts as alive while anyone holds the slot.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled

from tasks.records import StaleNodeRun
from tasks.shared.slots import NIGHTLY_LIMIT, active_slots

# Not final, so a worker may still take or keep running them. SCHEDULED covers Scheduled, Late
# and AwaitingRetry; CANCELLING is a cancel no worker is left to carry out; PAUSED waits for a
# resume that no one will send.
OPEN = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
        StateType.CANCELLING]


def cancel_stale_node_runs(deployment: str = "train/node", exclude: set[str] | None = None, *,
                           holding_slot: bool = False,
                           logger: Any = None) -> list[StaleNodeRun]:
    """Set Cancelled every open run of `deployment` that no live nightly owns (module
    docstring), with a message naming why. `exclude`: flow run ids to leave alone — a node run
    whose own id, or the id of a flow run above it, is in it (the caller's own nightly). `holding_slot`: the
    caller holds the `nightly` slot. Returns each cancelled run (id, name, was, reason); none
    when the deployment does not exist (a local profile)."""
    log = logger or logging.getLogger("slm_nightly.stale_runs")
    keep = {str(x) for x in exclude or ()}
    with get_client(sync_client=True) as client:
        try:
            dep = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            return []
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[dep.id]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=OPEN))))
        runs = [r for r in runs if str(r.id) not in keep]
        slot_held = None if holding_slot else active_slots(NIGHTLY_LIMIT) > 0
        cancelled: list[StaleNodeRun] = []
        for run in runs:
            chain = _ancestors(client, run)
            if any(str(a.id) in keep for a in chain):
                continue
            # the outermost run is the nightly: it owns the node run while it lives
            reason = _why_stale(chain[-1] if chain else None, holding_slot, bool(slot_held))
            if reason is None:
                continue
            was = (run.state.name if run.state else None) or "unknown"
            client.set_flow_run_state(run.id, Cancelled(
                message=f"stale node run cancelled at nightly start: {reason}"), force=True)
            log.warning("stale node run %s (%s, was %s) cancelled: %s", run.name, run.id, was,
                        reason)
            cancelled.append(StaleNodeRun(id=str(run.id), name=str(run.name), was=was,
                                          reason=reason))
    return cancelled


def _why_stale(parent: Any, holding_slot: bool, slot_held: bool) -> str | None:
    """Why a node run with this parent flow run has no owner; None while one may own it."""
    if parent is None:
        return "no nightly run owns it (submitted by hand, or its nightly run was deleted)"
    what = f"its nightly run {parent.name} ({parent.id})"
    state = parent.state
    if state is None or state.is_final():
        return f"{what} is {state.name if state else 'without a state'}"
    if holding_slot:
        return (f"{what} is still {state.name} in the API but does not hold the nightly slot "
                "(this run does): its process died without reporting")
    if not slot_held:
        return (f"{what} is still {state.name} in the API but no run holds the nightly slot: "
                "its process died without reporting")
    return None


def _ancestors(client: Any, run: Any, depth: int = 8) -> list[Any]:
    """The flow runs above a node run, nearest first: run_deployment records its caller as the
    flow run of the node run's parent task run (the nightly, or a subflow of it)."""
    chain: list[Any] = []
    while run.parent_task_run_id and len(chain) < depth:
        try:
            task = client.read_task_run(run.parent_task_run_id)
            run = client.read_flow_run(task.flow_run_id) if task.flow_run_id else None
        except ObjectNotFound:  # deleted: the chain ends here
            break
        if run is None:
            break
        chain.append(run)
    return chain
