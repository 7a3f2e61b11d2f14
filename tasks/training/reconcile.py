"""Manifests that do not lie: a job whose run is gone is marked so.

A training job writes its manifest as it goes (queued → … → running → done). When its process
dies without a word — the node preempted, kill -9, the machine lost — the manifest stays
`running` forever. At the start of each nightly and each training run, every unfinished
manifest is checked against what ran it:

- its Prefect flow run: Crashed or Failed → `failed`, Cancelled → `cancelled`, Completed
  (the run ended without finishing the job) → `failed`, not found on the API → `failed`;
- its owning process, when it ran on this host: a flow run the API still calls Running whose
  process is gone (a kill -9 under a server without a heartbeat/lease reaper) → `failed`.

Each reconciled manifest gets the reason in `message`. Nothing here deletes anything: the
checkpoints stay, and the next run of the same data resumes from them.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from tasks.records import FINAL, AdapterManifest, JobState, Owner
from tasks.shared.processes import owner_alive, start_ticks
from tasks.training.registry import now

log = logging.getLogger(__name__)

# Prefect state types that mean the run is over (prefect.client.schemas.objects.StateType).
ENDED: dict[str, JobState] = {"CRASHED": "failed", "FAILED": "failed", "CANCELLED": "cancelled",
         "COMPLETED": "failed"}
WHY = {
    "CRASHED": "its flow run crashed — the node was preempted or stopped, or the process was "
               "killed",
    "FAILED": "its flow run failed without updating the manifest",
    "CANCELLED": "its flow run was cancelled",
    "COMPLETED": "its flow run completed without finishing the job",
}


@dataclass(frozen=True)
class Reconciled:
    name: str
    was: str
    now: JobState
    reason: str


def this_process() -> Owner:
    return Owner(host=socket.gethostname(), pid=os.getpid(), started=start_ticks(os.getpid()))


def owner_gone(owner: Owner | None, host: str | None = None) -> bool:
    """True when `owner` ran on this host and that process no longer exists (a pid reused by
    another process counts as gone: its start time differs)."""
    if owner is None or owner.host != (host or socket.gethostname()):
        return False
    return not owner_alive(owner.pid, owner.started)


def _flow_run_state(flow_run_id: str) -> tuple[str, str] | None:
    """(state type, message) of a flow run; ("MISSING", …) when the API does not know it;
    None when the API cannot be asked (then nothing is reconciled on its word)."""
    try:
        run_id = UUID(flow_run_id)
    except ValueError:
        return "MISSING", ""
    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
    except ObjectNotFound:
        return "MISSING", ""
    except Exception as e:  # noqa: BLE001 - no API, no verdict: leave the manifest as it is
        log.warning("cannot read flow run %s to reconcile its manifest: %s", flow_run_id, e)
        return None
    if run.state is None:
        return None
    return run.state.type.value, run.state.message or ""


def verdict(m: AdapterManifest, state: tuple[str, str] | None, gone: bool
            ) -> tuple[JobState, str] | None:
    """(new job state, reason) for an unfinished manifest, or None to leave it."""
    if state is not None:
        kind, message = state
        if kind == "MISSING":
            return "failed", (f"its flow run {m.flow_run_id} is not on the Prefect API (deleted, "
                              "or recorded against another server)")
        if kind in ENDED:
            detail = f" ({message})" if message else ""
            return ENDED[kind], f"{WHY[kind]}{detail}"
    if gone and m.owner is not None:
        return "failed", (f"its process {m.owner.pid} on {m.owner.host} is gone (killed or "
                          "crashed) while the job was "
                          f"{m.state}")
    return None


def reconcile(manifests: Iterable[AdapterManifest], write: Callable[[AdapterManifest], Any],
              current_flow_run: str | None = None,
              read_state: Callable[[str], tuple[str, str] | None] = _flow_run_state,
              finished: str | None = None) -> list[Reconciled]:
    """Mark every unfinished manifest whose run is gone; write each change with `write`;
    return what changed (the callers log it). `current_flow_run`: the caller's own run, never
    reconciled."""
    out = []
    for m in manifests:
        if m.state in FINAL or (current_flow_run and m.flow_run_id == current_flow_run):
            continue
        state = read_state(m.flow_run_id) if m.flow_run_id else None
        decision = verdict(m, state, owner_gone(m.owner))
        if decision is None:
            continue
        new, reason = decision
        was = m.state
        m.advance(new, finished=finished or now(),
                  message=f"reconciled: {reason}; was {was}"
                  + (f" at step {m.step}/{m.steps}" if m.steps else ""))
        write(m)
        out.append(Reconciled(m.name, was, new, reason))
    return out


def reconcile_store(store: Any, current_flow_run: str | None = None) -> list[Reconciled]:
    """`reconcile` over an ArtifactStore's manifests."""
    return reconcile(store.list(), store.write_manifest, current_flow_run)
