"""`slm-nightly gcp orchestrator`'s script and units: what the findings of issue 38 ask of them,
read from the rendered text, and the server's and the worker's environment run for real — a
Prefect server with the script's auth string refuses a caller without it, the worker unit's
ExecStart with the unit's environment polls its pool, and the UI is told the tunnel's URL."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from tasks.gcp import orchestrator
from tasks.gcp.code import Checkout
from tasks.gcp.spec import GcpSpec
from tests.support.paths import ROOT
from tests.support.prefect import prefect_server

SPEC = GcpSpec(project="acme", zones=["us-central1-a"], bucket="acme-slm")
# a packed checkout (tasks/gcp/code.py pack; the fetch runs for real in test_checkout_fetch.py)
CHECKOUT = Checkout("acme-slm", ("Makefile", "pyproject.toml"), b"a tar.gz")


def unit(text: str) -> dict[str, list[str]]:
    """A unit file's keys (repeatable ones in order)."""
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("["):
            k, _, v = line.partition("=")
            keys.setdefault(k, []).append(v)
    return keys


def test_the_units_order_the_worker_after_the_server_and_never_give_up() -> None:
    units = orchestrator.units(SPEC)
    assert list(units) == ["prefect-server", "slm-orchestrator-worker"]
    worker, server = unit(units["slm-orchestrator-worker"]), unit(units["prefect-server"])
    assert worker["After"] == ["network-online.target prefect-server.service"]
    assert worker["Wants"] == ["network-online.target prefect-server.service"]
    for u in (worker, server):
        # systemd's default start limit (5 in 10 s) stops a worker that starts before its
        # server at boot for good; 0 turns the limit off (systemd.unit(5))
        assert u["StartLimitIntervalSec"] == ["0"]
        assert (u["Restart"], u["RestartSec"]) == (["always"], ["10"])
        assert (u["User"], u["Group"]) == (["slm"], ["slm"])  # finding 5: never root
        assert u["EnvironmentFile"] == ["/etc/slm-nightly/prefect.env"]
        assert u["WantedBy"] == ["multi-user.target"]
    assert server["Environment"] == ["PREFECT_UI_API_URL=http://localhost:4200/api"]
    assert server["ExecStart"] == ["/opt/slm-nightly/.venv/bin/prefect server start --host "
                                   "0.0.0.0 --port 4200"]


def test_the_cloud_path_has_no_server_and_the_same_worker() -> None:
    cloud = SPEC.model_copy(update={"prefect": "cloud", "prefect_key_secret": "prefect-key"})
    units = orchestrator.units(cloud)
    assert list(units) == ["slm-orchestrator-worker"]
    assert unit(units["slm-orchestrator-worker"])["After"] == ["network-online.target"]
    text = orchestrator.script(cloud, CHECKOUT, cloud_url="https://api.prefect.cloud/api/"
                               "accounts/a/workspaces/w")
    assert "gcloud secrets versions access latest --secret=prefect-key" in text
    assert "PREFECT_API_URL=https://api.prefect.cloud/api/accounts/a/workspaces/w\n" \
           "PREFECT_API_KEY=$PREFECT_API_KEY\n" in text
    with pytest.raises(Exception, match="needs --cloud-url"):
        orchestrator.script(cloud, CHECKOUT)


def test_the_script_installs_as_the_service_user_and_is_valid_bash(tmp_path: Path) -> None:
    text = orchestrator.script(SPEC, CHECKOUT)
    path = tmp_path / "o.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # the checkout from the bucket, not a clone (finding 11): fetched when the folder holds
    # another version (or none), then the user's; every command that writes into it after
    # that runs as the user (finding 5)
    assert "git " not in text
    assert (f'if [ "$(cat "$dir/.code-version" 2>/dev/null)" != {CHECKOUT.version} ]; then\n'
            '  fetch_code "$dir"\n  chown -R "$user": "$dir"\n  fresh=1\nfi\n') in text
    assert f"gs://acme-slm/code/checkout-{CHECKOUT.version}.tar.gz" in text
    assert "runuser -u \"$user\" -- make -C \"$dir\" .venv/.installed-stamp" in text
    assert not re.search(r"^(sudo |git |make )", text, re.M)
    # the install is `make`, which Debian's cloud images lack: the script installs it first
    assert "for pkg in python3-venv make cmake g++ curl; do" in text
    # finding 7: the folders the night reads exist, the user's (the profile's [sources], [corpus])
    with_dirs = SPEC.model_copy(update={"data_dirs": ["/srv/slm/transcripts", "/srv/slm/c d"]})
    assert "install -d -o \"$user\" -g \"$user\" /srv/slm/transcripts '/srv/slm/c d'\n" in \
        orchestrator.script(with_dirs, CHECKOUT)
    # the auth string comes from Secret Manager, never from the command line or metadata
    assert "PREFECT_AUTH=$(gcloud secrets versions access latest --secret=slm-prefect-auth)" \
           in text
    assert text.rstrip().endswith("systemctl enable --now prefect-server slm-orchestrator-worker"
                                  "\n# a new checkout: the units run its code from now on\n"
                                  '[ -z "$fresh" ] || systemctl restart prefect-server '
                                  "slm-orchestrator-worker")


def _env_file(text: str, auth: str) -> dict[str, str]:
    body = text.split("cat > /etc/slm-nightly/prefect.env <<ENV\n", 1)[1].split("\nENV", 1)[0]
    return {k: v.replace("$PREFECT_AUTH", auth) for k, _, v in
            (ln.partition("=") for ln in body.splitlines())}


def test_the_server_and_worker_environment_run_for_real(tmp_path: Path) -> None:
    auth = "slm:s3cret-from-secret-manager"
    text = orchestrator.script(SPEC, CHECKOUT)
    env_file = _env_file(text, auth)
    assert set(env_file) == {"PREFECT_API_URL", "PREFECT_API_AUTH_STRING",
                             "PREFECT_SERVER_API_AUTH_STRING"}
    server = unit(orchestrator.units(SPEC)["prefect-server"])
    ui = dict(e.split("=", 1) for e in server["Environment"])
    settings = {k: v for k, v in {**env_file, **ui}.items() if k != "PREFECT_API_URL"}
    with prefect_server(tmp_path / "home", **settings) as env:
        api = env["PREFECT_API_URL"]
        assert httpx.get(f"{api}/health", timeout=10).status_code == 200  # probes stay open
        refused = httpx.post(f"{api}/work_pools/filter", json={}, timeout=10)
        assert refused.status_code == 401, refused.text
        # the UI in the laptop's browser calls the tunnel's end, not the VM's address
        ui_settings = httpx.get(api.removesuffix("/api") + "/ui-settings", timeout=10).json()
        assert ui_settings["api_url"] == "http://localhost:4200/api"
        # the worker unit, its ExecStart with the venv mapped, once, on the unit's environment
        worker = unit(orchestrator.units(SPEC)["slm-orchestrator-worker"])
        argv = shlex.split(worker["ExecStart"][0].replace("/opt/slm-nightly", str(ROOT)))
        unit_env = {**env, **env_file, "PREFECT_API_URL": api,
                    **dict(e.split("=", 1) for e in worker["Environment"])}
        done = subprocess.run([*argv, "--run-once"], env=unit_env, capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        pools = httpx.post(f"{api}/work_pools/filter", json={}, timeout=10,
                           auth=tuple(auth.split(":", 1))).json()  # type: ignore[arg-type]
        assert [p["name"] for p in pools] == ["slm-orchestrator"]
        # without the auth string the same worker cannot even read its pool
        bare = {k: v for k, v in unit_env.items() if k != "PREFECT_API_AUTH_STRING"}
        failed = subprocess.run([*argv, "--run-once"], env=bare, capture_output=True,
                                text=True, timeout=120, cwd=ROOT)
        assert failed.returncode != 0
        assert "401" in failed.stdout + failed.stderr
