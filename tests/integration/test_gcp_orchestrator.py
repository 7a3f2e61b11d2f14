"""`slm-nightly gcp orchestrator`'s script and units: what the findings of issue 38 ask of them,
read from the rendered text, and the script run for real as the VM boots (issue 50, item 3) —
its units' Prefect server refuses a caller without the script's auth string, the worker polls
its pool, and the UI is told the tunnel's URL."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tasks.gcp import orchestrator
from tasks.gcp.code import Checkout
from tasks.gcp.spec import GcpSpec
from tests.fakes.node_runtime import FakeNode
from tests.support import apt
from tests.support.gcp_world import set_up_project, spec_of
from tests.support.paths import ROOT

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
    assert "runuser -u \"$user\" -- make -C \"$dir\" install" in text
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


AUTH = "slm:s3cret-from-secret-manager"
# the checkout's own install stands in for the project's (tests/integration/test_node_install.py
# runs that one for real, from /): the venv it leaves, its prefect this machine's; each run
# records who ran it
MAKEFILE = """\
install: .venv/.installed-stamp
.venv/.installed-stamp: pyproject.toml
\tmkdir -p .venv/bin
\tln -sf {venv}/bin/prefect .venv/bin/prefect
\tid -u >> .venv/installed-by
\ttouch $@
"""


def _checkout(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    (root / "Makefile").write_text(MAKEFILE.format(venv=ROOT / ".venv"))
    (root / "pyproject.toml").write_text("[project]\nname = 'slm-nightly'\n")
    return root


def test_the_script_runs_from_root_at_each_boot_and_its_units_serve_with_the_auth_string(
        tmp_path: Path) -> None:
    """orchestrator.sh as `gcp orchestrator` renders it, run by bash from / when the VM reaches
    RUNNING (tests/fakes/node_runtime.py), as root: Debian 12's packages it lacks from apt, the
    user, the checkout fetched from the bucket with the VM account's token, `make install` run
    as the user, the auth string from Secret Manager into a file root and the user read, the
    units started by `systemctl enable --now`: the server refuses a caller without the string,
    tells the UI the tunnel's URL, and the worker creates and polls its pool. The next boot
    skips what is done and serves again. Stand-ins: apt-get and dpkg (tests/support/apt.py)."""
    from tasks.gcp.code import pack, push
    from tasks.gcp.reconcile import run
    from tasks.shared.processes import free_port, release_port

    with set_up_project(tmp_path) as world:
        world.compute.network.add_image("debian-12-bookworm-v20261201", "debian-12",
                                        project="debian-cloud")
        spec = spec_of(tmp_path / "p.toml").model_copy(update={"data_dirs": ["/srv/slm/in box"]})
        checkout = pack(_checkout(tmp_path / "repo"), spec.bucket)
        push(checkout, world.clients())
        port = free_port()
        node = FakeNode(tmp_path / "vms", ownership=True, only={spec.orchestrator},
                        secrets={spec.prefect_auth_secret: AUTH}, forbid=(str(ROOT),))
        d = node.dir(spec.home_zone, spec.orchestrator)
        calls = tmp_path / "CALLS"
        have = apt.standins(tmp_path / "bin", calls, apt.DEBIAN_12, installed=("curl",))
        node.env["PATH"] = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
        node.paths = {"/opt/slm-nightly": f"{d}/opt/slm-nightly", "/var/lib/slm": f"{d}/home/slm",
                      "/srv/slm": f"{d}/srv/slm",
                      "https://storage.googleapis.com": world.storage.url,
                      "0.0.0.0 --port 4200": f"127.0.0.1 --port {port}",
                      "127.0.0.1:4200": f"127.0.0.1:{port}", "localhost:4200": f"localhost:{port}"}
        node.attach(world.compute)
        inst = None
        try:
            vm = orchestrator.OrchestratorVm(spec, world.clients(), orchestrator.script(
                spec, checkout))
            assert [o.state for o in run([vm], "setup", lambda _: None)] == ["created"]
            inst = world.compute.instances[(spec.home_zone, spec.orchestrator)]
            # pd-balanced: the API's default is pd-standard (0.12 MiB/s a GB: 6 MiB/s for the
            # first boot's install and the Prefect server's database)
            disk = world.compute.network.disks[(spec.home_zone, spec.orchestrator)]
            assert (disk["type"], disk["sizeGb"]) == ("pd-balanced", 50), disk
            for boot in (1, 2):
                if boot == 2:
                    node.power_off(inst)
                    node.boot(inst)
                _served(node, spec, port)
            log = node.log(spec.home_zone, spec.orchestrator)
        finally:
            if inst is not None:
                node.power_off(inst)
            node.close()
            release_port(port)
        uid = node.uid(spec.home_zone, spec.orchestrator, "slm")
        assert uid is not None, log
        # apt once, for what the image lacked; the next boot finds them installed
        assert [c for c in calls.read_text().splitlines() if " install " in c] == [
            "apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv make cmake g++"]
        assert have.read_text().split() == ["curl", "python3-venv", "make", "cmake", "g++"]
        # the checkout the user's, installed once, by the user
        opt = d / "opt" / "slm-nightly"
        assert (opt / ".code-version").read_text() == checkout.version + "\n"
        assert (opt / ".venv" / "installed-by").read_text() == f"{uid}\n"
        assert {p.lstat().st_uid for p in opt.rglob("*")} == {uid}
        assert (d / "srv" / "slm" / "in box").stat().st_uid == uid
        env = d / "etc" / "slm-nightly" / "prefect.env"
        assert (env.stat().st_mode & 0o777, env.stat().st_uid, env.stat().st_gid) == (0o640, 0, uid)
        assert env.read_text() == (f"PREFECT_API_URL=http://127.0.0.1:{port}/api\n"
                                   f"PREFECT_API_AUTH_STRING={AUTH}\n"
                                   f"PREFECT_SERVER_API_AUTH_STRING={AUTH}\n")
        bashrc = (d / "home" / "slm" / ".bashrc").read_text()
        assert bashrc.count("export SLM_NIGHTLY_PROFILE=gcp\n") == 1  # not appended again
        assert AUTH not in log


def _served(node: FakeNode, spec: GcpSpec, port: int) -> None:
    """The script finished, and the units it started serve: the API refuses a caller without
    the auth string, the UI is told the tunnel's end, the worker polls its pool as the user."""
    zone, name = spec.home_zone, spec.orchestrator
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 300
    while (rc := node.script_exit(zone, name)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rc == 0, node.log(zone, name)[-4000:]
    pools: list[str] = []
    while time.monotonic() < deadline and pools != ["slm-orchestrator"]:
        time.sleep(1)
        try:
            got = httpx.post(f"{api}/work_pools/filter", json={}, timeout=10,
                             auth=tuple(AUTH.split(":", 1)))  # type: ignore[arg-type]
        except httpx.TransportError:
            continue
        pools = [p["name"] for p in got.json()] if got.status_code == 200 else []
    assert pools == ["slm-orchestrator"], node.log(zone, name)[-4000:]
    assert httpx.get(f"{api}/health", timeout=10).status_code == 200  # probes stay open
    refused = httpx.post(f"{api}/work_pools/filter", json={}, timeout=10)
    assert refused.status_code == 401, refused.text
    ui = httpx.get(api.removesuffix("/api") + "/ui-settings", timeout=10).json()
    assert ui["api_url"] == f"http://localhost:{port}/api"  # the unit's 4200, mapped
    uid = node.uid(zone, name, "slm")
    for unit in orchestrator.units(spec):
        assert node.unit_uid(zone, name, unit) == uid
