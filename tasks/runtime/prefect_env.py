"""Prefect settings a local run needs, applied before Prefect is imported, and the CLI's
temporary Prefect server (its launcher also starts the tests' and the benches' servers).

The user never has to export them; an explicit environment value still wins.
"""

import atexit
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasks.runtime.logs import say as _say  # the terminal, also while a run's output goes to its log
from tasks.shared.paths import PROJECT_ROOT
from tasks.shared.processes import ManagedServer, free_port

DEFAULTS = {
    # The first ephemeral-server start on a fresh PREFECT_HOME takes longer than the 20 s default.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


def apply() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


TEMP_SERVER = "prefect-server"  # PID files <state_dir>/prefect-server-<CLI pid>.pid.json
TEMP_API_ENV = "SLM_TEMPORARY_PREFECT_API"  # the API URL of the CLI's temporary server


def ephemeral_api(client: Any) -> bool:
    """Whether the client talks to an ephemeral API — Prefect's own temporary server or the
    CLI's — which keeps concurrency leases in memory and runs no repossessor."""
    from prefect.client.base import ServerType

    ours = os.environ.get(TEMP_API_ENV, "").rstrip("/")
    return client.server_type == ServerType.EPHEMERAL or \
        (bool(ours) and str(client.api_url).rstrip("/") == ours)


@contextmanager
def temporary_server(state_dir: Path) -> Iterator[ManagedServer | None]:
    """Without PREFECT_API_URL, the CLI's own temporary Prefect server, in place of the one
    Prefect would start by itself: the same app (Prefect's ephemeral API, database in
    PREFECT_HOME), but in its own session, so a Ctrl-C in the terminal reaches the run and not
    its API. Tracked by a PID file, stopped at exit — after Prefect's log and event workers have
    flushed, as Prefect does with its own — and by the next run if this process was killed.
    Points this process and its children at it. None when PREFECT_API_URL is set."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_UI_URL,
        get_current_settings,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        yield None
        return
    stop_leftover_servers(state_dir)
    server, url = start_api_server(state_dir, f"{TEMP_SERVER}-{os.getpid()}",
                                   get_current_settings().to_environment_variables(
                                       exclude_unset=True))
    atexit.register(_stop, server)
    os.environ["PREFECT_API_URL"] = os.environ[TEMP_API_ENV] = url  # child processes
    # This process read its settings at import. Its UI is off: no "View at" links.
    with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_UI_URL: ""}):
        yield server


def start_api_server(state_dir: Path, name: str, env: dict[str, str], *, port: int | None = None,
                     services: bool = False) -> tuple[ManagedServer, str]:
    """Prefect's API app on 127.0.0.1:`port` (a free one by default), as the ManagedServer
    `name` of `state_dir` (PID file, log there); returns once it answers /health, with its API
    URL. `env`: its environment beyond this process's. Without `services`, Prefect's ephemeral
    API (no loop services, as Prefect's own temporary server); with them, what `prefect server
    start` runs (the scheduler, the repossessor, ...). The CLI's temporary server, the tests'
    and the benches' servers all start here."""
    import httpx
    import prefect
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    # Prefect 3.9's own command and flags for its temporary server (SubprocessASGIServer) and
    # for `prefect server start` (cli/_server_utils.py): the same app factory.
    flags = {"PREFECT_UI_ENABLED": "0", **({} if services else {"PREFECT__SERVER_EPHEMERAL": "1"}),
             "PREFECT__SERVER_FINAL": "1"}
    server = ManagedServer(name, state_dir)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]
    server.start(argv, port, marker=f"--port {port}",
                 ready=lambda: httpx.get(f"{url}/health", timeout=5).is_success,
                 timeout=PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(),
                 env={**flags, **env})
    return server, url


@contextmanager
def api_server(home: Path, port: int | None = None, **settings: str) -> Iterator[dict[str, str]]:
    """A real Prefect server, loop services included, on a free port (or `port`) with its own
    PREFECT_HOME (its PID file and log beside it), for the tests and the benches; yields the
    environment for subprocesses (CLI, workers, flows) to talk to it, with this checkout on
    their path. `settings`: extra PREFECT_* variables for the server and its clients."""
    port = port or free_port()
    env = {**os.environ, "PREFECT_HOME": str(home),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PWD": str(PROJECT_ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(PROJECT_ROOT), **settings}
    env.pop("PREFECT_API_KEY", None)
    server, _ = start_api_server(home.parent, f"prefect-{home.name}", env, port=port,
                                 services=True)
    try:
        yield env
    finally:
        server.stop(grace=20.0)


def _stop(server: ManagedServer) -> None:
    rec = server.running()
    if server.stop(grace=5.0) and rec:
        _say(f"stopped the temporary Prefect server, pid {rec.pid}")


def stop_leftover_servers(state_dir: Path) -> None:
    """Stop temporary Prefect servers whose CLI process is gone (killed with -9)."""
    for pid_file in Path(state_dir).glob(f"{TEMP_SERVER}-*.pid.json"):
        server = ManagedServer(pid_file.name.removesuffix(".pid.json"), Path(state_dir))
        rec = server.orphaned()
        if rec is not None and server.stop(grace=5.0):
            _say(f"stopped a temporary Prefect server left running by a killed run, pid {rec.pid}")
        elif server.running() is None:
            pid_file.unlink(missing_ok=True)
