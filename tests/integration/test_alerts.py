"""automations/nightly-alerts.yaml on a real Prefect server: `slm-nightly alerts install`
creates both automations (a second install replaces them), a real nightly/production flow
run that fails makes the server's triggers and actions services POST the reactive alert to a
custom-webhook notification block, and the proactive one fires when no night completed in
its window (shortened from 26 h to 10 s in a copy of the file: Prefect's minimum)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tasks.night.alerts import ALERTS_FILE
from tests.fakes.loopback import JsonHandler, LoopbackServer
from tests.support.paths import PREFECT, ROOT
from tests.support.prefect import prefect_server as start_server

SLM = str(Path(sys.executable).parent / "slm-nightly")
FAILED, STALE = "slm-nightly — night failed", "slm-nightly — no night completed in 26 h"


class _Hook(JsonHandler):
    posts: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        _Hook.posts.append(self.read_json())
        self.send_json(200, "")


def _cli(cmd: list[str], env: dict[str, str], timeout: float = 180) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def _refused(cmd: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    return proc.stderr.strip()


def _automations(api: str) -> dict[str, dict[str, Any]]:
    rows = httpx.post(f"{api}/automations/filter", json={}, timeout=10).json()
    names = [a["name"] for a in rows]
    assert len(names) == len(set(names)), names  # replaced, never duplicated
    return {a["name"]: a for a in rows}


def test_alerts_install_and_fire_on_a_failed_night_and_on_no_completed_night(
        tmp_path: Path) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL, temporary_settings

    hook = LoopbackServer(_Hook).__enter__()
    _Hook.posts = []
    try:
        with start_server(tmp_path / "prefect-home") as env:
            api = env["PREFECT_API_URL"]
            with temporary_settings(updates={PREFECT_API_URL: api}):
                CustomWebhookNotificationBlock(
                    name="ops", url=f"{hook.url}/alert",
                    json_data={"subject": "{{subject}}", "body": "{{body}}"}).save("ops-hook")
                Secret(value="x").save("not-a-hook")
            install = [SLM, "alerts", "install", "--notify-block", "custom-webhook/ops-hook"]
            assert _refused(install, env) == (
                "slm-nightly: alerts: no deployment 'nightly/production' on the Prefect server "
                "— deploy it first (prefect deploy), then install the alerts")
            _cli([PREFECT, "work-pool", "create", "slm-orchestrator", "--type", "process"], env)
            _cli([PREFECT, "--no-prompt", "deploy", "--name", "nightly/production"], env)
            assert _refused([*install[:-1], "not-a-hook"], env) == (
                "slm-nightly: alerts: block secret/not-a-hook cannot send notifications (its "
                "type has no `notify` capability): use a Slack, email, webhook… block")
            assert not _automations(api)

            first = _cli(install, env)
            assert re.fullmatch(rf"created automation '{FAILED}' \(\S+\)\n"
                                rf"created automation '{STALE}' \(\S+\)\n", first), first
            installed = _automations(api)
            assert set(installed) == {FAILED, STALE}
            block_id = installed[FAILED]["actions"][0]["block_document_id"]
            related = [{"prefect.resource.role": "flow", "prefect.resource.name": "nightly"},
                       {"prefect.resource.role": "deployment",
                        "prefect.resource.name": "production"}]
            stale = installed[STALE]["trigger"]
            assert (stale["posture"], stale["within"], stale["threshold"], stale["expect"],
                    stale["after"], stale["for_each"], stale["match_related"]) == (
                "Proactive", 93600.0, 1, ["prefect.flow-run.Completed"],
                ["prefect.flow-run.Completed"], [], related)
            failed = installed[FAILED]["trigger"]
            assert (failed["posture"], sorted(failed["expect"]), failed["match_related"]) == (
                "Reactive", ["prefect.flow-run.Crashed", "prefect.flow-run.Failed",
                             "prefect.flow-run.TimedOut"], related)
            assert installed[STALE]["actions"][0]["block_document_id"] == block_id

            # the same names, the proactive window at Prefect's minimum: replaced in place
            data = yaml.safe_load(ALERTS_FILE.read_text())
            data["automations"][1]["trigger"]["within"] = 10
            short = tmp_path / "alerts-10s.yaml"
            short.write_text(yaml.safe_dump(data, allow_unicode=True))
            # before the call: the server starts the window when it saves the update, which
            # may be a moment before the CLI returns (CI saw it fire 9.96 s after the return)
            installed_at = time.monotonic()
            again = _cli([*install, "--file", str(short)], env)
            assert again == "".join(f"updated automation '{n}' ({installed[n]['id']})\n"
                                    for n in (FAILED, STALE))
            assert _automations(api)[STALE]["trigger"]["within"] == 10.0

            # a real run of the deployment, failing at its first line (the profile is missing)
            missing = tmp_path / "missing.toml"
            out = _cli([PREFECT, "deployment", "run", "nightly/production", "--param",
                        f"profile={missing}"], env)
            run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
            assert run_id, out
            _cli([PREFECT, "worker", "start", "--pool", "slm-orchestrator", "--run-once"], env,
                 timeout=300)
            run = httpx.get(f"{api}/flow_runs/{run_id.group(1)}", timeout=10).json()
            assert run["state"]["type"] == "FAILED", run["state"]

            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and {p["subject"] for p in _Hook.posts} < {
                    f"slm-nightly: night {run['name']} Failed",
                    "slm-nightly: no night completed in 26 h"}:
                time.sleep(1)
            subjects = [p["subject"] for p in _Hook.posts]
            assert subjects.count(f"slm-nightly: night {run['name']} Failed") == 1, _Hook.posts
            assert "slm-nightly: no night completed in 26 h" in subjects, _Hook.posts
            assert time.monotonic() - installed_at >= 10  # not before its window ended
            body = next(p["body"] for p in _Hook.posts if p["subject"].endswith("Failed"))
            assert body.startswith(f"nightly/production run {run['name']} ended Failed: ")
            assert str(missing) in body and body.endswith(
                "\nSummary: slm-nightly status --profile gcp"), body
    finally:
        hook.__exit__(None, None, None)
