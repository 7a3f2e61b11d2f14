"""Local server processes the project starts: bound to 127.0.0.1, tracked by a PID file,
stopped by PID (never by name) and verified gone.

The PID file lets a different process — an `on_crashed` hook, the next run — find and stop
a server this one started. Before signalling, the PID's command line is checked against the
file, so a recycled PID is never killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.shared.errors import ServerError
from tasks.shared.files import write_atomic
from tasks.shared.waiting import poll

# The servers this process started, by PID. Holding their Popen objects keeps their exit
# status ours: CPython reaps the children of dropped Popen objects at the next Popen
# (subprocess._cleanup), and with them how they ended (a signal, an exit code).
_STARTED: dict[int, subprocess.Popen[bytes]] = {}

# Ports for the servers this project starts. Asking the kernel for port 0 and closing the
# socket hands the same number to two processes that ask at once (a CI run failed on it), and an
# outgoing connection may take it as its source port before the server binds. So a port comes
# from below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768–60999 by
# default: never a source port), must bind now, and is reserved machine-wide by a lock file this
# process holds until it exits or calls release_port: xdist workers and two checkouts testing at
# once never share one. The lock is a flock, so a killed process frees its ports.
PORT_RANGE = (20000, 32768)
PORT_LOCKS_ENV = "SLM_PORT_LOCKS"  # the lock folder (default <tmp>/slm-nightly-ports)
_HELD_PORTS: dict[int, int] = {}  # port → the descriptor holding its lock
_PORT_RNG = random.Random()  # its own generator: a test that seeds `random` cannot align two workers


def _port_lock_dir() -> Path:
    folder = Path(os.environ.get(PORT_LOCKS_ENV)
                  or Path(tempfile.gettempdir()) / "slm-nightly-ports")
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # shared by every user's processes (as /tmp is)
            folder.chmod(0o1777)
    return folder


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return PORT_RANGE[1]


def free_port() -> int:
    """A loopback port no other process holds or has been handed (see PORT_RANGE's note); it
    stays reserved for this process until it exits or calls release_port."""
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_floor())
    folder = _port_lock_dir()
    start = _PORT_RNG.randrange(low, high)  # then every port of the range once, in turn
    for i in range(high - low):
        port = low + (start - low + i) % (high - low)
        if port in _HELD_PORTS:
            continue
        fd = os.open(folder / f"{port}.lock", os.O_CREAT | os.O_RDONLY, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # another process holds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                os.close(fd)
                continue  # in use by something that did not ask us
        _HELD_PORTS[port] = fd
        return port
    raise ServerError(f"no free loopback port in {low}–{high - 1}: each is in use or reserved "
                      f"by a running process (reservations: {folder}) — are that many servers "
                      "running?")


def release_port(port: int) -> None:
    """Give back a port free_port handed this process (its server has stopped)."""
    fd = _HELD_PORTS.pop(port, None)
    if fd is not None:
        os.close(fd)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot; /proc/PID/stat field 22), None when
    there is no such process or it has exited (a zombie). With the PID it names one process:
    a recycled PID has a later start."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def owner_alive(pid: int, started: int | None) -> bool:
    """The one owner-liveness check: is the process that recorded (`pid`, `started`) — its
    start time from `start_ticks` — still running on this host? A pid reused by a later
    process has another start time and counts as gone; `started=None` (not recorded) trusts
    the pid alone."""
    now = start_ticks(pid)
    if now is None:
        return False
    return started is None or now == started


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has not reaped it yet.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class ServerRecord:
    name: str
    pid: int
    port: int
    marker: str  # a string the process's command line must contain
    log: str
    started_at: float
    owner: int | None = None  # the process that started it
    owner_start: int | None = None  # and when that one started (start_ticks)


class ManagedServer:
    """One server process described by a PID file in `state_dir`."""

    def __init__(self, name: str, state_dir: Path) -> None:
        self.name = name
        self.state_dir = Path(state_dir)
        self.pid_file = self.state_dir / f"{name}.pid.json"

    def record(self) -> ServerRecord | None:
        try:
            return ServerRecord(**json.loads(self.pid_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running(self) -> ServerRecord | None:
        """The recorded server if its process is still the one we started."""
        rec = self.record()
        if rec and alive(rec.pid) and rec.marker in (_cmdline(rec.pid) or ""):
            return rec
        return None

    def orphaned(self) -> ServerRecord | None:
        """The recorded server if it still runs but the process that started it is gone
        (killed with -9): nobody will stop it but the next run."""
        rec = self.running()
        if rec is None or rec.owner is None or rec.owner == os.getpid():
            return None
        return rec if start_ticks(rec.owner) != rec.owner_start else None

    def start(self, argv: list[str], port: int, marker: str,
              ready: Callable[[], bool], timeout: float, env: dict[str, str] | None = None
              ) -> ServerRecord:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.state_dir / f"{self.name}.log"
        with open(log, "ab") as out:
            # the command first: the log then says what ran (threads, ports, model) and since when
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {self.name}: "
                      f"{shlex.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **(env or {})})
        _STARTED[proc.pid] = proc
        rec = ServerRecord(self.name, proc.pid, port, marker, str(log), time.time(),
                           os.getpid(), start_ticks(os.getpid()))
        try:
            write_atomic(self.pid_file, json.dumps(asdict(rec)))

            def up() -> bool:
                if proc.poll() is not None:
                    raise ServerError(f"{self.name} {exit_description(proc.returncode)} while "
                                      f"starting; last log lines:\n{tail(log)}")
                try:
                    return bool(ready())
                except Exception:  # noqa: BLE001 - not ready yet
                    return False

            # at most half a second late: a 1.5x backoff capped at 5 s answered a server ready
            # at 5.3 s at 8.0 s
            if poll(up, timeout, first=0.05, cap=0.5):
                return rec
            raise ServerError(f"{self.name} was not ready after {timeout:.0f} s; last log "
                              f"lines:\n{tail(log)}\nRaise the readiness timeout if the machine "
                              "is slow.")
        except BaseException:
            # Not ready, or interrupted (Ctrl-C) while starting: never leave the process behind,
            # even before its PID file was written.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _STARTED.pop(proc.pid, None)
            self.pid_file.unlink(missing_ok=True)
            raise

    def exited(self) -> str | None:
        """How the recorded server ended when nobody stopped it (its PID file is still there,
        its process is not): "exited with signal 4 (SIGILL)", "exited with code 1", or just
        "exited" when another process started it (then only its log may say why). None while
        it runs, or when no server is recorded."""
        rec = self.record()
        if rec is None:
            return None
        proc = _STARTED.get(rec.pid)
        if proc is not None:  # ours: its exit status is the truth (an exiting process's
            code = proc.poll()  # /proc cmdline empties before it is a zombie)
            return None if code is None else exit_description(code)
        return None if self.running() is not None else "exited"

    def stop(self, grace: float = 10.0) -> bool:
        """Stop the recorded process (SIGTERM, then SIGKILL after `grace`) and verify it is
        gone. Returns True if a process was stopped."""
        rec = self.running()
        if rec is None:
            dead = self.record()
            if dead is not None:
                _STARTED.pop(dead.pid, None)
            self.pid_file.unlink(missing_ok=True)
            return False

        def gone() -> bool:
            _reap(rec.pid)
            return not alive(rec.pid)

        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.kill(rec.pid, sig)
            except ProcessLookupError:
                break
            if poll(gone, wait, first=0.02, cap=0.1):
                break
        _reap(rec.pid)
        if alive(rec.pid):
            raise ServerError(f"{self.name} (pid {rec.pid}) survived SIGKILL")
        proc = _STARTED.pop(rec.pid, None)
        if proc is not None:
            proc.poll()
        self.pid_file.unlink(missing_ok=True)
        return True


def exit_description(code: int) -> str:
    """A Popen returncode in words: "exited with code 1", "exited with signal 4 (SIGILL)"."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"exited with signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"exited with signal {-code}"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path | str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
