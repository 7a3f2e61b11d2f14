"""prefect.yaml for real: a Prefect server, a process work pool, `prefect deploy --all`,
`prefect deployment run`, and a worker that picks the run up (`--run-once`)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tasks.processes import free_port
from tests.conftest import ROOT

PREFECT = str(Path(sys.executable).parent / "prefect")


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> str:
    proc = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture
def prefect_server(tmp_path: Path):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PWD": str(ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO"}
    env.pop("PREFECT_API_KEY", None)
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prefect server did not become healthy in 120 s")
        yield env
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def test_local_nightly_deployment_runs_on_a_process_worker(tmp_path: Path,
                                                           prefect_server: dict) -> None:
    env = prefect_server
    src = tmp_path / "docs"
    (src / "transcripts").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "transcripts" / "education_1.md", src / "transcripts")
    profile = tmp_path / "tiny.toml"
    profile.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [inference]
        dialect = "llama.cpp"
        max_concurrent_requests = 1
        max_output_tokens = 384
        max_entities = 6
        max_relationships = 4
        max_description_chars = 48
        max_retries = 1
        readiness_timeout_seconds = 120
        [graph]
        data_dir = "{tmp_path / 'graph'}"
        [sources]
        transcripts = "{src / 'transcripts'}"
        [extraction]
        max_failed_share = 1.0
    """))
    _run(["work-pool", "create", "local-process", "--type", "process"], env)
    _run(["--no-prompt", "deploy", "--all"], env)
    out = _run(["deployment", "run", "nightly/local", "--param", f"profile={profile}"], env)
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    assert run_id, out
    _run(["worker", "start", "--pool", "local-process", "--run-once"], env, timeout=400)
    api = env["PREFECT_API_URL"]
    run = httpx.get(f"{api}/flow_runs/{run_id.group(1)}", timeout=10).json()
    assert run["state"]["type"] == "COMPLETED", run["state"]
    arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {
        "any_": [run_id.group(1)]}}}, timeout=10).json()
    assert "nightly-summary" in {a.get("key") for a in arts}
    summary = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert summary["status"] == "completed"
    assert summary["documents"]["transcripts"]["seen"] == 1
