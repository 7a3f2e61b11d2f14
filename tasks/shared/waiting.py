"""Waiting, the one way: exponential backoff between retries, and polling until a condition.

`backoff_seconds` is "full jitter" from the AWS Architecture Blog's "Exponential Backoff And
Jitter" (2015): a uniform draw from [0, min(cap, base * 2**attempt)] — never above `cap`, and
spread so that many clients retrying at once do not retry in step. Where a step is a Prefect
task, Prefect's own `retries=` / `retry_delay_seconds=` is used instead.

`poll` calls a check until it answers, with waits that grow geometrically from `first` to
`cap` and never sleep past the deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def backoff_seconds(attempt: int, base: float, cap: float,
                    rand: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first retry): full jitter,
    at most `cap`."""
    return rand(0.0, min(cap, base * 2 ** max(attempt, 0)))


@dataclass(frozen=True)
class Clock:
    """What `poll` reads the time from and sleeps with: the monotonic clock and time.sleep,
    unless a test gives its own."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], object] = time.sleep


MONOTONIC = Clock()


def poll(check: Callable[[], T | None], timeout: float, *, first: float = 0.05,
         factor: float = 2.0, cap: float = 1.0, clock: Clock = MONOTONIC) -> T | None:
    """Call `check` until it returns something other than None (or False), and return that;
    None when `timeout` seconds pass first. `check` runs at least once, and once more at the
    deadline. The caller raises its own error, naming what it waited for."""
    sleep = clock.sleep
    deadline = clock.now() + timeout
    wait = first
    while True:
        answer = check()
        if answer is not None and answer is not False:
            return answer
        left = deadline - clock.now()
        if left <= 0:
            return None
        sleep(min(wait, left))
        wait = min(cap, wait * factor)
