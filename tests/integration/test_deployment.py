"""prefect.yaml for real: a Prefect server, a process work pool, `prefect deploy --all`,
`prefect deployment run`, and a worker that picks the run up (`--run-once`)."""

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PREFECT, ROOT, toml_profile
from tests.conftest import prefect_server as start_server


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> str:
    proc = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    with start_server(tmp_path / "prefect-home") as env:
        yield env


def test_local_nightly_deployment_runs_on_a_process_worker(tmp_path: Path,
                                                           prefect_server: dict) -> None:
    env = prefect_server
    src = tmp_path / "docs"
    (src / "transcripts").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "transcripts" / "education_1.md", src / "transcripts")
    profile = tmp_path / "tiny.toml"
    toml_profile(profile, state_dir=tmp_path / "state",
                 inference={"dialect": "llama.cpp", "max_concurrent_requests": 1,
                            "max_output_tokens": 384, "max_entities": 6, "max_relationships": 4,
                            "max_description_chars": 48, "max_retries": 1,
                            "repeat_penalty": 1.1, "readiness_timeout_seconds": 120},
                 graph={"data_dir": tmp_path / "graph"},
                 sources={"transcripts": src / "transcripts"},
                 extraction={"max_failed_share": 1.0})
    for pool in ("local-process", "slm-orchestrator", "slm-node"):
        _run(["work-pool", "create", pool, "--type", "process"], env)
    _run(["--no-prompt", "deploy", "--all"], env)
    _check_production_deployments(env["PREFECT_API_URL"])
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


def _check_production_deployments(api: str) -> None:
    """The production deployments exist with their pools and schedules (not run here)."""
    deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={},
                                                      timeout=10).json()}
    by_name = {f"{flows[d['flow_id']]}/{d['name']}": d for d in deps}
    assert {"nightly/local", "nightly/production", "node-reaper/production",
            "extract/ad-hoc", "scorecard/ad-hoc", "train/ad-hoc", "train/node"} <= set(by_name)
    assert by_name["train/node"]["work_pool_name"] == "slm-node"

    def schedules(d: dict) -> list[tuple[str, str, bool]]:
        return [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"])
                for s in d["schedules"]]

    nightly = by_name["nightly/production"]
    assert nightly["work_pool_name"] == "slm-orchestrator"
    assert nightly["parameters"] == {"profile": "gcp"}
    assert nightly["global_concurrency_limit"]["limit"] == 1
    assert schedules(nightly) == [("0 1 * * *", "UTC", True)]
    reaper = by_name["node-reaper/production"]
    assert reaper["work_pool_name"] == "slm-orchestrator"
    assert reaper["parameters"] == {"profile": "gcp"}
    assert schedules(reaper) == [("30 * * * *", "UTC", True)]
    assert schedules(by_name["nightly/local"]) == [("0 2 * * *", "Europe/London", False)]
