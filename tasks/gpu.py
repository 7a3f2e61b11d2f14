"""GPU exclusivity and run liveness: Prefect global concurrency limits, strict, leased.

`gpu` (one slot): the nightly flow holds it from inference-up to inference-down, every training
run holds it while it trains, so an ad-hoc `prefect deployment run train/…` never overlaps the
nightly one (it waits for the slot).

`nightly` (one slot): a nightly run holds it from its start to the end of its `finally` (node
stopped). The node is only ever used by the holder, so the reaper may stop a node whenever the
slot is free, and a nightly that holds it may stop a node it did not start (one left up by a
dead run). A second nightly waits for the slot.

Slots are leases: the holding process renews its lease every ~45 s; a holder killed with -9
stops renewing and the server's repossessor frees the slot when the lease runs out —
LEASE_SECONDS (60 s, the server's minimum) plus the repossessor's loop (15 s by default,
PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS). Nothing else frees it: Prefect 3.9 has no
API to list a limit's leases, so the reaper cannot tell which lease was the dead run's; it
waits for the expiry like everyone else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

GPU_LIMIT = "gpu"
NIGHTLY_LIMIT = "nightly"
LEASE_SECONDS = max(60.0, float(os.environ.get("SLM_LEASE_SECONDS", "60")))  # server min 60


def ensure_limit(name: str, slots: int = 1) -> bool:
    """Create the limit if it is missing (idempotent). True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            return False
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=slots, active=True))
        except ObjectAlreadyExists:  # created by a concurrent run
            return False
        return True


def ensure_gpu_limit(slots: int = 1) -> bool:
    return ensure_limit(GPU_LIMIT, slots)


def active_slots(name: str = GPU_LIMIT) -> int:
    """Slots in use now (0 when the limit does not exist yet)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return int(client.read_global_concurrency_limit_by_name(name).active_slots)
        except ObjectNotFound:
            return 0


def _holder() -> object | None:
    """This flow run as the lease holder (shown by the server; None outside a run)."""
    from uuid import UUID

    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id)) if run_id else None


@contextmanager
def _slot(name: str, timeout_seconds: float | None) -> Iterator[None]:
    from prefect.concurrency.sync import concurrency

    ensure_limit(name)
    with concurrency(name, occupy=1, strict=True, timeout_seconds=timeout_seconds,
                     lease_duration=LEASE_SECONDS, holder=_holder()):  # type: ignore[arg-type]
        yield


@contextmanager
def gpu_slot(timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold the `gpu` slot for the block; waits for it, creates the limit if missing."""
    with _slot(GPU_LIMIT, timeout_seconds):
        yield


@contextmanager
def nightly_slot(timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold the `nightly` slot (this run owns the node) for the block."""
    with _slot(NIGHTLY_LIMIT, timeout_seconds):
        yield
