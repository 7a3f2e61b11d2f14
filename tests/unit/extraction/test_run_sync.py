"""run_sync: a signal raised inside an anyio task group (as Prefect's SIGTERM handler does
during httpx's connect, seen on CI: the run ended 'failed', exit 1, instead of 'cancelled', 143)
comes out bare; other errors in a group stay a group."""

from __future__ import annotations

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
