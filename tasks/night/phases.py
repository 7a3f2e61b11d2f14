"""The one phase timer, and the night's phase records (RunSummary.phases): each phase's status,
its seconds, and the first failure's reason in `summary.error`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from prefect.exceptions import TerminationSignal

from tasks.records import RunSummary
from tasks.shared.errors import NodePreempted, PhaseFailed, PhaseTimedOut


@contextmanager
def timed(ended: Callable[[float, BaseException | None], None]) -> Iterator[None]:
    """Time the block: `ended(seconds, error)` when it ends (error None on success); the error
    goes on up."""
    start = time.monotonic()
    try:
        yield
    except BaseException as e:
        ended(time.monotonic() - start, e)
        raise
    ended(time.monotonic() - start, None)


def final_status(e: BaseException) -> Literal["preempted", "cancelled", "failed"]:
    if isinstance(e, NodePreempted):
        return "preempted"
    # KeyboardInterrupt: `slm-nightly run` stopped by Ctrl-C or SIGTERM (tasks/interrupts.py).
    return "cancelled" if isinstance(e, TerminationSignal | KeyboardInterrupt) else "failed"


def phase_failed(summary: RunSummary, name: str, e: BaseException) -> None:
    """The summary's phase `name` ended with `e`: its status, and `summary.error` if it is the
    first phase that failed."""
    # Prefect's FlowRunTimeoutError and TaskRunTimeoutError are TimeoutErrors, and so is
    # PhaseTimedOut; run_on_node raises TimeoutError when a node run outlives its budget.
    summary.phases[name].status = "timed_out" if isinstance(e, TimeoutError | PhaseTimedOut) \
        else final_status(e)
    why = str(e) or ("the run was cancelled" if final_status(e) == "cancelled" else "")
    if summary.error is None:  # the first phase that failed says why
        summary.error = f"{name}: {type(e).__name__}" + (f": {why}" if why else "")


@contextmanager
def phase(summary: RunSummary, name: str) -> Iterator[None]:
    """The block as the summary's phase `name`: running, then how it ended and in how long."""
    record = summary.set_phase(name, "running")

    def ended(seconds: float, e: BaseException | None) -> None:
        record.seconds = round(seconds, 2)
        record.status = "completed"
        if e is not None:
            if isinstance(e, PhaseFailed):
                summary.merge_extraction(e.report)
            phase_failed(summary, name, e)

    with timed(ended):
        yield
