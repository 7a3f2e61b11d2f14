"""How a managed server ended, read from its own exit status: the signal that killed it (SIGILL
from an illegal instruction), its exit code, or nothing while it runs or once it was stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.compute.inference_server import server_exit
from tasks.shared.errors import ServerError
from tasks.shared.processes import ManagedServer, exit_description

IDLE = [sys.executable, "-c", "import time; time.sleep(60)", "--marker-for-test"]


def _wait_gone(server: ManagedServer) -> None:
    deadline = time.monotonic() + 10
    while server.running() is not None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_server_killed_by_sigill_says_so(tmp_path: Path) -> None:
    server = ManagedServer("inference", tmp_path)
    rec = server.start(IDLE, 0, marker="--marker-for-test", ready=lambda: True, timeout=10)
    assert server.exited() is None  # running
    assert server_exit(tmp_path, settle_seconds=0.0) is None
    os.kill(rec.pid, signal.SIGILL)
    deadline = time.monotonic() + 10  # (its cmdline empties before it is a zombie: wait for
    while server.exited() is None and time.monotonic() < deadline:  # the exit status itself)
        time.sleep(0.05)
    assert server.exited() == "exited with signal 4 (SIGILL)"
    (tmp_path / "inference.log").write_text("Fatal Python error: Illegal instruction\n")
    why = server_exit(tmp_path)
    assert why is not None and why.startswith(
        f"the inference server exited with signal 4 (SIGILL), see its log {tmp_path}/inference.log")
    assert why.endswith("Fatal Python error: Illegal instruction")
    assert server.stop() is False  # nothing left to stop: the record goes
    assert server.exited() is None and server_exit(tmp_path) is None


def test_an_exit_code_and_a_server_of_another_process(tmp_path: Path) -> None:
    server = ManagedServer("inference", tmp_path)
    code = [sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)", "--m3"]
    server.start(code, 0, marker="--m3", ready=lambda: True, timeout=10)
    _wait_gone(server)
    assert server.exited() == "exited with code 3"
    # a record of a process another one started (and reaped): its status is not ours to read
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    other = ManagedServer("other", tmp_path)
    other.pid_file.write_text(json.dumps({**json.loads(server.pid_file.read_text()),
                                          "name": "other", "pid": int(gone.stdout)}))
    assert other.exited() == "exited"


def test_exit_descriptions() -> None:
    assert exit_description(0) == "exited with code 0"
    assert exit_description(-9) == "exited with signal 9 (SIGKILL)"
    assert exit_description(-11) == "exited with signal 11 (SIGSEGV)"
    assert exit_description(-200) == "exited with signal 200"


def test_owner_alive_tells_a_reused_pid_apart():
    import os
    import subprocess

    from tasks.shared.processes import owner_alive, start_ticks

    me = os.getpid()
    assert owner_alive(me, start_ticks(me)) is True
    assert owner_alive(me, None) is True
    assert owner_alive(me, (start_ticks(me) or 0) + 1) is False
    p = subprocess.Popen(["true"])
    p.wait()
    assert owner_alive(p.pid, None) is False


@pytest.mark.serial  # a 0.65 s bound (issue 36)
def test_a_server_is_seen_ready_within_half_a_second_of_answering(tmp_path: Path) -> None:
    """The readiness poll's waits grow from 0.05 s and stop at 0.5 s: a server that answers
    0.65 s after its start is seen at the check of 0.75 s (the former 1.5x backoff from 0.25 s
    looked at 0.625 s, then at 1.19 s)."""
    server = ManagedServer("ready-test", tmp_path)
    t0 = time.monotonic()
    rec = server.start(IDLE, 0, marker="--marker-for-test",
                       ready=lambda: time.monotonic() - t0 >= 0.65, timeout=10)
    seen = time.monotonic() - t0
    try:
        assert 0.65 <= seen < 1.05, seen
        assert json.loads(server.pid_file.read_text())["pid"] == rec.pid
        # the PID file written whole, no temporary file beside it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ready-test.log",
                                                              "ready-test.pid.json"]
    finally:
        assert server.stop(grace=5.0) is True


def test_a_server_that_exits_while_starting_is_an_error_with_its_log(tmp_path: Path) -> None:
    server = ManagedServer("dies", tmp_path)
    code = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(2)", "--m2"]
    with pytest.raises(ServerError, match=r"^dies exited with code 2 while starting; last log "
                                          r"lines:\n(.|\n)*no model here"):
        server.start(code, 0, marker="--m2", ready=lambda: False, timeout=10)
    assert not server.pid_file.exists()


_TAKE_PORTS = r"""
import json, sys
from tasks.shared import processes
ports = [processes.free_port() for _ in range(int(sys.argv[1]))]
print(json.dumps(ports), flush=True)
sys.stdin.read()  # hold them until the parent closes stdin
"""


def test_two_processes_asking_at_once_never_get_the_same_port(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 36: binding port 0 and closing handed one number to two processes (a CI run failed
    on it). Reservations are machine-wide locks: two processes — two xdist workers, two
    checkouts — that each take 150 ports at once share none, and none is a port the kernel
    could pick as a connection's source port."""
    from tasks.shared import processes

    env = {**os.environ, processes.PORT_LOCKS_ENV: str(tmp_path / "locks")}
    # a narrow range below the one other processes use, where without the locks two processes
    # would surely collide
    code = f"from tasks.shared import processes; processes.PORT_RANGE = (15000, 15400)\n{_TAKE_PORTS}"
    procs = [subprocess.Popen([sys.executable, "-c", code, "150"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        got = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.communicate("", timeout=30)
    assert [len(set(g)) for g in got] == [150, 150]
    assert not set(got[0]) & set(got[1])
    assert all(15000 <= port < 15400 for port in got[0] + got[1])
    # a process's reservations end with it: the same 300 ports are free again
    monkeypatch.setenv(processes.PORT_LOCKS_ENV, str(tmp_path / "locks"))
    monkeypatch.setattr(processes, "PORT_RANGE", (15000, 15300))
    mine = [processes.free_port() for _ in range(300)]
    try:
        assert sorted(mine) == list(range(15000, 15300))
        with pytest.raises(ServerError, match=r"no free loopback port in 15000–15299: each is in "
                                              r"use or reserved by a running process"):
            processes.free_port()
    finally:
        for port in mine:
            processes.release_port(port)
    assert not set(mine) & set(processes._HELD_PORTS)


def test_a_port_comes_from_below_the_ephemeral_range_and_skips_one_in_use(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    from tasks.shared import processes

    monkeypatch.setenv(processes.PORT_LOCKS_ENV, str(tmp_path / "locks"))
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    port = processes.free_port()
    processes.release_port(port)
    assert processes.PORT_RANGE[0] <= port < min(floor, processes.PORT_RANGE[1])
    # a port something else listens on (it never asked for a reservation) is not handed out
    monkeypatch.setattr(processes, "PORT_RANGE", (port, port + 2))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        assert {processes.free_port() for _ in range(1)} == {port + 1}
    processes.release_port(port + 1)
