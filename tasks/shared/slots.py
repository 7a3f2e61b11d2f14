"""GPU exclusivity and run liveness: Prefect global concurrency limits, strict, leased.

`gpu` (one slot): the nightly flow holds it from inference-up to inference-down, every training
run holds it while it trains, so an ad-hoc `prefect deployment run train/…` never overlaps the
nightly one (it waits for the slot).

`nightly` (one slot): a nightly run holds it from its start to the end of its `finally` (node
stopped). The node is only ever used by the holder, so the reaper may stop a node whenever the
slot is free, and a nightly that holds it may stop a node it did not start (one left up by a
dead run). A second nightly waits for the slot.

Slots are leases: the holding process renews its lease every ~45 s. A holder killed with -9
stops renewing. On `prefect server start` the repossessor frees the slot when the lease runs
out — LEASE_SECONDS (60 s, the server's minimum) plus its loop (15 s by default). The ephemeral
API that a run without PREFECT_API_URL uses has no repossessor, and keeps leases in memory: the
dead run's lease dies with its temporary server while the limit's count in the database stays
taken. Prefect 3.9 has no API to list a limit's leases, so each holder records itself — limit,
lease id, flow run, PID, process start, host — in PREFECT_HOME/slm-nightly/slots (beside the
database the slot lives in) while it holds a slot. Whoever wants a slot first takes over from
recorded holders that are gone: same host, process gone. It releases the dead lease by id when
the server still knows it, otherwise — on an ephemeral API only, where no repossessor ever
freed it — gives the slot back to the limit, and marks the dead flow run Crashed. A holder that
is alive, or on another host, is never touched: it is waited for. A holder forgets its record
only once its lease is released, so a run killed mid-release is taken over like any other.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.context import ConcurrencyContext
from prefect.concurrency.sync import concurrency
from prefect.exceptions import MissingContextError, ObjectAlreadyExists, ObjectNotFound
from prefect.logging import get_logger
from prefect.runtime import flow_run
from prefect.settings import PREFECT_HOME
from prefect.states import Crashed

from tasks.runtime import prefect_env
from tasks.shared.errors import PhaseFailed
from tasks.shared.files import locked, write_atomic
from tasks.shared.processes import owner_alive, start_ticks

GPU_LIMIT = "gpu"
NIGHTLY_LIMIT = "nightly"
LEASE_SECONDS = max(60.0, float(os.environ.get("SLM_LEASE_SECONDS", "60")))  # server min 60


def ensure_limit(name: str, slots: int = 1) -> bool:
    """Create the limit if it is missing (idempotent). True when it was created."""
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


def active_slots(name: str = GPU_LIMIT) -> int:
    """Slots in use now (0 when the limit does not exist yet)."""
    with get_client(sync_client=True) as client:
        try:
            return int(client.read_global_concurrency_limit_by_name(name).active_slots)
        except ObjectNotFound:
            return 0


def _holder() -> object | None:
    """This flow run as the lease holder (shown by the server; None outside a run)."""
    run_id = flow_run.get_id()
    return ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id)) if run_id else None


def _records() -> Path:
    return Path(PREFECT_HOME.value()) / "slm-nightly" / "slots"


def _log(message: str) -> None:
    try:
        get_run_logger().warning(message)
    except MissingContextError:
        get_logger("slm-nightly").warning(message)


def _locked(directory: Path) -> AbstractContextManager[None]:
    """One taker at a time on this machine (the lock goes with its process)."""
    return locked(directory / ".lock")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _record_holder(name: str, lease_id: UUID, api_url: str) -> Path:
    rec = {"limit": name, "lease_id": str(lease_id), "flow_run_id": flow_run.get_id(),
           "flow_run_name": flow_run.get_name(), "pid": os.getpid(),
           "process_start": start_ticks(os.getpid()), "hostname": socket.gethostname(),
           "api_url": api_url, "taken_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = _records() / f"{name}.{lease_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(rec, indent=2))
    return path


def _gone(rec: dict[str, Any]) -> bool:
    """The recorded holder's process is gone (never said of another host's)."""
    return rec.get("hostname") == socket.gethostname() and \
        not owner_alive(int(rec["pid"]), rec.get("process_start"))


def _describe(rec: dict[str, Any]) -> str:
    return (f"run {rec.get('flow_run_name') or '(no flow run)'} {rec.get('flow_run_id') or ''} "
            f"(pid {rec['pid']} on {rec['hostname']}, slot taken {rec['taken_at']})")


def _recorded(name: str) -> list[dict[str, Any]]:
    """The holder records of a limit that read whole."""
    return [r for p in sorted(_records().glob(f"{name}.*.json")) if (r := _read(p))]


def holders(name: str) -> list[str]:
    """The recorded holders of a limit, said in words (for error messages)."""
    return [_describe(r) + (": process gone" if _gone(r) else
                            ": alive" if r["hostname"] == socket.gethostname() else "")
            for r in _recorded(name)]


def _alive(name: str) -> int:
    """The recorded holders of `name` whose process runs (or who are on another host)."""
    return sum(not _gone(r) for r in _recorded(name))


def _release_dead(name: str, rec: dict[str, Any]) -> str | None:
    """Give back a dead holder's slot; mark its flow run Crashed. How it was done, or None
    when there was nothing to give back (another server's holder, or an expired lease)."""
    lease_id = UUID(rec["lease_id"])
    with get_client(sync_client=True) as client:
        run = None
        if rec.get("flow_run_id"):
            try:
                run = client.read_flow_run(UUID(rec["flow_run_id"]))
            except ObjectNotFound:  # recorded against another server's database
                pass
        try:
            client.renew_concurrency_lease(lease_id, lease_duration=LEASE_SECONDS)
            known = True
        except httpx.HTTPStatusError as e:
            if e.response.status_code not in (404, 410):
                raise
            known = False
        how = None
        if known:
            client.release_concurrency_slots_with_lease(lease_id)
            how = f"released its lease {lease_id}"
        elif run is not None and prefect_env.ephemeral_api(client) and \
                client.read_global_concurrency_limit_by_name(name).active_slots > _alive(name):
            # The lease lived in the memory of the dead run's temporary server; no repossessor
            # runs in an ephemeral API, so the limit still counts it — unless the holder died
            # after its release and before forgetting its record (_Lease): then every slot
            # counted is a live holder's, and none is given back.
            taken = datetime.fromisoformat(rec["taken_at"])
            client.release_concurrency_slots(
                [name], 1, max(1.0, (datetime.now(UTC) - taken).total_seconds()))
            how = "gave its slot back (its lease died with its temporary Prefect server)"
        if run is not None and run.state is not None and not run.state.is_final():
            client.set_flow_run_state(run.id, Crashed(
                message=f"process {rec['pid']} on {rec['hostname']} is gone (killed or crashed)"
                f"; the '{name}' slot it held was taken over"), force=True)
    return how


def take_over_dead_holders(name: str) -> list[str]:
    """Free the slots of recorded holders of `name` whose process is gone (this host only);
    returns what was said about each."""
    directory = _records()
    if not directory.is_dir():
        return []
    said = []
    with _locked(directory):
        for path in sorted(directory.glob(f"{name}.*.json")):
            rec = _read(path)
            if rec is None or not _gone(rec):
                continue
            try:
                how = _release_dead(name, rec)
            except Exception as e:  # noqa: BLE001 - kept: tried again while waiting
                _log(f"could not take over the '{name}' slot from {_describe(rec)}: {e}")
                continue
            path.unlink(missing_ok=True)
            if how:
                said.append(f"took over the '{name}' slot from {_describe(rec)}: its process is "
                            f"gone; {how}")
                _log(said[-1])
    return said


class _Lease:
    """A granted slot whose holder record is forgotten once its lease is released, not before:
    a run killed in between (a second Ctrl-C exits at once, maybe mid-release) or whose release
    fails (its temporary server already stopped) leaves the record, and the next taker gives
    the slot back. Forgotten first, such a slot stayed counted with nobody recorded, and the
    next run on an ephemeral API waited for it forever."""

    def __init__(self, acquired: AbstractContextManager[None]) -> None:
        self.acquired = acquired
        self.record: Path | None = None

    def __enter__(self) -> None:
        self.acquired.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        suppressed = self.acquired.__exit__(*exc)  # the release; raises when it fails
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        return suppressed


@contextmanager
def _slot(name: str, timeout_seconds: float | None) -> Iterator[None]:
    ensure_limit(name)
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    with ExitStack() as stack:
        # Prefect records a granted lease's id in the current ConcurrencyContext (to release it
        # if the block is cancelled); ours is the only way to learn it.
        leases = stack.enter_context(ConcurrencyContext())
        while True:  # wait in slices: a holder that dies meanwhile is taken over
            take_over_dead_holders(name)
            wait = 30.0 if deadline is None else min(30.0, max(deadline - time.monotonic(), 0.1))
            lease = _Lease(concurrency(name, occupy=1, strict=True, timeout_seconds=wait,
                                      lease_duration=LEASE_SECONDS,
                                      holder=_holder()))  # type: ignore[arg-type]
            try:
                stack.enter_context(lease)
                break
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
        if leases.cleanup_lease_ids:
            with get_client(sync_client=True) as client:
                api_url = str(client.api_url)
            lease.record = _record_holder(name, leases.cleanup_lease_ids[-1], api_url)
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


NIGHTLY_SLOT_WAIT_SECONDS = 3 * LEASE_SECONDS  # > a dead run's lease + the repossessor's loop


def held_by() -> str:
    """The `nightly` slot's recorded holders, for a message that names them."""
    return "; ".join(holders(NIGHTLY_LIMIT)) or "no holder recorded on this machine"


@contextmanager
def owning_the_node() -> Iterator[None]:
    """Hold the `nightly` slot for the whole night: it tells the reaper this run is alive and
    owns the node. A recorded holder on this machine whose process is gone is taken over at
    once; one on another host loses its lease when it expires (≤ ~75 s)."""
    held = ExitStack()
    try:
        held.enter_context(nightly_slot(timeout_seconds=NIGHTLY_SLOT_WAIT_SECONDS))
    except TimeoutError as e:
        raise PhaseFailed(
            f"the 'nightly' concurrency slot is still held after {NIGHTLY_SLOT_WAIT_SECONDS:.0f} s "
            f"(holders: {held_by()}) — another nightly run is alive (prefect flow-run ls --flow-name "
            "nightly --state RUNNING: wait for it or cancel it); a holder on this machine whose "
            "process is gone is taken over by itself. A slot held with no live run anywhere (a "
            "killed run from before slot records, or a server restarted without its leases): "
            "`prefect gcl update nightly --active-slots 0`") from e
    with held:
        yield
