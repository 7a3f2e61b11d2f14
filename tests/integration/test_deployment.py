"""prefect.yaml for real, as docs/operations.md's local recipe runs it: a Prefect server, a
process work pool, `prefect deploy` by name, `prefect deployment run`, and a worker that picks
the run up (`--run-once`). The production deployments: tests/integration/test_operator_guide.py."""

import json
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.paths import ROOT
from tests.support.prefect import prefect_cli
from tests.support.prefect import prefect_server as start_server
from tests.support.profiles import toml_profile


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
    # docs/operations.md's recipe, as written (the run gets this test's small profile, the
    # worker --run-once)
    pool, deploy, run_cmd, worker = _recipe()
    prefect_cli(shlex.split(pool)[1:], env)
    prefect_cli(shlex.split(deploy)[1:], env)
    _check_local_deployments(env["PREFECT_API_URL"])
    out = prefect_cli([*shlex.split(run_cmd)[1:], "--param", f"profile={profile}"], env)
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    assert run_id, out
    assert worker == "prefect worker start --pool local-process"
    prefect_cli(["worker", "start", "--pool", "local-process", "--run-once"], env, timeout=400)
    api = env["PREFECT_API_URL"]
    run = httpx.get(f"{api}/flow_runs/{run_id.group(1)}", timeout=10).json()
    assert run["state"]["type"] == "COMPLETED", run["state"]
    arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {
        "any_": [run_id.group(1)]}}}, timeout=10).json()
    assert "nightly-summary" in {a.get("key") for a in arts}
    summary = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert summary["status"] == "completed"
    assert summary["extraction"]["documents"]["transcripts"]["seen"] == 1


def _recipe() -> list[str]:
    """The ```bash block of docs/operations.md's "Prefect deployments on one machine"."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text[text.index("## Prefect deployments on one machine"):]
    block = block[block.index("```bash\n") + 8:]
    lines = block[:block.index("```")].strip().splitlines()
    assert [ln.split()[:3] for ln in lines] == [
        ["prefect", "work-pool", "create"], ["prefect", "--no-prompt", "deploy"],
        ["prefect", "deployment", "run"], ["prefect", "worker", "start"]], lines
    return lines


def _check_local_deployments(api: str) -> None:
    """The local deployments exist on the local pool; the production ones (other pools, the
    code bucket) are not deployed by the local recipe."""
    deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={},
                                                      timeout=10).json()}
    by_name = {f"{flows[d['flow_id']]}/{d['name']}": d for d in deps}
    assert set(by_name) == {"nightly/local", "extract/ad-hoc", "scorecard/ad-hoc",
                            "train/ad-hoc"}
    assert {d["work_pool_name"] for d in deps} == {"local-process"}
    schedules = [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"])
                 for s in by_name["nightly/local"]["schedules"]]
    assert schedules == [("0 2 * * *", "Europe/London", False)]
