"""The shared waiting helpers: full-jitter backoff bounds and poll's schedule."""

from tasks.shared.waiting import Clock, backoff_seconds, poll


def test_backoff_is_full_jitter_under_the_cap():
    seen = []
    top = lambda lo, hi: (seen.append((lo, hi)), hi)[1]  # noqa: E731
    assert [backoff_seconds(a, 1.0, 30.0, top) for a in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert seen[0] == (0.0, 1.0)
    assert backoff_seconds(3, 0.5, 30.0, lambda lo, hi: lo) == 0.0
    assert backoff_seconds(-1, 2.0, 30.0, top) == 2.0


class _Clock:
    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


def test_poll_grows_waits_and_stops_at_the_deadline():
    c = _Clock()
    calls = []
    assert poll(lambda: calls.append(1), 1.0, first=0.1, factor=2.0, cap=0.3,
                clock=Clock(now=lambda: c.now, sleep=c.sleep)) is None
    assert c.sleeps == [0.1, 0.2, 0.3, 0.3, 0.1]
    assert len(calls) == 6  # once more at the deadline


def test_poll_returns_the_first_answer():
    c = _Clock()
    answers = iter([None, False, 0, "up"])
    assert poll(lambda: next(answers), 5.0, clock=Clock(now=lambda: c.now, sleep=c.sleep)) == 0
    assert c.sleeps == [0.05, 0.1]
