"""run_sync: a signal raised inside an anyio task group (as Prefect's SIGTERM handler does
during httpx's connect, seen on CI: the run ended 'failed', exit 1, instead of 'cancelled', 143)
comes out bare; other errors in a group stay a group."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import anyio
import pytest
from prefect.exceptions import TerminationSignal

from tasks.extraction.calls import run_sync


async def _raise_in_group(error: BaseException) -> None:
    async def boom() -> None:
        raise error

    async with anyio.create_task_group() as tg:
        tg.start_soon(boom)


def test_a_signal_inside_a_task_group_is_raised_bare() -> None:
    with pytest.raises(TerminationSignal) as info:
        run_sync(_raise_in_group(TerminationSignal(signal=15)))
    assert info.value.signal == 15
    assert isinstance(info.value.__cause__, BaseExceptionGroup)
    with pytest.raises(KeyboardInterrupt):
        run_sync(_raise_in_group(KeyboardInterrupt()))


def test_other_errors_in_a_task_group_stay_a_group() -> None:
    with pytest.raises(ExceptionGroup) as info:
        run_sync(_raise_in_group(ValueError("bad answer")))
    assert [str(e) for e in info.value.exceptions] == ["bad answer"]


def test_a_result_comes_back() -> None:
    async def two() -> int:
        return 2

    assert run_sync(two()) == 2


def test_a_signal_landing_in_a_plain_callback_stops_the_work() -> None:
    """Prefect's SIGTERM handler raises TerminationSignal in whatever the main thread runs. In a
    plain loop callback (a socket read, a future's wake-up) asyncio logs and drops anything but
    KeyboardInterrupt and SystemExit (CPython 3.11, asyncio/events.py Handle._run): the run went
    on to completion and exited 0 under parallel load (CI, 2026-12-04). It must stop the work
    and come out of run_sync."""
    finished: list[str] = []

    def handler(signum: int, frame: object) -> None:
        raise TerminationSignal(signal=signum)

    def terminate_me() -> None:  # a callback the loop runs, as it runs a transport's read
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the handler runs here, inside the callback

    async def work() -> None:
        asyncio.get_running_loop().call_soon(terminate_me)
        await asyncio.sleep(30)  # far past the bound below, which a loaded host needs slack in
        finished.append("the work")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        started = time.monotonic()
        with pytest.raises(TerminationSignal) as info:
            run_sync(work())
        assert time.monotonic() - started < 10 and finished == []
        assert info.value.signal == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_signal_raised_in_a_task_nobody_awaits_stops_the_work() -> None:
    """The same signal landing in a background task's step is kept in the task, which no one
    awaits: it stops the work too."""
    async def background() -> None:
        raise TerminationSignal(signal=signal.SIGTERM)

    async def work() -> str:
        task = asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0.05)
        del task
        import gc

        gc.collect()  # the task's exception, never retrieved, reaches the loop's handler
        await asyncio.sleep(30)  # far past the bound below, which a loaded host needs slack in
        return "finished"

    started = time.monotonic()
    with pytest.raises(TerminationSignal):
        run_sync(work())
    assert time.monotonic() - started < 10
