"""A real Prefect server for a test (started as the CLI starts its own: tasks/runtime/prefect_env.py),
and the `prefect` command of this environment."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.processes import free_port
from tasks.runtime import prefect_env
from tests.support.paths import PREFECT, ROOT


def prefect_cli(args: list[str], env: dict[str, str], cwd: Path = ROOT,
                timeout: float = 240) -> str:
    """`prefect ARGS` of this environment; its stdout, or the test fails with its output."""
    proc = subprocess.run([PREFECT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


@contextmanager
def prefect_server(home: Path, port: int | None = None, **settings: str
                   ) -> Iterator[dict[str, str]]:
    """A real Prefect server, loop services included, on a free port (or `port`) with its own
    PREFECT_HOME (its PID file and log beside it); yields the environment for subprocesses (CLI,
    workers, flows) to talk to it. `settings`: extra PREFECT_* variables for the server and its
    clients."""
    port = port or free_port()
    env = {**os.environ, "PREFECT_HOME": str(home),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PWD": str(ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(ROOT), **settings}
    env.pop("PREFECT_API_KEY", None)
    server, _ = prefect_env.start_api_server(home.parent, f"prefect-{home.name}", env,
                                             port=port, services=True)
    try:
        yield env
    finally:
        server.stop(grace=20.0)
