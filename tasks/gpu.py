"""GPU exclusivity: one Prefect global concurrency limit, `gpu`, strict, one slot.

The nightly flow holds it from inference-up to inference-down, every training run holds it
while it trains, so an ad-hoc `prefect deployment run train/…` never overlaps the nightly one
(it waits for the slot). Slots are leased: a holder killed with -9 loses its slot when the
lease runs out instead of wedging the card forever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

GPU_LIMIT = "gpu"
LEASE_SECONDS = 60.0


def ensure_gpu_limit(slots: int = 1) -> bool:
    """Create the `gpu` limit if it is missing (idempotent). True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(GPU_LIMIT)
            return False
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=slots, active=True))
        except ObjectAlreadyExists:  # created by a concurrent run
            return False
        return True


def active_slots() -> int:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return int(client.read_global_concurrency_limit_by_name(GPU_LIMIT).active_slots)


@contextmanager
def gpu_slot(timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold the `gpu` slot for the block; waits for it, creates the limit if missing."""
    from prefect.concurrency.sync import concurrency

    ensure_gpu_limit()
    with concurrency(GPU_LIMIT, occupy=1, strict=True, timeout_seconds=timeout_seconds,
                     lease_duration=LEASE_SECONDS):
        yield
