"""Ctrl-C, SIGTERM and SIGHUP during `slm-nightly run`, as people send them.

A terminal's Ctrl-C goes to its whole foreground process group: `make`, the CLI and anything
started in that group. The servers a run starts live in sessions of their own (the llama.cpp
server, the embedded FalkorDB, the CLI's temporary Prefect server: tasks/runtime/prefect_env.py), so the
signal reaches the run only, and the run decides what stops.

First signal: stop the profile's local inference server and embedded graph by their PIDs — the
request or write in flight fails at once — then interrupt the run (KeyboardInterrupt in the main
thread): the flow's `finally` stops compute, writes the summary as 'cancelled' and gives its
slots back; the graph's "extracted" mark is written last, so the next run redoes exactly the
documents that were not recorded. While the flow runs, Prefect's own SIGTERM handler is in
place: SIGTERM raises TerminationSignal, the flow unwinds the same way, and Prefect then
re-delivers the signal here. A second signal stops the servers again, the temporary Prefect
server too, and exits at once with 128 + the signal's number.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from prefect.exceptions import TerminationSignal

from tasks.graph import falkordb_server
from tasks.runtime.logs import say  # to the terminal, also while the run's output goes to its log
from tasks.shared.processes import ManagedServer

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunStopper:
    """Signal handling for one run of the profile `cfg` (see the module docstring)."""

    def __init__(self, cfg: Any) -> None:
        # Everything is resolved now: a signal handler must not import.
        self.servers: list[tuple[str, ManagedServer, Any]] = list(cfg.node.signal_stops())
        if cfg.graph.embedded:
            data = Path(cfg.graph.data_dir).resolve()
            self.servers.append(("the embedded FalkorDB", ManagedServer("falkordb", data),
                                 lambda: falkordb_server.stop(data)))
        self.termination = TerminationSignal
        self.prefect_server: ManagedServer | None = None
        self.signum: int | None = None
        self.stopped: list[str] = []

    def install(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _stop(self, find: Any, note: str = "") -> list[str]:
        stopped = []
        for what, server, stop in self.servers:
            rec = find(server)
            if rec is not None and stop():
                stopped.append(f"{what}, pid {rec.pid}")
                say(f"stopped {stopped[-1]}{note}")
        return stopped

    def stop_servers(self) -> list[str]:
        """Stop the local servers still running, by PID; say and return what was stopped."""
        stopped = self._stop(ManagedServer.running)
        self.stopped += stopped
        return stopped

    def stop_orphans(self) -> list[str]:
        """Stop local servers left running by a run that was killed (its process is gone)."""
        return self._stop(ManagedServer.orphaned, ", left running by a killed run")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            say(f"{name} again: stopping the servers and exiting now")
            self.stop_servers()
            rec = self.prefect_server.running() if self.prefect_server else None
            if self.prefect_server is not None and self.prefect_server.stop(grace=1.0) and rec:
                say(f"stopped the temporary Prefect server, pid {rec.pid}")
            os._exit(128 + signum)
        self.signum = signum
        if isinstance(sys.exc_info()[1], self.termination):
            # Prefect re-delivers the SIGTERM that cancelled the flow, once it has unwound.
            say(f"{name}: the run was cancelled (its teardown has run); stopping what is left")
            self.stop_servers()
        else:
            say(f"{name}: stopping the run (send it again to exit at once)")
            self.stop_servers()
            say("cancelling the run: its teardown stops compute, writes the summary and gives "
                "the slots back")
        raise KeyboardInterrupt(f"interrupted by {name}")
