"""The CLI with a profile, as a child process: importing the project changes no environment
variable, and a bad profile is reported without a traceback. (Loading profiles:
tests/unit/test_profile.py.)"""

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def test_importing_the_project_changes_no_environment_variable_and_the_cli_sets_its_defaults() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                        "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK"}}
    code = ("import os\nbefore = dict(os.environ)\n"
            "import flows.nightly, flows.cli, flows.train, flows.reaper, blocks, tasks.graph.store\n"
            "print(sorted({k for k, _ in set(os.environ.items()) ^ set(before.items())}\n"
            "             - {'_RJEM_MALLOC_CONF'}))\n"  # Polars sets its jemalloc options itself

            )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.splitlines()
    assert out == ["[]"]
    # The CLI sets them before it first imports Prefect (whose settings are fixed on import).
    code = ("import flows.cli\ntry:\n    flows.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "from prefect.settings import get_current_settings as g\n"
            "s = g()\nprint(s.server.ephemeral.startup_timeout_seconds, s.server.analytics_enabled)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.splitlines()
    assert out[-1] == "120 False"


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[inference]\nmax_concurrent_requests = -1\n')
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--profile", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "max_concurrent_requests" in proc.stderr and "Traceback" not in proc.stderr
