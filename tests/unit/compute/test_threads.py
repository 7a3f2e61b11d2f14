"""The default llama.cpp thread count: one core left for the rest, no core busy now, at least 1;
and the idle cores read off /proc/stat while another process holds one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blocks.compute import LocalCompute
from tasks.compute.local import LocalNode
from tasks.compute.threads import auto_threads, idle_cores, usable_cores


@pytest.mark.parametrize(("cores", "idle", "threads"), [
    (2, 2.0, 1),   # the development machine, quiet: one core left for the rest
    (2, 1.0, 1),   # one core held by another process
    (2, 0.1, 1),   # both busy: still one
    (1, 1.0, 1),
    (4, 4.0, 3),   # the g2-standard-4, quiet
    (4, 1.9, 2),   # two cores busy (1.9 idle rounds to 2 within a quarter core)
    (4, 1.7, 1),
    (16, 16.0, 15),
])
def test_auto_threads(cores: int, idle: float, threads: int) -> None:
    assert auto_threads(cores, idle) == threads


def test_a_busy_core_is_not_counted_idle() -> None:
    if usable_cores() < 2:
        pytest.skip("needs 2 cores")
    quiet = idle_cores(0.5)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        held = idle_cores(0.5)
    finally:
        busy.kill()
        busy.wait()
    assert 0.0 <= held <= usable_cores()
    # The loop took most of a core whatever else runs (other load only lowers `held`); and,
    # on a machine that was quiet before it, that core came off the quiet figure.
    assert held <= usable_cores() - 0.6, (quiet, held)
    if quiet >= usable_cores() - 0.3:
        assert held <= quiet - 0.6, (quiet, held)


def test_the_local_node_picks_once_unless_the_profile_says(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_auto() -> int:
        calls.append(1)
        return 7

    monkeypatch.setattr("tasks.compute.local.auto_threads", fake_auto)
    node = LocalNode(LocalCompute(state_dir=os.devnull))
    assert (node.cpu_threads, node.cpu_threads, calls) == (7, 7, [1])
    assert LocalNode(LocalCompute(state_dir=os.devnull, n_threads=2)).cpu_threads == 2
    assert calls == [1]
