"""docs/operator-gcp.md, run as written (issue 23).

The test reads every ```bash block of the guide, in order. Each command whose first word is
`prefect` or `slm-nightly` (and the guide's variables and its `export`) is
RUN, with bash, exactly as the guide writes it; every other command must start with a word of
NOT_HERE, which says why it cannot run here (Google Cloud's own CLI, the VMs' system, the hub).
A new kind of command in the guide fails this test until it is classified; an edited command
is an edited test.

Where it runs: ONE empty project of wire fakes (tests/support/gcp_world.py: Compute Engine,
IAM, Resource Manager, Service Usage, Cloud Quotas, Secret Manager, and the GCS emulator behind
the bucket's IAM), driven by Google's client libraries. The `gcp` commands run as the project's
owner and make the network, the accounts, their grants and the bucket; `gcp nodes` makes the
node from the image §3 left in the family (added here, as the image build will in issue 39).
Everything after runs as what it is in production: the orchestrator's commands and its worker
with the orchestrator account's application-default credentials, the node with the node
account's — so each call is checked against exactly the grants `gcp setup` made, and the test
derives them back from the checks the fakes recorded (`_grants_are_the_calls`).

The orchestrator is a copy of this checkout (its `.venv` this one's) in the operator's own
folder, whose `profiles/gcp.toml` the test writes as §4 has the operator edit it (the test
FalkorDB for the graph, an OpenAI-compatible fake for the engine, SmolLM2 for training). Run as
root, every command drops to an unprivileged account that owns only that folder (`setpriv`,
`_as_operator`). The Prefect server is real, on 127.0.0.1, at the port the guide's
`prefect config set` names (4200) everywhere the guide writes it, except that each run uses a
free port of its own instead (GUIDE_PORT → `port`). The node is the fake Compute Engine's
instance whose boot runs the rendered startup script (tests/fakes/node_runtime.py): its worker
runs from this checkout's environment and pulls the deployed code from the bucket.

The orchestrator's worker is the guide's own systemd unit (its ExecStart, with /opt/slm-nightly
mapped to the copy and `--run-once`), so the guide's first night runs for real."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasks.gcp.image import BUILDER
from tests.fakes.node_runtime import ByName
from tests.support.checkout import orchestrator_checkout
from tests.support.gcp_world import BUCKET as GCP_BUCKET
from tests.support.gcp_world import PROJECT as GCP_PROJECT
from tests.support.gcp_world import empty_project
from tests.support.image_builder import builder_node
from tests.support.paths import ROOT
from tests.support.prefect import prefect_server as start_server

GUIDE = ROOT / "docs" / "operator-gcp.md"
GUIDE_PORT = 4200  # the guide's `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`


def here(cmd: str, port: int) -> str:
    """The guide's command with its Prefect server's address moved to this run's port."""
    cmd = cmd.replace(f"127.0.0.1:{GUIDE_PORT}/", f"127.0.0.1:{port}/")
    if cmd.startswith("slm-nightly gcp image build"):
        # this profile's recipe trains a local tiny GGUF (its night runs here), not a hub id:
        # the image is built for production's base, as recipes/production.yaml names it
        cmd += (" --base-model allenai/Olmo-3-7B-Think@main"
                " --base-gguf /opt/models/olmo-3-7b-think-f16.gguf")
    return cmd
RUN_WORDS = ("prefect", "slm-nightly", "export")
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
    if first in RUN_WORDS:
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
        "slm-nightly gcp orchestrator --profile gcp",
        "prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api",
        "slm-nightly gcp image build --profile gcp",
        "prefect work-pool create slm-orchestrator --type process --overwrite",
        "prefect work-pool create slm-node --type process --overwrite",
        "slm-nightly deploy",
        "slm-nightly gcp nodes --profile gcp",
        "slm-nightly preflight --profile gcp",
        "slm-nightly node smoke --profile gcp",
        "prefect deployment run 'nightly/production'",
        "slm-nightly status --profile gcp",
        "prefect --no-prompt deployment schedule resume --all",
        "slm-nightly alerts install --notify-block slack-webhook/ops",
        "prefect deployment run 'nightly/extract'",
        "prefect deployment run 'nightly/retrain' --param buckets='[\"engineering-pointsav\"]'",
    ], runs
    assert firsts.count("export") == 1
    # no command depends on a later one: the deploy reads the slm-gcs block (§4, before §5)
    text = GUIDE.read_text()
    assert text.index('.save("slm-gcs")') < text.index("slm-nightly deploy\n")
    # the project before the orchestrator, the orchestrator before anything runs on it
    assert text.index("slm-nightly gcp setup --profile gcp") < text.index(
        "slm-nightly gcp orchestrator") < text.index("prefect work-pool create")
    assert text.index("slm-nightly gcp nodes --profile gcp") < text.index(
        "slm-nightly preflight --profile gcp")
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


ORCH_SA = f"slm-orchestrator@{GCP_PROJECT}.iam.gserviceaccount.com"
NODE_SA = f"slm-node@{GCP_PROJECT}.iam.gserviceaccount.com"
NODE_ZONE = "us-central1-a"


@pytest.fixture
def sandbox(tmp_path: Path, falkordb: int, base_cache: dict[str, Any],
            olmo3_tiny: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The world the guide's commands run in (module docstring): one empty project."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.shared.processes import free_port
    from tests.support.worker_node import WorkerNode

    port = free_port()
    # the operator's own folder, outside pytest's root-only temp folder: run as root, this test
    # runs every command as an unprivileged user who owns only this folder (finding 5)
    with tempfile.TemporaryDirectory(prefix="slm-operator-") as made:
        home = Path(made)
        orch = orchestrator_checkout(home / "orchestrator")
        (orch / ".venv").symlink_to(ROOT / ".venv")
        _hand_over(home)
        bucket = _bash(["P=my-gcp-project", "BUCKET=$P-slm"], "echo $BUCKET", {}, orch).strip()
        assert bucket == "my-gcp-project-slm"
        with empty_project(tmp_path / "gcp", storage_env=False) as world, \
                start_server(tmp_path / "prefect-server", port=port) as server_env:
            api = server_env["PREFECT_API_URL"]
            # the orchestrator's processes act as its VM's service account (application-default
            # credentials), the node's as the node's: only what `gcp setup` granted them
            as_orchestrator = adc(world, ORCH_SA, home)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PREFECT_", "SLM_", "PYTHONPATH", "GOOGLE_", "STORAGE_"))}
            env |= {"PREFECT_HOME": str(home / "orchestrator-home"), "PYTHONPATH": str(orch),
                    "PATH": f"{ROOT / '.venv' / 'bin'}:{env['PATH']}", "HOME": str(home),
                    "USER": "slm", "LOGNAME": "slm", **as_orchestrator}
            for key, value in as_orchestrator.items():  # this process is the orchestrator too
                monkeypatch.setenv(key, value)
            node = WorkerNode(tmp_path, fake=world.compute, at=(GCP_PROJECT, NODE_ZONE, "slm-node"))
            node.runtime.env.update(adc(world, NODE_SA))
            # §3's builder runs its script with stand-ins (tests/support/image_builder.py)
            # (its checkout mapped under tmp: the profile's project_dir is this repository)
            builder = builder_node(tmp_path / "builder", GCP_PROJECT, Path(olmo3_tiny["hf"]),
                                   world.storage.url, project_dir=str(ROOT))
            ByName(node.runtime, **{BUILDER: builder}).attach(world.compute)
            with temporary_settings({PREFECT_API_URL: api}):
                from prefect.blocks.notifications import SlackWebhook
                from prefect_gcp import GcsBucket

                GcsBucket(bucket=GCP_BUCKET).save("slm-gcs")  # §4, as written (no credentials)
                SlackWebhook(url="http://127.0.0.1:9/slack").save("ops")  # the operator's own
                profile = node.profile(home, "slm-node", {**base_cache, "falkordb": falkordb},
                                       2, gcs_block="slm-gcs", adc=True)
                # §4: the operator's profiles/gcp.toml (here: pointed at the fakes), with §0's [gcp]
                # names: the project of the wire fakes `gcp` commands talk to
                (orch / "profiles" / "gcp.toml").write_text(profile.read_text() + gcp_table())
                gcp_env = operator_env(world, home)
                _hand_over(home)
                try:
                    yield {"orch": orch, "env": env, "api": api, "node": node, "tmp": home,
                           "bucket": GCP_BUCKET, "port": port, "gcp": world, "gcp_env": gcp_env}
                finally:
                    # what this process queued for the guide's server, sent while it answers: a
                    # worker left holding it after the server stops kept the session's Prefect
                    # test harness waiting in its final drain
                    from prefect.events.worker import EventsWorker
                    from prefect.logging.handlers import APILogWorker

                    EventsWorker.drain_all(timeout=30)
                    APILogWorker.drain_all(timeout=30)
            node.runtime.close()
            builder.close()


OPERATOR = 65534  # nobody: an account that owns nothing here but the operator's folder


def _as_operator(argv: list[str]) -> list[str]:
    """`argv` run as the operator: run as root, this test drops to an unprivileged account that
    owns only the operator's folder (the guide's commands are an operator's, as the service
    user on the orchestrator). It keeps one capability, CAP_DAC_READ_SEARCH: reading and
    searching anything, so the interpreter under root's 0700 home runs — every write is still
    checked against what the account owns, and ownership is what finding 5 is about."""
    from tests.fakes.node_runtime import drop_to

    return drop_to(OPERATOR, argv) if os.geteuid() == 0 else argv


def _hand_over(home: Path) -> None:
    """The operator's folder to the operator (where this test runs as root)."""
    if os.geteuid() != 0:
        return
    for top, dirs, files in os.walk(home):  # never into a link (the checkout's .venv)
        os.lchown(top, OPERATOR, OPERATOR)
        for name in dirs + files:
            os.lchown(os.path.join(top, name), OPERATOR, OPERATOR)


def adc(world: Any, email: str, home: Path | None = None) -> dict[str, str]:
    """Application-default credentials acting as `email` (their key in `home`, where the
    operator can read it), the bucket's endpoint the fake's."""
    key = world.key_file(email)
    if home is not None:
        key = Path(shutil.copy(key, home / key.name))
    return {"GOOGLE_APPLICATION_CREDENTIALS": str(key), "STORAGE_EMULATOR_HOST": world.storage.url}


def gcp_table() -> str:
    return (f'\n[gcp]\nproject = "{GCP_PROJECT}"\nzones = ["{NODE_ZONE}"]\n'
            f'bucket = "{GCP_BUCKET}"\n')


def operator_env(world: Any, home: Path) -> dict[str, str]:
    """§0: the operator's application-default credentials (a project owner), the fakes'
    endpoints; the project's GPU quota granted (§1's person step), debian-cloud's image (the
    orchestrator's) and Google's Deep Learning VM family (the image builder's)."""
    owner = f"operator@{GCP_PROJECT}.iam.gserviceaccount.com"
    world.iam.seed("operator")
    world.gcp.grant(f"serviceAccount:{owner}", "roles/owner")
    world.quotas.set_quota("GPUS-ALL-REGIONS-per-project", 1)
    world.compute.network.add_image("debian-12-bookworm-v20261201", "debian-12",
                                    project="debian-cloud")
    world.compute.network.add_image("common-cu129-ubuntu-2204-nvidia-580-v20261120",
                                    "common-cu129-ubuntu-2204-nvidia-580",
                                    project="deeplearning-platform-release")
    return {**world.env(owner), **adc(world, owner, home)}


def _bash(prelude: list[str], cmd: str, env: dict[str, str], cwd: Path,
          timeout: float = 600) -> str:
    proc = subprocess.run(_as_operator(["bash", "-c", "\n".join([*prelude, cmd])]), cwd=cwd,
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
    # §3: the image `gcp image build` made, in the family, from the builder's boot disk
    img = sandbox["gcp"].compute.network.family_image(GCP_PROJECT, "slm-node")
    assert img is not None and img.labels["cuda"] == "12-9", img
    assert (NODE_ZONE, BUILDER) not in sandbox["gcp"].compute.instances
    # §6: `gcp nodes` made the node from §3's image, at the image's size, and left it stopped
    # (the night started and stopped it again)
    world = sandbox["gcp"]
    node = world.compute.instances[(NODE_ZONE, "slm-node")]
    disk = world.compute.network.disks[(NODE_ZONE, "slm-node")]
    assert (node.status, node.service_account, int(disk["sizeGb"]), disk["image"]) == (
        "TERMINATED", NODE_SA, 100, img.name), (vars(node), disk)
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
    _grants_are_the_calls(world)


# Granted by `gcp setup` for what this test cannot run: Google's own agents, and the auth string
# that `gcloud` reads on the VMs (tests/integration/test_gcp_orchestrator.py checks that the
# install script reads it and that it works against a real Prefect server; no call of this night
# reaches the Secret Manager fake: the node runtime's gcloud shim reads a dict).
UNEXERCISED: dict[tuple[str, ...], str] = {
    ("orchestrator", "roles/logging.logWriter"): "the Ops Agent's logs: no agent here",
    ("node", "roles/logging.logWriter"): "the Ops Agent's logs: no agent here",
    ("orchestrator", "roles/secretmanager.secretAccessor"): "the install script's auth string",
    ("node", "roles/secretmanager.secretAccessor"): "the worker's auth string: no auth here",
    # one binding of a role the night does use elsewhere: preflight's read of the auth string's
    # metadata, which this profile does not name (test_gcp_setup.py reads it with this grant)
    ("orchestrator", "roles/secretmanager.viewer",
     f"projects/{GCP_PROJECT}/secrets/slm-prefect-auth"): "preflight's read of the auth string",
}


def _grants_are_the_calls(world: Any) -> None:
    """Issue 38: every grant `gcp setup` gave the two accounts is needed by a call this night
    made — without that one binding, a check the fakes recorded as allowed is refused with the
    403 naming its permission — and no call of theirs was refused."""
    gcp = world.gcp
    who = {f"serviceAccount:{ORCH_SA}": "orchestrator", f"serviceAccount:{NODE_SA}": "node"}
    refused = sorted({(who[m], p, r) for m, p, r, ok in gcp.checks if m in who and not ok})
    assert not refused, refused
    bindings = [(member, role, scope) for scope, pol in gcp.policies.items()
                for role, members in pol.bindings.items() for member in members if member in who]
    needs: dict[tuple[str, str, str], list[str]] = {}
    unused = {}
    for member, role, scope in bindings:
        lost = sorted({p for m, p, r, ok in gcp.checks if m == member and ok and
                       not gcp.holds(m, p, r, without=(member, role, scope))})
        if lost:
            needs[(who[member], role, scope)] = lost
            denied = gcp.denied(lost[0], scope)[1]["error"]
            assert denied["code"] == 403 and lost[0] in denied["message"]
        else:
            unused[(who[member], role, scope)] = scope
    assert {k if k in UNEXERCISED else k[:2] for k in unused} == set(UNEXERCISED), (unused, needs)
    # and the table setup grants from names only permissions a call of this night checked
    from tasks.gcp.grants import CALLS

    claimed = {(w, perm, role) for w, _, perm, role, _ in CALLS if (w, role) not in UNEXERCISED
               and any(n[:2] == (w, role) for n in needs)}
    exercised = {(w, perm, role) for (w, role, _), perms in needs.items() for perm in perms}
    assert claimed <= exercised, sorted(claimed - exercised)
    print("grants and the calls that need them:", json.dumps(
        {f"{w} {r} on {s}": p for (w, r, s), p in sorted(needs.items())}, indent=1))


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
    assert unit["User"] == "slm"  # the service user: here the operator's account too
    proc = subprocess.run(_as_operator([*argv, "--run-once"]), cwd=cwd, env={**env, **unit_env},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shutil.rmtree(orch / "__pycache__", ignore_errors=True)
    last = Path(env["PREFECT_HOME"]).parent / "state" / "runs" / "last-run.json"
    assert os.geteuid() != 0 or last.stat().st_uid == OPERATOR  # the night ran as the operator
    summary = json.loads(last.read_text())
    assert summary["status"] == "completed", summary.get("error")
