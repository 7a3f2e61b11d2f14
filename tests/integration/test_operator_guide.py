"""docs/operator-gcp.md, run as written (issue 23).

The test reads every ```bash block of the guide, in order. Each command whose first word is
`prefect` or `slm-nightly` (and the guide's variables, its `export`s and its render snippet) is
RUN, with bash, exactly as the guide writes it; every other command must start with a word of
NOT_HERE, which says why it cannot run here (Google Cloud's own CLI, the VMs' system, the hub).
A new kind of command in the guide fails this test until it is classified; an edited command
is an edited test.

Where it runs: an orchestrator's checkout (a copy of this one's code, its `.venv` this one's)
whose `profiles/gcp.toml` the test writes as §4 has the operator edit it — pointed at the fakes:
a saved GceCompute block for the fake Compute Engine (driven by google-cloud-compute), the GCS
emulator for the bucket (application-default credentials), the test FalkorDB for the graph, an
OpenAI-compatible fake for the engine, SmolLM2 for training. The Prefect server is real, on
127.0.0.1, at the port the guide's `prefect config set` names (4200) everywhere the guide writes
it, except that each run uses a free port of its own instead (GUIDE_PORT → `port`: two test
workers, or two checkouts testing at once, never share a server). The node is the fake Compute
Engine's instance whose boot runs the rendered startup script (tests/fakes/node_runtime.py): its worker
runs from this checkout's environment and pulls the deployed code from the emulator.

The orchestrator's worker is the guide's own systemd unit (its ExecStart, with /opt/slm-nightly
mapped to the copy and `--run-once`), so the guide's first night runs for real."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.gcs import GcsEmulator
from tests.support.checkout import orchestrator_checkout
from tests.support.gcp_world import BUCKET as GCP_BUCKET
from tests.support.gcp_world import PROJECT as GCP_PROJECT
from tests.support.gcp_world import empty_project
from tests.support.paths import ROOT
from tests.support.prefect import prefect_server as start_server

GUIDE = ROOT / "docs" / "operator-gcp.md"
GUIDE_PORT = 4200  # the guide's `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`


def here(cmd: str, port: int) -> str:
    """The guide's command with its Prefect server's address moved to this run's port."""
    return cmd.replace(f"127.0.0.1:{GUIDE_PORT}/", f"127.0.0.1:{port}/")
RUN_WORDS = ("prefect", "slm-nightly", "export")
RENDER = ".venv/bin/python - <<'PY'"
NOT_HERE = {
    "gcloud": "Google Cloud's CLI: only a real project runs it",
    "sudo": "the VM's own system (packages, /opt, /mnt): the image builder or the orchestrator",
    "hf": "a download from the Hugging Face hub, on the image builder",
    "cd": "the image builder's folders",
    "printf": "a Prefect Cloud key piped into gcloud",
    ".venv/bin/python": "the model conversion on the image builder (its /mnt disks)",
}


def guide_commands(text: str) -> list[tuple[str, str]]:
    """(section, command) for every command of every ```bash block: continuation lines
    joined, comments dropped, a heredoc kept with its body."""
    out: list[tuple[str, str]] = []
    section, block, fence = "", 0, False
    lines = iter(text.splitlines())
    for line in lines:
        if not fence and line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            fence = line.strip() == "```bash" if not fence else False
            block += fence
            continue
        if not fence:
            continue
        cmd = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        while cmd.endswith("\\"):
            cmd = cmd[:-1] + " " + next(lines).split(" #", 1)[0].strip()
        if not cmd.strip():
            continue
        if "<<'PY'" in cmd:  # a heredoc: its body up to PY, then what follows on the line
            body = []
            for inner in lines:
                body.append(inner)
                if inner == "PY":
                    break
            cmd = cmd + "\n" + "\n".join(body)
        out.append((f"{block}:{section}", " ".join(cmd.split()) if "\n" not in cmd else cmd))
    return out


def classify(section: str, cmd: str) -> str | None:
    """None: runs here; else why not."""
    first = cmd.split()[0]
    if first in RUN_WORDS or cmd.startswith(RENDER):
        return None
    if re.fullmatch(r"[A-Z]+=\S+", first):  # variable assignments: the first block only
        return None if section.startswith("1:") else "the image builder's shell variables"
    for word, why in NOT_HERE.items():
        if first == word:
            return why
    raise AssertionError(f"docs/operator-gcp.md ({section}): `{cmd[:80]}` is neither run by "
                         "this test nor in NOT_HERE — classify it")


def test_every_command_of_the_guide_is_classified() -> None:
    commands = guide_commands(GUIDE.read_text())
    runs = [c for s, c in commands if classify(s, c) is None]
    firsts = [c.split()[0] for c in runs]
    # the sequence the operator follows, the guide's own order
    assert [c for c in runs if c.split()[0] in ("prefect", "slm-nightly")] == [
        "slm-nightly gcp setup --dry-run --profile gcp",
        "slm-nightly gcp setup --profile gcp",
        "slm-nightly gcp check --profile gcp",
        "slm-nightly gcp orchestrator --profile gcp --repo "
        "https://github.com/YOUR-ORG/slm-nightly",
        "prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api",
        "prefect work-pool create slm-orchestrator --type process --overwrite",
        "prefect work-pool create slm-node --type process --overwrite",
        "slm-nightly deploy",
        "slm-nightly preflight --profile gcp",
        "slm-nightly node smoke --profile gcp",
        "prefect deployment run 'nightly/production'",
        "slm-nightly status --profile gcp",
        "prefect --no-prompt deployment schedule resume --all",
        "slm-nightly alerts install --notify-block slack-webhook/ops",
        "prefect deployment run 'nightly/extract'",
        "prefect deployment run 'nightly/retrain' --param buckets='[\"engineering-pointsav\"]'",
    ], runs
    assert firsts.count("export") == 1 and sum(c.startswith(RENDER) for c in runs) == 1
    # no command depends on a later one: the deploy reads the slm-gcs block (§4, before §5)
    text = GUIDE.read_text()
    assert text.index('.save("slm-gcs")') < text.index("slm-nightly deploy\n")
    # the project before the orchestrator, the orchestrator before anything runs on it
    assert text.index("slm-nightly gcp setup --profile gcp") < text.index(
        "slm-nightly gcp orchestrator") < text.index("prefect work-pool create")
    assert text.index("gcloud compute images create slm-node-") < text.index(
        "gcloud compute instances create slm-node ")
    assert text.index("slm-nightly preflight --profile gcp") < text.index(
        "prefect deployment run 'nightly/production'")
    assert "deploy --all" not in " ".join(c for _, c in commands)


def _unit(name: str) -> dict[str, str]:
    """The keys of the orchestrator's systemd unit `name`, as `gcp orchestrator` writes it."""
    from tasks.gcp.orchestrator import units
    from tasks.gcp.spec import GcpSpec

    text = units(GcpSpec(project="p", zones=["us-central1-a"], bucket="bkt"))[name]
    return {k: v for k, _, v in (ln.partition("=") for ln in text.splitlines()
                                 if "=" in ln and not ln.startswith("#"))}


@pytest.fixture
def sandbox(tmp_path: Path, falkordb: int, base_cache: dict[str, Any],
            monkeypatch: pytest.MonkeyPatch) -> Any:
    """The world the guide's commands run in (module docstring)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.processes import free_port
    from tests.support.worker_node import WorkerNode

    port = free_port()
    orch = orchestrator_checkout(tmp_path / "orchestrator")
    (orch / ".venv").symlink_to(ROOT / ".venv")
    bucket = _bash(["P=my-gcp-project", "BUCKET=$P-slm"], "echo $BUCKET", {}, orch).strip()
    assert bucket == "my-gcp-project-slm"
    with GcsEmulator(tmp_path) as gcs, empty_project(tmp_path / "gcp", storage_env=False) as world, \
            start_server(tmp_path / "prefect-server", port=port) as server_env:
        api = server_env["PREFECT_API_URL"]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PREFECT_", "SLM_", "PYTHONPATH"))}
        env |= {"PREFECT_HOME": str(tmp_path / "orchestrator-home"), "PYTHONPATH": str(orch),
                "PATH": f"{ROOT / '.venv' / 'bin'}:{env['PATH']}", **gcs.adc()}
        _create_bucket(gcs, bucket)
        for key, value in gcs.adc().items():  # this process is the orchestrator too (ADC)
            monkeypatch.setenv(key, value)
        node = WorkerNode(tmp_path)
        node.runtime.env.update(gcs.adc())
        with temporary_settings({PREFECT_API_URL: api}), node.fake:
            from prefect.blocks.notifications import SlackWebhook
            from prefect_gcp import GcsBucket

            GcsBucket(bucket=bucket).save("slm-gcs")  # §4, as written (no credentials)
            SlackWebhook(url="http://127.0.0.1:9/slack").save("ops")  # the operator's own
            profile = node.profile(tmp_path, "slm-node", {**base_cache, "falkordb": falkordb},
                                   2, gcs_block="slm-gcs")
            # §4: the operator's profiles/gcp.toml (here: pointed at the fakes), with §0's [gcp]
            # names: the project of the wire fakes `gcp` commands talk to
            (orch / "profiles" / "gcp.toml").write_text(profile.read_text() + gcp_table())
            yield {"orch": orch, "env": env, "api": api, "node": node, "tmp": tmp_path,
                   "gcs": gcs, "bucket": bucket, "port": port, "gcp": world,
                   "gcp_env": operator_env(world)}


def gcp_table() -> str:
    return (f'\n[gcp]\nproject = "{GCP_PROJECT}"\nzones = ["us-central1-a"]\n'
            f'bucket = "{GCP_BUCKET}"\n')


def operator_env(world: Any) -> dict[str, str]:
    """§0: the operator's application-default credentials (a project owner), the fakes'
    endpoints; the project's GPU quota granted (§1's person step) and debian-cloud's image."""
    owner = f"operator@{GCP_PROJECT}.iam.gserviceaccount.com"
    world.iam.seed("operator")
    world.gcp.grant(f"serviceAccount:{owner}", "roles/owner")
    world.quotas.set_quota("GPUS-ALL-REGIONS-per-project", 1)
    world.compute.network.add_image("debian-12-bookworm-v20261201", "debian-12",
                                    project="debian-cloud")
    return {**world.env(owner), "STORAGE_EMULATOR_HOST": world.storage.url}


def _create_bucket(gcs: GcsEmulator, name: str) -> None:
    client = gcs.bucket().gcp_credentials.get_cloud_storage_client()
    if client.lookup_bucket(name) is None:
        client.create_bucket(name)


def _bash(prelude: list[str], cmd: str, env: dict[str, str], cwd: Path,
          timeout: float = 600) -> str:
    proc = subprocess.run(["bash", "-c", "\n".join([*prelude, cmd])], cwd=cwd,
                          env=env or None, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"`{cmd[:200]}` exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc.stdout


def test_the_guide_runs_as_written(sandbox: dict[str, Any]) -> None:
    text = GUIDE.read_text()
    orch, env, api, port = sandbox["orch"], sandbox["env"], sandbox["api"], sandbox["port"]
    prelude: list[str] = []
    outputs: dict[str, str] = {}
    for section, cmd in guide_commands(text):
        if classify(section, cmd) is not None:
            continue
        if cmd.split()[0] == "export" or re.fullmatch(r"[A-Z]+=\S+", cmd.split()[0]):
            prelude.append(here(cmd, port))
            continue
        if cmd.startswith("prefect deployment run 'nightly/production'"):
            outputs[cmd] = _bash(prelude, here(cmd, port), env, orch)
            _orchestrator_worker_runs_once(text, env, orch, port)
            continue
        gcp_env = sandbox["gcp_env"] if cmd.startswith("slm-nightly gcp ") else {}
        outputs[cmd] = _bash(prelude, here(cmd, port), {**env, **gcp_env}, orch)
        if cmd == "slm-nightly deploy":  # §5: the schedules come paused
            paused = _schedules(api)
            assert paused == {"nightly/production": [("0 1 * * *", "UTC", False)],
                              "node-reaper/production": [("30 * * * *", "UTC", False)],
                              "train/node": [], "nightly/extract": [],
                              "nightly/retrain": []}, paused

    # §2: the CLI talks to the guide's server, from the profile `prefect config set` wrote
    assert f"http://127.0.0.1:{port}/api" in (sandbox["tmp"] / "orchestrator-home" /
                                             "profiles.toml").read_text()
    # §6: the render snippet ran against the saved-block [compute]
    assert "slm-prefect-worker" in (orch / "startup.sh").read_text()
    # §5: the deployments, the schedules deployed paused and resumed by §7
    deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    assert sorted(d["name"] for d in deps) == ["extract", "node", "production", "production",
                                               "retrain"]
    smoke = outputs["slm-nightly node smoke --profile gcp"]
    assert "smoke: passed" in smoke, smoke[-3000:]
    assert "smoke: environment ok" in smoke
    pre = outputs["slm-nightly preflight --profile gcp"]
    assert "all checks passed" in pre, pre
    status = outputs["slm-nightly status --profile gcp"]
    assert "completed" in status, status
    assert _schedules(api) == {"nightly/production": [("0 1 * * *", "UTC", True)],
                               "node-reaper/production": [("30 * * * *", "UTC", True)],
                               "train/node": [], "nightly/extract": [], "nightly/retrain": []}
    half = {d["name"]: d["parameters"] for d in httpx.post(
        f"{api}/deployments/filter", json={}, timeout=10).json() if d["name"] in
        ("extract", "retrain")}
    assert half == {"extract": {"profile": "gcp", "phases": "extract"},
                    "retrain": {"profile": "gcp", "phases": "train", "retrain": True}}
    nightly = httpx.get(f"{api}/deployments/name/nightly/production", timeout=10).json()
    assert nightly["parameters"] == {"profile": "gcp"}
    assert nightly["global_concurrency_limit"]["limit"] == 1
    assert nightly["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {
        "directory": str(orch)}}]
    autos = httpx.post(f"{api}/automations/filter", json={}, timeout=10).json()
    assert len(autos) == 2, autos


def _schedules(api: str) -> dict[str, list[tuple[str, str, bool]]]:
    deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={},
                                                      timeout=10).json()}
    return {f"{flows[d['flow_id']]}/{d['name']}": [
        (s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in d["schedules"]]
        for d in deps}


def _orchestrator_worker_runs_once(text: str, env: dict[str, str], orch: Path,
                                   port: int) -> None:
    """The guide's slm-orchestrator-worker unit, its ExecStart with /opt/slm-nightly mapped to
    the orchestrator's checkout, run once: it takes the night the guide just created."""
    from tasks.gcp.orchestrator import client_env
    from tasks.gcp.spec import GcpSpec

    unit = _unit("slm-orchestrator-worker")
    argv = shlex.split(unit["ExecStart"].replace("/opt/slm-nightly", str(orch)))
    assert unit["EnvironmentFile"] == "/etc/slm-nightly/prefect.env"
    # the environment file as the install script writes it (the auth string aside: this
    # test's server has none; tests/integration/test_gcp_orchestrator.py runs one that does)
    env_file = dict(ln.split("=", 1) for ln in client_env(GcpSpec(
        project="p", zones=["us-central1-a"], bucket="bkt")))
    assert env_file["PREFECT_API_URL"] == f"http://127.0.0.1:{GUIDE_PORT}/api"
    unit_env = {"PREFECT_API_URL": here(env_file["PREFECT_API_URL"], port),
                **dict(kv.split("=", 1) for kv in shlex.split(unit["Environment"]))}
    assert unit_env["SLM_NIGHTLY_PROFILE"] == "gcp"
    cwd = Path(unit["WorkingDirectory"].replace("/opt/slm-nightly", str(orch)))
    proc = subprocess.run([*argv, "--run-once"], cwd=cwd, env={**env, **unit_env},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shutil.rmtree(orch / "__pycache__", ignore_errors=True)
    summary = json.loads((Path(env["PREFECT_HOME"]).parent / "state" / "runs" /
                          "last-run.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
