"""`gcp orchestrator`: the orchestrator VM, or the script that makes any Debian 12 machine one.

The script (orchestrator.sh) installs the checkout as the service user, never root (finding 5
of issue 38: a root-owned checkout breaks every later command that writes into it), and writes
two systemd units:
- prefect-server: the Prefect server on port 4200 of every address (the firewall admits the
  node's account only; the UI comes through the IAP tunnel), with PREFECT_SERVER_API_AUTH_STRING
  (every API call but /health needs it; prefect/server/api/server.py) and PREFECT_UI_API_URL
  set to the tunnel's end, http://localhost:4200/api: without it the UI in the laptop's browser
  calls the server's own address, which the laptop cannot reach (PrefectHQ/prefect#20879).
- slm-orchestrator-worker: ordered after the server and wanting it, restarted forever
  (StartLimitIntervalSec=0: systemd's default gives up after 5 starts in 10 s, which a worker
  started before its server reaches at boot).
With Prefect Cloud there is no server unit: the worker and the CLI use the workspace URL and
the API key from Secret Manager, configured the same way.
"""

from __future__ import annotations

import shlex
from importlib.resources import files
from string import Template
from typing import Any

from tasks.gcp.clients import Clients
from tasks.gcp.code import Checkout, fetch_function
from tasks.gcp.network import ComputeResource, get_or_none
from tasks.gcp.nodes import DISK_TYPE
from tasks.gcp.reconcile import Found, GcpError
from tasks.gcp.spec import GcpSpec

SERVER_UNIT = "prefect-server"
WORKER_UNIT = "slm-orchestrator-worker"
PORT = 4200
MACHINE_TYPE = "e2-standard-2"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DISK_GB = 50
STALE_SCRIPT = ("its startup script is not this one (another checkout or other settings): "
                "setup replaces it, and it runs at the next boot or by hand")


class _Template(Template):
    delimiter = "@"


def _unit(description: str, exec_start: str, *, user: str, project_dir: str,
          after: tuple[str, ...] = (), env: dict[str, str] | None = None) -> str:
    """A service that runs forever as `user`: restarted 10 s after any exit, without systemd's
    start limit, started at boot."""
    wants = " ".join(after)
    lines = ["[Unit]", f"Description={description}",
             f"After=network-online.target {wants}".rstrip(),
             f"Wants=network-online.target {wants}".rstrip(), "StartLimitIntervalSec=0",
             "[Service]", f"User={user}", f"Group={user}", f"WorkingDirectory={project_dir}",
             "EnvironmentFile=/etc/slm-nightly/prefect.env"]
    lines += [f"Environment={k}={v}" for k, v in (env or {}).items()]
    lines += [f"ExecStart={exec_start}", "Restart=always", "RestartSec=10", "[Install]",
              "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def units(spec: GcpSpec, *, user: str = "slm", project_dir: str = "/opt/slm-nightly"
          ) -> dict[str, str]:
    """The orchestrator's systemd units, by name."""
    venv = f"{project_dir}/.venv/bin"
    out: dict[str, str] = {}
    after: tuple[str, ...] = ()
    if spec.prefect == "server":
        out[SERVER_UNIT] = _unit(
            "Prefect server (slm-nightly)",
            f"{venv}/prefect server start --host 0.0.0.0 --port {PORT}", user=user,
            project_dir=project_dir,
            env={"PREFECT_UI_API_URL": f"http://localhost:{PORT}/api"})
        after = (f"{SERVER_UNIT}.service",)
    out[WORKER_UNIT] = _unit(
        "Prefect worker, pool slm-orchestrator (slm-nightly)",
        f"{venv}/prefect worker start --pool slm-orchestrator --type process", user=user,
        project_dir=project_dir, after=after, env={"SLM_NIGHTLY_PROFILE": "gcp"})
    return out


def client_env(spec: GcpSpec, cloud_url: str | None = None) -> list[str]:
    """The lines of /etc/slm-nightly/prefect.env (values from the shell variables the script
    read from Secret Manager)."""
    if spec.prefect == "cloud":
        if not cloud_url:
            raise GcpError("gcp orchestrator: [gcp] prefect = \"cloud\" needs --cloud-url "
                           "(the workspace's API URL: https://api.prefect.cloud/api/accounts/"
                           "…/workspaces/…)")
        return [f"PREFECT_API_URL={cloud_url}", "PREFECT_API_KEY=$PREFECT_API_KEY"]
    return [f"PREFECT_API_URL=http://127.0.0.1:{PORT}/api",
            "PREFECT_API_AUTH_STRING=$PREFECT_AUTH",
            "PREFECT_SERVER_API_AUTH_STRING=$PREFECT_AUTH"]


def script(spec: GcpSpec, checkout: Checkout, *, user: str = "slm",
           project_dir: str = "/opt/slm-nightly", cloud_url: str | None = None) -> str:
    """The bash script that makes a Debian 12 machine the orchestrator (module docstring)."""
    q = shlex.quote
    if spec.prefect == "server":
        secret = spec.prefect_auth_secret
        reads = f"PREFECT_AUTH=$(gcloud secrets versions access latest --secret={q(secret)})"
    else:
        reads = ("PREFECT_API_KEY=$(gcloud secrets versions access latest "
                 f"--secret={q(spec.prefect_key_secret or '')})")
    written = units(spec, user=user, project_dir=project_dir)
    unit_lines = "\n".join(f"cat > /etc/systemd/system/{name}.service <<'UNIT'\n{text}UNIT"
                           for name, text in written.items())
    bashrc = "\n".join(["export SLM_NIGHTLY_PROFILE=gcp",
                        f"export PATH={project_dir}/.venv/bin:$PATH",
                        "set -a; . /etc/slm-nightly/prefect.env; set +a"])
    dirs = (f'install -d -o "$user" -g "$user" {" ".join(map(q, spec.data_dirs))}'
            if spec.data_dirs else "# (the profile names no folder outside the checkout)")
    return _Template(files("tasks.gcp").joinpath("orchestrator.sh").read_text()).substitute(
        user=q(user), home=q(f"/var/lib/{user}"), project_dir=q(project_dir),
        fetch_code=fetch_function(checkout), code_version=checkout.version, secrets=reads,
        client_env="\n".join(client_env(spec, cloud_url)),
        bashrc=bashrc, units=unit_lines,
        data_dirs=dirs, enable=" ".join(written))


class OrchestratorVm(ComputeResource):
    """The VM: Debian 12, the orchestrator's account, no external address, the static
    internal address, the script as its startup-script (it runs at every boot and skips what
    is done; setup on an existing VM puts a new one in place of a stale one)."""

    kind = "vm"

    def __init__(self, spec: GcpSpec, clients: Clients, startup: str) -> None:
        super().__init__(spec.orchestrator, spec, clients)
        self.startup = startup

    def _client(self) -> Any:
        return self.clients.compute("InstancesClient")

    def read(self) -> Found:
        s = self.spec
        vm = get_or_none(str(self), lambda: self._client().get(
            project=s.project, zone=s.home_zone, instance=self.name))
        if vm is None:
            return Found(False)
        self.metadata = vm.metadata  # setMetadata replaces every item: repair keeps the others
        accounts = [a.email for a in vm.service_accounts]
        drift = [] if accounts == [s.orchestrator_email] else [
            f"runs as {accounts}, not {s.orchestrator_email}"]
        script = next((i.value for i in vm.metadata.items if i.key == "startup-script"), None)
        if script != self.startup:
            drift.append(STALE_SCRIPT)
        return Found(True, drift, f"{vm.status} at {vm.network_interfaces[0].network_i_p}")

    def plan(self) -> str:
        return (f"instances.insert {MACHINE_TYPE} in {self.spec.home_zone}, Debian 12, "
                f"{DISK_GB} GB {DISK_TYPE}, no external address, as {self.spec.orchestrator_email}")

    def create(self) -> None:
        from google.cloud import compute_v1

        s = self.spec
        address = self.clients.compute("AddressesClient").get(
            project=s.project, region=s.home_region, address=s.orchestrator_ip).address
        body = compute_v1.Instance(
            name=self.name,
            machine_type=f"zones/{s.home_zone}/machineTypes/{MACHINE_TYPE}",
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True,
                                           initialize_params=compute_v1.AttachedDiskInitializeParams(
                                               source_image=IMAGE, disk_size_gb=DISK_GB,
                                               disk_type=f"zones/{s.home_zone}/diskTypes/{DISK_TYPE}"))],
            network_interfaces=[compute_v1.NetworkInterface(subnetwork=s.subnet_url,
                                                            network_i_p=address)],
            service_accounts=[compute_v1.ServiceAccount(
                email=s.orchestrator_email,
                scopes=["https://www.googleapis.com/auth/cloud-platform"])],
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script",
                                                                 value=self.startup)]),
            labels={"made-by": "slm-nightly"})
        self.call("insert", lambda: self._client().insert_unary(
            project=s.project, zone=s.home_zone, instance_resource=body), zone=s.home_zone)

    def repair(self, found: Found) -> None:
        """A new startup script (this checkout, these settings) goes into the VM's metadata; it
        runs at the next boot or by hand. Another account is not repairable in place."""
        if found.drift != [STALE_SCRIPT]:
            raise GcpError(f"{self}: {'; '.join(found.drift)} — delete the VM "
                           "(`gcloud compute instances delete …`) and run `gcp orchestrator` "
                           "again")
        from google.cloud import compute_v1

        s = self.spec
        kept = [compute_v1.Items(key=i.key, value=i.value) for i in self.metadata.items
                if i.key != "startup-script"]
        body = compute_v1.Metadata(fingerprint=self.metadata.fingerprint, items=[
            *kept, compute_v1.Items(key="startup-script", value=self.startup)])
        self.call("setMetadata", lambda: self._client().set_metadata_unary(
            project=s.project, zone=s.home_zone, instance=self.name, metadata_resource=body),
            zone=s.home_zone)

    def delete(self) -> None:
        s = self.spec
        self.call("delete", lambda: self._client().delete_unary(
            project=s.project, zone=s.home_zone, instance=self.name), zone=s.home_zone)
