"""The node runs the code the orchestrator deployed (issue 23, finding 7).

A copy of the checkout stands for the orchestrator's; a test edits a flow and a task module in
it and deploys `train/node` from it with the CLI exactly as prefect.yaml says (the push steps:
tasks.shared.code_version.code_location, then prefect-gcp's push_to_gcs into the GCS emulator). The
node's worker runs from THIS checkout (the image's environment, installed from here), in the
node's environment (no PYTHONPATH, application-default credentials), and its flow run pulls
the code with pull_from_gcs: the run's log shows the edit, and where `tasks` was imported from.

Real: Prefect server, `prefect deploy`, the process worker and its flow-run process,
prefect-gcp's steps and google-cloud-storage against gcp-storage-emulator."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from prefect.settings import PREFECT_API_URL, temporary_settings

from tasks.shared.code_version import code_files, code_folder, code_version
from tests.fakes.gcs import GcsEmulator
from tests.support.checkout import orchestrator_checkout
from tests.support.paths import ROOT
from tests.support.prefect import prefect_cli
from tests.support.prefect import prefect_server as start_server

MARK = "orchestrator-side edit 7f3c"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} not found once"
    path.write_text(text.replace(old, new))


def test_the_node_runs_the_code_the_orchestrator_deployed(tmp_path: Path) -> None:
    orch = orchestrator_checkout(tmp_path / "orchestrator")
    before = code_version(orch)
    assert before == code_version(ROOT)  # the same files, the same folder
    init = orch / "tasks" / "__init__.py"
    init.write_text(init.read_text() + f'\nCODE_MARK = "{MARK}"\n')
    _edit(orch / "flows" / "train.py", "    cfg = load_profile(profile)\n",
          "    import tasks\n    get_run_logger().info('code: %s from %s', "
          "getattr(tasks, 'CODE_MARK', None), tasks.__file__)\n    cfg = load_profile(profile)\n")
    _edit(orch / "flows" / "train.py", "from prefect import flow\n",
          "from prefect import flow, get_run_logger\n")
    version = code_version(orch)
    assert version != before

    with GcsEmulator(tmp_path) as gcs, start_server(tmp_path / "prefect-home") as env:
        adc = gcs.adc()
        env = {**env, **adc}
        bucket_block = gcs.bucket(folder="slm")
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            bucket_block.save("slm-gcs")  # the block prefect.yaml's push step reads
        prefect_cli(["work-pool", "create", "slm-node", "--type", "process"], env, orch)
        out = prefect_cli(["--no-prompt", "deploy", "--name", "train/node"], env | {"PWD": str(orch)},
                   orch)
        assert "push-code" in out or "push_to_gcs" in out or "Deployment" in out, out

        api = env["PREFECT_API_URL"]
        dep = httpx.get(f"{api}/deployments/name/train/node", timeout=10).json()
        folder = code_folder("slm", version)
        assert dep["version"] == version
        assert dep["pull_steps"] == [{"prefect_gcp.deployments.steps.pull_from_gcs": {
            "id": "pull-code", "bucket": bucket_block.bucket, "folder": folder}}]
        pushed = sorted(b.name[len(folder) + 1:] for b in bucket_block.list_blobs(
            f"code/{version}"))
        assert pushed == code_files(orch)  # nothing of .venv, .git, state or tests

        run = prefect_cli(["deployment", "run", "train/node", "--param",
                    'params={"dataset": "x.parquet", "method": "sft"}', "--param",
                    "profile=gcp"], env, orch)
        run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", run)
        assert run_id, run
        # the node: its worker from the image's environment (this checkout), in a folder of its
        # own, without PYTHONPATH (tests/fakes/node_runtime.py STRIPPED_ENV), with ADC and the bucket
        node_env = {k: v for k, v in env.items() if k != "PYTHONPATH"} | {"PWD": "/"}
        node_dir = tmp_path / "node-cwd"
        node_dir.mkdir()
        prefect_cli(["worker", "start", "--pool", "slm-node", "--run-once"], node_env, node_dir,
             timeout=400)
        flow_run = httpx.get(f"{api}/flow_runs/{run_id.group(1)}", timeout=10).json()
        logs = []
        for _ in range(20):  # logs are written in batches
            logs = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {
                "any_": [run_id.group(1)]}}}, timeout=10).json()
            if any("code: " in entry["message"] for entry in logs):
                break
            time.sleep(0.5)
    messages = [entry["message"] for entry in logs]
    code_line = next((m for m in messages if m.startswith("code: ")), None)
    assert code_line is not None, (flow_run["state"], messages[-20:])
    mark, _, where = code_line[len("code: "):].partition(" from ")
    assert mark == MARK
    # imported from the pulled copy (the run's temporary folder), not this checkout
    assert not where.startswith(str(ROOT)) and where.endswith("/tasks/__init__.py"), where
    # the run then fails on the profile's saved blocks (none here): the edit ran, not a stub
    assert flow_run["state"]["type"] in {"FAILED", "CRASHED"}, flow_run["state"]
