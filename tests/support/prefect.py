"""A real Prefect server for a test (started as the CLI starts its own: tasks/runtime/prefect_env.py),
and the `prefect` command of this environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

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


# The tests' server is the benches' one (tasks/runtime/prefect_env.py: api_server).
prefect_server = prefect_env.api_server
