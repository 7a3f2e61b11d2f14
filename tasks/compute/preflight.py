"""Preflight of a GCE profile: everything that would fail a night and can be found without a
GPU hour, each failure with its fix.

`run_preflight(cfg)` asks Google and the Prefect API, and reads the profile:
- IAM: the orchestrator's credentials hold the instance permissions the night uses
  (Compute's `instances.testIamPermissions`, per zone) and the bucket's (Cloud Storage's
  `testIamPermissions`); `iam.serviceAccounts.actAs` on the node's service account through the
  IAM API where the Compute API is Google's own (a custom api_endpoint — a private endpoint or
  the test fake — skips it: the fake does not model the IAM API);
- each node's instance in each zone (GceCompute.nodes: node i ≥ 2 is `{instance}-{i}`): it
  exists, is a g2-standard-4 with one nvidia-l4, terminates on host maintenance, and runs as a
  service account that is not the orchestrator's;
- the GPU quota (Compute's `regions.get` and `projects.get`): in each region of the profile's
  zones, `limit - usage` of the L4 quota of each provisioning model the night may use — spot:
  PREEMPTIBLE_NVIDIA_L4_GPUS (NVIDIA_L4_GPUS where the preemptible limit is 0: a Spot VM
  without preemptible quota uses the standard one); on-demand (`provisioning`, or
  `on_demand_fallback`): NVIDIA_L4_GPUS — is at least `nodes`, and GPUS_ALL_REGIONS too;
- each instance reaches Google's APIs: with no external IP (no accessConfigs, as
  `--no-address` creates it) its subnet (`subnetworks.get`) has Private Google Access, or a
  Cloud NAT of the region (`routers.list`) covers the subnet — else the node cannot read the
  bucket or its secrets;
- each bucket the profile names exists and takes a write;
- Secret-typed fields of the loaded blocks are not empty (the profile load already failed on
  a saved block that does not load);
- the graph phase 1 writes ([graph]): Neo4j, or a FalkorDB server with a host, is opened and
  answers a read (a wrong URI, port or password fails here, naming the URI — never the
  password); an embedded FalkorDB is started by phase 1 itself;
- the [sources] folders and the [corpus] root are readable directories on this machine (phase
  1 and the scorecard run on the orchestrator: flows/nightly.py calls them in-process);
- the Prefect API answers; the node's work pool and the training deployment exist, the
  deployment is on that pool and pulls this checkout's code from GCS (its version is this
  checkout's, tasks/code_version.py); outside a night, the
  orchestrator's deployments (nightly/production, node-reaper/production) too;
- the node's engine can load its model's architecture (tasks/compute/engines.py, from the
  engine's own list) and speaks the inference block's dialect; the startup script's worker
  runs from the node's checkout ({project_dir}/.venv/bin/prefect: a process worker runs each
  flow in its own Python) with a Prefect API URL — not the shipped placeholder
  (PLACEHOLDER_MARKER), not the orchestrator's loopback (allowed only where the nodes' own
  internal IPs are loopback addresses: the fake Compute Engine's, on this machine), and
  answering `GET <url>/health` from the orchestrator (in the same VPC as the node);
- the training recipe's own preflight (tasks/training/preflight.py) for the node's memory.

The nightly runs it (`night=True`) before it boots anything; `slm-nightly preflight` prints it
(and, when PREFECT_API_URL is unset, says so before it loads any saved block: `api_url_unset`).
The node's Secret Manager secrets ([compute.node] prefect_api_key_secret, engine_api_key_secret)
exist with an enabled latest version (projects.secrets.versions.get with the orchestrator's
credentials, which need roles/secretmanager.viewer: metadata, never the value). Not checked:
that the node's own account may read them (a secret's IAM policy does not show grants inherited
from the project, folder or organisation, nor through groups: such a check would fail projects
that are ready).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocks.gce import GceCompute
from tasks.errors import ConfigError

if TYPE_CHECKING:
    from tasks.profile import Profile

MACHINE_TYPE = "g2-standard-4"
ACCELERATOR = ("nvidia-l4", 1)
# What GceNode calls on an instance (tasks/compute/gce.py), as Compute names the permissions
# (https://cloud.google.com/compute/docs/reference/rest/v1/instances: each method's IAM line).
INSTANCE_PERMISSIONS = (
    "compute.instances.get", "compute.instances.start", "compute.instances.stop",
    "compute.instances.setMetadata", "compute.instances.setScheduling",
    "compute.instances.getGuestAttributes")
# What the artifact store, the dataset hand-over and the run records do in the bucket.
BUCKET_PERMISSIONS = ("storage.objects.create", "storage.objects.get",
                      "storage.objects.list", "storage.objects.delete")
ORCHESTRATOR_DEPLOYMENTS = ("nightly/production", "node-reaper/production")
PULL_FROM_GCS = "prefect_gcp.deployments.steps.pull_from_gcs"
DEPLOY_NODE = "prefect --no-prompt deploy --name train/node"
DEPLOY_ALL = ("prefect --no-prompt deploy --name nightly/production --name "
              "node-reaper/production --name train/node --name nightly/extract --name "
              "nightly/retrain")
INSTANCE_ADMIN = "grant the orchestrator's account roles/compute.instanceAdmin.v1 on the instance"
# profiles/gcp.toml's prefect_api_url until the operator sets it: refused by the preflight
PLACEHOLDER_MARKER = "ORCHESTRATOR_VPC_IP"
# hosts that, in the node's prefect_api_url, are the node itself and never the orchestrator
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
API_URL_FIX = ("`prefect config set PREFECT_API_URL=http://<orchestrator>:4200/api` on the "
               "orchestrator (Prefect Cloud: `prefect cloud login`)")
# Compute's quota metrics (regions.get / projects.get `quotas[].metric`)
SPOT_L4, ON_DEMAND_L4, ALL_GPUS = "PREEMPTIBLE_NVIDIA_L4_GPUS", "NVIDIA_L4_GPUS", "GPUS_ALL_REGIONS"


@dataclass(frozen=True)
class Check:
    """One check: `ok` False is a failure, and `fix` says what to do about it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False  # did not apply (ok stays True): `detail` says why

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else "ok" if self.ok else "failed"

    def line(self) -> str:
        text = f"{self.status.upper():7} {self.name}: {self.detail}"
        return text + (f" — fix: {self.fix}" if self.fix and not self.ok else "")


@dataclass
class PreflightReport:
    profile: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return not self.failed

    def text(self) -> str:
        head = f"preflight of profile {self.profile}: " + (
            "all checks passed" if self.ok else f"{len(self.failed)} of {len(self.checks)} "
            "checks failed")
        return "\n".join([head, *(c.line() for c in self.checks)])

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "ok": self.ok,
                "checks": [asdict(c) | {"status": c.status} for c in self.checks]}


class PreflightFailed(ConfigError):
    """The nightly's preflight failed: nothing was booted."""

    def __init__(self, report: PreflightReport) -> None:
        super().__init__("; ".join(f"{c.name}: {c.detail} — fix: {c.fix}" for c in report.failed))
        self.report = report


def _ok(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def _fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, False, detail, fix)


def _skip(name: str, why: str) -> Check:
    return Check(name, True, why, skipped=True)


def trains_on_node(cfg: Profile) -> bool:
    """Whether a night on this profile can reach training (a corpus to score, training on)."""
    return bool(cfg.training.enabled and cfg.corpus.root)


def run_preflight(cfg: Profile, *, night: bool = False) -> PreflightReport:
    """Every check for the profile's GCE node (see the module docstring). `night`: the checks
    tonight's run depends on — the orchestrator's own deployments are left out (the run is
    already going)."""
    report = PreflightReport(cfg.name)
    block = cfg.compute
    if not isinstance(block, GceCompute):
        report.checks.append(_skip("compute", f"{type(block).__name__}: not a GCE node, "
                                   "nothing to check"))
        return report
    add = report.checks.append
    creds, email = None, None
    try:
        creds = _credentials(block)
        email = _email(creds)
        who = email or "an account whose e-mail the credentials do not say"
        add(_ok("credentials", f"the orchestrator acts as {who}"))
    except Exception as e:  # noqa: BLE001 - google.auth's DefaultCredentialsError and kin
        add(_fail("credentials", f"{type(e).__name__}: {str(e)[:300]}",
                  "set the compute block's gcp_credentials, or give the orchestrator "
                  "Application Default Credentials (its VM's service account, or `gcloud auth "
                  "application-default login`)"))
    node_ips: list[str] = []  # the instances' internal IPs, as instances.get gives them
    if creds is not None:
        report.checks.extend(_compute_checks(block, email, creds, node_ips))
        report.checks.extend(_quota_checks(block, creds))
        report.checks.extend(_node_secret_checks(block, creds))
    training = trains_on_node(cfg)
    report.checks.extend(_bucket_checks(cfg, training, email))
    report.checks.extend(_secret_checks(cfg))
    report.checks.extend(_graph_checks(cfg))
    report.checks.extend(_folder_checks(cfg))
    report.checks.extend(_prefect_checks(cfg, block, night, training))
    report.checks.extend(_node_checks(cfg, block, training, node_ips))
    report.checks.extend(_recipe_checks(cfg, training))
    report.checks.append(_environment_check(cfg, training))
    return report


# --- Google: credentials, instances, IAM --------------------------------------------------------
def _credentials(block: GceCompute) -> Any:
    """The credentials the block's clients use (blocks/gce.py get_compute_clients)."""
    if block.gcp_credentials is not None:
        return block.gcp_credentials.get_credentials_from_service_account()
    import google.auth

    creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return creds


def _email(creds: Any) -> str | None:
    email = getattr(creds, "service_account_email", None)
    return email if email and email != "default" else None  # GCE metadata creds before refresh


def _client(block: GceCompute, creds: Any, kind: str) -> Any:
    """A compute_v1 client (`kind`: "RegionsClient", ...) as get_compute_clients builds its
    own: REST, the same credentials and api_endpoint."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    opts = ClientOptions(api_endpoint=block.api_endpoint) if block.api_endpoint else None
    return getattr(compute_v1, kind)(transport="rest", credentials=creds, client_options=opts)


def _compute_checks(block: GceCompute, email: str | None, creds: Any,
                    node_ips: list[str]) -> Iterator[Check]:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    client, _ = block.get_compute_clients()
    subnets, routers = _client(block, creds, "SubnetworksClient"), None
    for node, zone in ((n, z) for n in block.node_blocks() for z in n.zones()):
        where = f"instance {zone}/{node.instance_in(zone)}"
        try:
            inst = client.get(project=block.project, zone=zone, instance=node.instance_in(zone))
        except gexc.NotFound:
            yield _fail(where, f"{node.where(zone)} not found",
                        "create it (docs/operator-gcp.md, section 4) or fix project/zone/"
                        "instance/zone_instances in the profile" + (
                            f" (nodes = {block.nodes}: node i ≥ 2 is the instance "
                            f"{block.instance}-i, built like the first)" if block.nodes > 1
                            else ""))
            continue
        except Exception as e:  # noqa: BLE001 - Forbidden, another API error, the network
            yield _fail(where, f"cannot read {node.where(zone)}: {_message(e)}",
                        INSTANCE_ADMIN if isinstance(e, gexc.Forbidden) else
                        "check the project id, api_endpoint and the Compute API (gcloud "
                        "services enable compute.googleapis.com)")
            continue
        yield from _shape_checks(where, inst, email)
        node_ips.extend(n.network_i_p for n in inst.network_interfaces[:1] if n.network_i_p)
        if routers is None:
            routers = _client(block, creds, "RoutersClient")
        yield _network_check(block, where, inst, subnets, routers)
        try:
            granted = set(client.test_iam_permissions(
                project=block.project, zone=zone, resource=node.instance_in(zone),
                test_permissions_request_resource=compute_v1.TestPermissionsRequest(
                    permissions=list(INSTANCE_PERMISSIONS))).permissions)
        except Exception as e:  # noqa: BLE001
            yield _fail(f"{where}: IAM", f"testIamPermissions failed: {_message(e)}",
                        INSTANCE_ADMIN)
        else:
            missing = [p for p in INSTANCE_PERMISSIONS if p not in granted]
            yield (_fail(f"{where}: IAM", f"the orchestrator lacks {', '.join(missing)}",
                         INSTANCE_ADMIN) if missing else
                   _ok(f"{where}: IAM", f"{len(INSTANCE_PERMISSIONS)} instance permissions held"))
        yield _act_as(block, where, inst, creds)


def _message(e: Exception) -> str:
    return f"{type(e).__name__}: {getattr(e, 'message', None) or str(e)[:300]}"


def _shape_checks(where: str, inst: Any, email: str | None) -> Iterator[Check]:
    machine = inst.machine_type.rsplit("/", 1)[-1]
    yield (_ok(f"{where}: machine type", machine) if machine == MACHINE_TYPE else
           _fail(f"{where}: machine type", f"{machine}, not {MACHINE_TYPE}",
                 f"stop it and `gcloud compute instances set-machine-type "
                 f"{inst.name} --machine-type={MACHINE_TYPE}` (the recipes and memory checks "
                 "assume its 16 GB RAM and one L4)"))
    gpus = [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
            for a in inst.guest_accelerators]
    yield (_ok(f"{where}: GPU", "1 x nvidia-l4") if gpus == [ACCELERATOR] else
           _fail(f"{where}: GPU", f"accelerators {gpus or 'none'}, not one nvidia-l4",
                 "recreate the instance as a g2-standard-4 (which comes with one L4)"))
    maintenance = inst.scheduling.on_host_maintenance
    yield (_ok(f"{where}: scheduling", "onHostMaintenance TERMINATE")
           if maintenance == "TERMINATE" else
           _fail(f"{where}: scheduling", f"onHostMaintenance {maintenance or 'unset'}",
                 f"`gcloud compute instances set-scheduling {inst.name} "
                 "--maintenance-policy=TERMINATE` (a GPU VM cannot live-migrate)"))
    accounts = [a.email for a in inst.service_accounts]
    if not accounts:
        yield _fail(f"{where}: service account", "the instance runs without a service account",
                    "`gcloud compute instances set-service-account` with the node's own "
                    "account (slm-node@…; it reads the bucket and its secrets)")
    elif email and email in accounts:
        yield _fail(f"{where}: service account", f"{email} is the orchestrator's own account",
                    "give the node its own service account (docs/operator-gcp.md, section 2): "
                    "the node needs the bucket and its secrets, not instance admin")
    else:
        yield _ok(f"{where}: service account", ", ".join(accounts))


SUBNET_URL = re.compile(r"projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)$")


def _network_check(block: GceCompute, where: str, inst: Any, subnets: Any, routers: Any
                   ) -> Check:
    """Whether the node reaches Cloud Storage and Secret Manager: an instance without an
    external IP (`--no-address`: no accessConfigs) needs Private Google Access on its subnet
    (subnetworks.get privateIpGoogleAccess) or a Cloud NAT that covers the subnet."""
    name = f"{where}: network"
    if not inst.network_interfaces:
        return _fail(name, "the instance has no network interface", "recreate it "
                     "(docs/operator-gcp.md, section 4)")
    nic = inst.network_interfaces[0]
    if nic.access_configs:
        return _ok(name, "an external IP: Google's APIs are reached without Private Google "
                   "Access")
    m = SUBNET_URL.search(nic.subnetwork or "")
    if m is None:
        return _skip(name, f"subnetwork {nic.subnetwork or 'not given'}: not a regional "
                     "subnet URL, Private Google Access not checked")
    project, region, subnet = m.groups()
    fix = (f"`gcloud compute networks subnets update {subnet} --region={region} "
           "--enable-private-ip-google-access` (or a Cloud NAT for the subnet: `gcloud compute "
           "routers nats create`)")
    try:
        sub = subnets.get(project=project, region=region, subnetwork=subnet)
    except Exception as e:  # noqa: BLE001 - Forbidden, NotFound, the network
        return _fail(name, f"cannot read subnet {region}/{subnet}: {_message(e)}",
                     "grant the orchestrator roles/compute.networkViewer on the project, or "
                     "check the instance's subnet")
    if sub.private_ip_google_access:
        return _ok(name, f"no external IP; subnet {region}/{subnet} has Private Google Access")
    try:
        nats = [(r.name, n.name) for r in routers.list(project=project, region=region)
                if r.network.rsplit("/", 1)[-1] == sub.network.rsplit("/", 1)[-1]
                for n in r.nats if _nat_covers(n, subnet)]
    except Exception as e:  # noqa: BLE001
        return _fail(name, f"no external IP, subnet {region}/{subnet} has no Private Google "
                     f"Access, and its Cloud NATs could not be read: {_message(e)}",
                     fix + "; roles/compute.networkViewer lets the preflight see a Cloud NAT")
    if nats:
        return _ok(name, f"no external IP; Cloud NAT {nats[0][0]}/{nats[0][1]} covers subnet "
                   f"{region}/{subnet}")
    return _fail(name, f"no external IP, and subnet {region}/{subnet} has neither Private "
                 "Google Access nor a Cloud NAT: the node cannot reach Cloud Storage or Secret "
                 "Manager (its datasets, adapters and secrets)", fix)


def _nat_covers(nat: Any, subnet: str) -> bool:
    if nat.source_subnetwork_ip_ranges_to_nat.startswith("ALL_SUBNETWORKS"):
        return True
    return any(s.name.rsplit("/", 1)[-1] == subnet for s in nat.subnetworks)


def _quota_checks(block: GceCompute, creds: Any) -> Iterator[Check]:
    """The L4 quota of each provisioning model the night may start with, per region of the
    profile's zones (regions.get), and GPUS_ALL_REGIONS (projects.get): `nodes` GPUs free."""
    need = block.nodes
    models = (["spot"] if block.provisioning == "spot" else []) + (
        ["on-demand"] if block.provisioning == "on-demand" or block.on_demand_fallback else [])
    regions_client = _client(block, creds, "RegionsClient")
    for region in sorted({z.rsplit("-", 1)[0] for z in block.zones()}):
        name = f"GPU quota {region}"
        try:
            quotas = {q.metric: q for q in regions_client.get(project=block.project,
                                                              region=region).quotas}
        except Exception as e:  # noqa: BLE001 - Forbidden, NotFound, the network
            yield _fail(name, f"cannot read region {region}: {_message(e)}",
                        "check the zones in the profile; the orchestrator's "
                        "roles/compute.instanceAdmin.v1 on the project can read regions")
            continue
        if not quotas:
            yield _skip(name, f"Compute returned no quotas for region {region}: not checked")
            continue
        for model in models:
            metric, note = ON_DEMAND_L4, ""
            if model == "spot":
                metric = SPOT_L4
                if _limit(quotas, SPOT_L4) == 0:  # a Spot VM uses the standard quota then
                    metric, note = ON_DEMAND_L4, f" ({SPOT_L4} is 0: spot VMs use {ON_DEMAND_L4})"
            wanted = SPOT_L4 if model == "spot" else ON_DEMAND_L4
            yield _quota(f"{name} ({model})", quotas, metric, note, need, block.project,
                         wanted, wanted.replace("_", "-") + "-per-project-region",
                         f" --dimensions=region={region}")
    try:
        quotas = {q.metric: q for q in _client(block, creds, "ProjectsClient").get(
            project=block.project).quotas}
    except Exception as e:  # noqa: BLE001
        yield _fail("GPU quota (all regions)", f"cannot read project {block.project}: "
                    f"{_message(e)}", "check the project id and the Compute API")
        return
    yield _quota("GPU quota (all regions)", quotas, ALL_GPUS, "", need, block.project,
                 ALL_GPUS, "GPUS-ALL-REGIONS-per-project")


def _limit(quotas: dict[str, Any], metric: str) -> float:
    q = quotas.get(metric)
    return float(q.limit) if q is not None else 0.0


def _quota(name: str, quotas: dict[str, Any], metric: str, note: str, need: int, project: str,
           ask: str, quota_id: str, dims: str = "") -> Check:
    """`need` GPUs free in `metric`; the fix asks for more of `ask` (Cloud Quotas' id
    `quota_id`): its usage plus `need`."""
    q = quotas.get(metric)
    limit, usage = (float(q.limit), float(q.usage)) if q is not None else (0.0, 0.0)
    free = limit - usage
    detail = f"{metric} {free:g} free of {limit:g}{note}, {need} needed"
    if free >= need:
        return _ok(name, detail)
    asked = quotas.get(ask)
    want = int(float(asked.usage) if asked is not None else 0.0) + need
    return _fail(name, detail + ("" if q is not None else f" (Compute lists no {metric})"),
                 f"`gcloud quotas preferences create --service=compute.googleapis.com "
                 f"--project={project} --quota-id={quota_id} --preferred-value={want}{dims}` "
                 "(or IAM & Admin → Quotas in the console)")


def _act_as(block: GceCompute, where: str, inst: Any, creds: Any) -> Check:
    """iam.serviceAccounts.actAs on the node's account: setMetadata on an instance that runs as
    a service account needs it (roles/iam.serviceAccountUser) besides instance admin."""
    name = f"{where}: actAs"
    accounts = [a.email for a in inst.service_accounts]
    if not accounts:
        return _skip(name, "no service account on the instance")
    if block.api_endpoint:
        return _skip(name, f"not checked: with api_endpoint {block.api_endpoint} the IAM API "
                     "(iam.googleapis.com) is not asked")
    from google.auth.transport.requests import AuthorizedSession

    url = (f"https://iam.googleapis.com/v1/projects/{block.project}/serviceAccounts/"
           f"{accounts[0]}:testIamPermissions")
    try:
        resp = AuthorizedSession(creds).post(
            url, json={"permissions": ["iam.serviceAccounts.actAs"]}, timeout=30)
        resp.raise_for_status()
        granted = resp.json().get("permissions", [])
    except Exception as e:  # noqa: BLE001 - the IAM API unreachable or refusing
        return _fail(name, f"could not test actAs on {accounts[0]}: {type(e).__name__}: "
                     f"{str(e)[:200]}", "enable iam.googleapis.com, or check by hand with "
                     "`gcloud iam service-accounts get-iam-policy`")
    if "iam.serviceAccounts.actAs" not in granted:
        return _fail(name, f"the orchestrator cannot act as {accounts[0]}: setMetadata (the stop "
                     "of the engine after phase 1) would fail with 403",
                     f"grant the orchestrator roles/iam.serviceAccountUser on {accounts[0]}")
    return _ok(name, f"the orchestrator may act as {accounts[0]}")


# --- the bucket ---------------------------------------------------------------------------------
def _bucket_checks(cfg: Profile, training: bool, orchestrator: str | None = None
                   ) -> Iterator[Check]:
    from tasks.gcs_sync import gcs_bucket_from_env_or_block

    refs = sorted({r for r in (cfg.gcs_block, cfg.training.gcs_block, cfg.corpus.gcs_block) if r})
    if not refs:
        if training:
            yield _fail("bucket", "no GCS bucket: the node cannot fetch its datasets or keep "
                        "adapters and checkpoints", "set gcs_block at the top of the profile "
                        "(a saved GcsBucket block) or SLM_YOYO_WEIGHTS_GCS_BUCKET")
        else:
            yield _skip("bucket", "none configured, and the night does not train")
        return
    for ref in refs:
        name = f"bucket {ref}"
        try:
            gcs = gcs_bucket_from_env_or_block(ref)
        except Exception as e:  # noqa: BLE001 - a block that does not load, no credentials
            yield _fail(name, f"{type(e).__name__}: {str(e)[:300]}",
                        "save the GcsBucket block (docs/operator-gcp.md, section 6) or fix "
                        "gcs_block")
            continue
        yield _key_check(name, gcs, orchestrator)
        yield from _one_bucket(name, gcs)


def _key_check(name: str, gcs: Any, orchestrator: str | None) -> Check:
    """The node loads the same saved block: a key in it is the identity the node acts as."""
    creds = getattr(gcs, "gcp_credentials", None)
    info = getattr(creds, "service_account_info", None)
    path = getattr(creds, "service_account_file", None)
    if info is None and path is None:
        return _ok(f"{name}: credentials", "none in the block: each machine uses its own "
                   "service account (Application Default Credentials)")
    if info is not None:
        value = info.get_secret_value() if hasattr(info, "get_secret_value") else info
        email = dict(value).get("client_email")  # a SecretDict
    else:
        try:
            email = json.loads(Path(str(path)).read_text()).get("client_email")
        except (OSError, ValueError):
            email = None
    if orchestrator and email == orchestrator:
        return _fail(f"{name}: credentials", f"the block holds a key of {email}, the "
                     "orchestrator's own account: the node loads this block, so it would act "
                     "as the orchestrator (instance admin) instead of its own account",
                     "save the GcsBucket block without gcp_credentials (docs/operator-gcp.md, "
                     "section 6): each machine then uses its own service account")
    return _ok(f"{name}: credentials", f"a key of {email or 'an unnamed account'} in the block "
               "(both machines act as it; without a key each uses its own account)")


def _one_bucket(name: str, gcs: Any) -> Iterator[Check]:
    from google.api_core import exceptions as gexc

    try:
        bucket = gcs.get_bucket()
    except gexc.NotFound:
        yield _fail(name, f"gs://{gcs.bucket} does not exist",
                    f"`gcloud storage buckets create gs://{gcs.bucket}`, or fix the block")
        return
    except Exception as e:  # noqa: BLE001 - Forbidden, no credentials
        yield _fail(name, f"cannot read gs://{gcs.bucket}: {type(e).__name__}: {str(e)[:200]}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
        return
    try:
        granted = set(bucket.test_iam_permissions(list(BUCKET_PERMISSIONS)))
    except Exception as e:  # noqa: BLE001
        yield _fail(f"{name}: IAM", f"testIamPermissions failed: {type(e).__name__}: {e}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
    else:
        missing = [p for p in BUCKET_PERMISSIONS if p not in granted]
        yield (_fail(f"{name}: IAM", f"the orchestrator lacks {', '.join(missing)}",
                     "grant the orchestrator roles/storage.objectAdmin on the bucket")
               if missing else _ok(f"{name}: IAM", f"{len(BUCKET_PERMISSIONS)} object "
                                   "permissions held"))
    folder = (gcs.bucket_folder or "").strip("/")
    key = f"{folder + '/' if folder else ''}preflight/probe-{uuid.uuid4().hex[:12]}"
    try:
        blob = bucket.blob(key)
        blob.upload_from_string(b"slm-nightly preflight\n")
        blob.delete()
    except Exception as e:  # noqa: BLE001
        yield _fail(f"{name}: write", f"writing gs://{gcs.bucket}/{key} failed: "
                    f"{type(e).__name__}: {str(e)[:200]}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
        return
    yield _ok(f"{name}: write", f"wrote and deleted gs://{gcs.bucket}/{key}")


# --- the node's Secret Manager secrets ------------------------------------------------------------
SECRET_MANAGER = "https://secretmanager.googleapis.com"
SECRET_VIEWER = ("grant the orchestrator roles/secretmanager.viewer on the secret (its metadata, "
                 "never its value): `gcloud secrets add-iam-policy-binding {name} "
                 "--member=serviceAccount:{who} --role=roles/secretmanager.viewer`")


def _node_secret_checks(block: GceCompute, creds: Any) -> Iterator[Check]:
    """Each secret the node's startup script reads ([compute.node] prefect_api_key_secret,
    engine_api_key_secret) exists in the project with an enabled latest version — else the
    boot fails after the GPU is up. Read with the orchestrator's credentials
    (projects.secrets.versions.get: metadata only). Not checked: that the node's own account may
    access it (a secret's policy does not show roles the node inherits from the project or a
    group; the boot names a secret it cannot read in slm/startup-error)."""
    from google.auth.transport.requests import AuthorizedSession

    s = block.node
    names = [(key, getattr(s, key)) for key in ("prefect_api_key_secret",
                                                      "engine_api_key_secret")
             if getattr(s, key, None)]
    base = (block.secret_manager_endpoint or SECRET_MANAGER).rstrip("/")
    who = _email(creds) or "ORCHESTRATOR"
    session = AuthorizedSession(creds)
    for key, name in names:
        check = f"secret {name}"
        url = f"{base}/v1/projects/{block.project}/secrets/{name}/versions/latest"
        try:
            resp = session.get(url, timeout=30)
        except Exception as e:  # noqa: BLE001 - the API unreachable
            yield _fail(check, f"Secret Manager did not answer: {type(e).__name__}: "
                        f"{str(e)[:200]}", "enable secretmanager.googleapis.com, or check the "
                        "network")
            continue
        if resp.status_code == 404:
            yield _fail(check, f"[compute.node] {key} names {name}, which does not exist in "
                        f"project {block.project} or has no version: the node's boot would fail",
                        f"`printf '%s' \"$VALUE\" | gcloud secrets create {name} "
                        f"--data-file=- --project={block.project}`, or fix {key}")
        elif resp.status_code in (401, 403):
            yield _fail(check, f"the orchestrator may not read {name}'s metadata "
                        f"(HTTP {resp.status_code})", SECRET_VIEWER.format(name=name, who=who))
        elif resp.status_code != 200:
            yield _fail(check, f"Secret Manager answered HTTP {resp.status_code}: "
                        f"{resp.text[:200]}", "retry; check the API's status")
        else:
            state = resp.json().get("state")
            version = str(resp.json().get("name", "")).rsplit("/", 1)[-1]
            yield (_ok(check, f"version {version} {state} (the node's access is not checked)")
                   if state == "ENABLED" else
                   _fail(check, f"its latest version {version} is {state}: the node cannot read "
                         "it", f"`printf '%s' \"$VALUE\" | gcloud secrets versions add {name} "
                         f"--data-file=-` (or `gcloud secrets versions enable {version} "
                         f"--secret={name}`)"))


# --- blocks and secrets -------------------------------------------------------------------------
def _secret_checks(cfg: Profile) -> Iterator[Check]:
    """A Secret-typed field that is set but empty (a Neo4j block saved without its password)."""
    from pydantic import SecretStr

    blocks = {"compute": cfg.compute, "inference": cfg.inference, "graph": cfg.graph,
              "serving": cfg.serving}
    empty = [f"[{section}] {name}" for section, b in blocks.items() if b is not None
             for name in type(b).model_fields
             if isinstance(v := getattr(b, name), SecretStr) and not v.get_secret_value()]
    yield (_fail("secrets", f"empty: {', '.join(empty)}", "set them in the saved blocks "
                 "(docs/operator-gcp.md, section 6)") if empty else
           _ok("secrets", "no Secret-typed field of the profile's blocks is empty"))


# --- the graph, the sources and the corpus (phase 1 and the scorecard run here) -----------------
def _graph_checks(cfg: Profile) -> Iterator[Check]:
    """Open the profile's graph as phase 1 does (tasks/graph/open.py) and read from it; the
    detail names the URI, never the password. An embedded FalkorDB is phase 1's to start."""
    from blocks.graph import Neo4jGraph
    from tasks.graph.backends import FalkorDBStore, Neo4jStore
    from tasks.graph.store import GraphStore

    g = cfg.graph
    secret = ""
    try:
        store: GraphStore
        if isinstance(g, Neo4jGraph):
            where = f"Neo4j at {g.uri} as {g.user!r}"
            secret = g.password.get_secret_value()
            fix = "fix the graph block's uri, user and password (docs/operator-gcp.md, section 6)"
            store = Neo4jStore(g.uri, g.user, secret, g.database, 1, g.schema_dialect)
        elif g.host is None:
            yield _skip("graph", f"the embedded FalkorDB on {g.data_dir}: phase 1 starts it "
                        "on this machine")
            return
        else:
            where = f"FalkorDB at {g.host}:{g.port or 6379}"
            secret = g.password.get_secret_value() if g.password else ""
            fix = ("start the server, or fix the graph block's host, port and password "
                   "(empty host: the embedded server)")
            store = FalkorDBStore(g.host, g.port or 6379, g.graph_name, 1, secret or None)
        with store:
            store._read("RETURN 1 AS one")
    except Exception as e:  # noqa: BLE001 - GraphError, the drivers' own
        cause = e.__cause__ or e
        text = f"{type(cause).__name__}: {str(cause)[:200]}"
        if secret:
            text = text.replace(secret, "***")
        if "loading" in text.lower() and not isinstance(g, Neo4jGraph):
            yield _ok("graph", f"{where} answers, and is still loading its data")
            return
        yield _fail("graph", f"cannot open {where}: {text}", fix)
        return
    yield _ok("graph", f"{where} answers a read")


def _folder_checks(cfg: Profile) -> Iterator[Check]:
    """The [sources] folders (phase 1) and the [corpus] root (the scorecard): readable
    directories on this machine, the orchestrator."""
    import os
    from pathlib import Path

    from tasks.extraction.inputs import STREAMS

    folders = [(f"sources {s}", getattr(cfg.sources, s), f"[sources] {s}") for s in STREAMS
               if getattr(cfg.sources, s)]
    if not folders:
        yield _fail("sources", "no [sources] stream is configured: phase 1 fails",
                    "set transcripts, research or contacts in [sources]")
    if cfg.corpus.root:
        folders.append(("corpus", cfg.corpus.root, "[corpus] root"))
    for name, value, key in folders:
        path = Path(value).expanduser()
        if not path.is_dir():
            yield _fail(name, f"{path} is not a directory on the orchestrator",
                        f"create it (`mkdir -p {path}`), or fix {key} in the profile")
        elif not os.access(path, os.R_OK | os.X_OK):
            yield _fail(name, f"{path} is not readable by this user",
                        f"`chmod u+rx {path}`, or run the orchestrator as its owner")
        else:
            yield _ok(name, str(path))


# --- Prefect: pools and deployments -------------------------------------------------------------
def api_url_unset(profile: str | None = None) -> Check | None:
    """A failed check when PREFECT_API_URL is unset and the profile needs the Prefect server
    (a GCE node, or a saved block) — said before anything loads a saved block: without the
    setting, Prefect 3 starts a temporary local server that holds none of them. `profile`
    None: always needed. None when it is set, or not needed."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or (profile is not None and not _needs_api(profile)):
        return None
    return _fail("Prefect API", "PREFECT_API_URL is not set: the saved blocks, the node's work "
                 "pool and the deployments live on the orchestrator's Prefect server (without "
                 "it Prefect would start a temporary local server that has none of them)",
                 API_URL_FIX)


def _needs_api(profile: str) -> bool:
    import tomllib

    from tasks.profile import profile_path

    try:
        data = tomllib.loads(profile_path(profile).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # the profile load says what is wrong with the file
    if data.get("compute", {}).get("type") == "gce":
        return True
    if any("block" in v for v in data.values() if isinstance(v, dict)):
        return True  # a saved block
    gcs = data.get("gcs_block")
    return isinstance(gcs, str) and not gcs.startswith("gs://")  # a saved GcsBucket


def _prefect_checks(cfg: Profile, block: GceCompute, night: bool, training: bool
                    ) -> Iterator[Check]:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        unset = api_url_unset()
        assert unset is not None
        yield unset
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        failure = client.api_healthcheck()
        if failure is not None:
            yield _fail("Prefect API", f"{url} does not answer: {failure}",
                        "start the Prefect server, or fix PREFECT_API_URL")
            return
        yield _ok("Prefect API", str(url))
        settings = _node_settings(block)
        wanted: list[tuple[str, str | None]] = []
        if training:
            wanted.append((cfg.training.node_deployment, settings.work_pool))
        else:
            yield _skip("node deployment", "the night does not train (no [corpus] root, or "
                        "[training] enabled = false)")
        if not night:
            wanted += [(d, None) for d in ORCHESTRATOR_DEPLOYMENTS]
        pools: set[str] = set()
        for name, pool in wanted:
            yield from _deployment(client, name, pool, settings, pools)


def _node_code(dep: Any) -> str | None:
    """What is wrong with the code the node's deployment runs (prefect.yaml: pushed to GCS at
    deploy time, pulled by each run): None when it pulls this checkout's version."""
    from tasks.code_version import code_version
    from tasks.profile import PROJECT_ROOT

    pulls = [s[PULL_FROM_GCS] for s in dep.pull_steps or []
             if isinstance(s, dict) and PULL_FROM_GCS in s]
    if not pulls:
        return ("pulls no code from GCS: its runs would run the node image's checkout, not "
                "the orchestrator's code")
    here = code_version(PROJECT_ROOT)
    folder = str(pulls[0].get("folder", ""))
    if dep.version != here or folder.rsplit("/", 1)[-1] != here:
        return (f"runs code {dep.version} (gs://{pulls[0].get('bucket')}/{folder}); this "
                f"checkout is {here}")
    return None


def _node_settings(block: GceCompute) -> Any:
    return block.node


def _deployment(client: Any, name: str, pool: str | None, settings: Any,
                pools: set[str]) -> Iterator[Check]:
    from prefect.exceptions import ObjectNotFound

    check = f"deployment {name}"
    try:
        dep = client.read_deployment_by_name(name)
    except ObjectNotFound:
        yield _fail(check, "not on the Prefect server", f"`{DEPLOY_ALL}` from the checkout "
                    "(prefect.yaml)")
        return
    pool = pool or dep.work_pool_name
    if pool is None:
        yield _fail(check, "has no work pool", "redeploy it from prefect.yaml")
        return
    if pool not in pools:  # each pool once
        pools.add(pool)
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            yield _fail(f"work pool {pool}", "not on the Prefect server",
                        f"`prefect work-pool create {pool} --type process`")
        else:
            yield _ok(f"work pool {pool}", "exists")
    if dep.work_pool_name != pool:
        yield _fail(check, f"on pool {dep.work_pool_name}, but the node's worker serves {pool}",
                    "set the node's work_pool to the deployment's pool, or redeploy")
        return
    if pool == settings.work_pool:  # the node's deployment runs the code deployed with it
        problem = _node_code(dep)
        if problem:
            yield _fail(check, problem, f"redeploy it from this checkout: `{DEPLOY_NODE}`")
            return
        yield _ok(check, f"on pool {pool}, runs this checkout's code {dep.version} "
                  "(pulled from GCS)")
        return
    yield _ok(check, f"on pool {pool}")


# --- the node: its engine and its worker ---------------------------------------------------------
def _node_checks(cfg: Profile, block: GceCompute, training: bool,
                 node_ips: list[str]) -> Iterator[Check]:
    from tasks.compute.engines import engine_problems, worker_command

    s = block.node
    problems = engine_problems(s, cfg.inference.dialect)
    for problem in problems:
        detail, _, fix = problem.rpartition(" — ")
        yield _fail("engine", detail or problem, fix or "see the detail")
    if not problems:
        yield _ok("engine", f"{s.engine} loads {s.model_architecture} ({s.model_path})")
    if s.engine == "llama.cpp":
        yield slots_check(s, cfg.inference.max_concurrent_requests,
                          cfg.inference.context_tokens)
    if not s.prefect_api_url:
        yield (_fail("node worker", "no prefect_api_url in [compute.node]: the node starts no "
                     "Prefect worker, and its training runs would wait for one",
                     "set [compute.node] prefect_api_url to the Prefect API as the node "
                     "reaches it") if training else
               _skip("node worker", "no prefect_api_url, and the night does not train"))
        return
    argv = worker_command(s)
    want = f"{s.project_dir.rstrip('/')}/.venv/bin/prefect"
    yield (_ok("node worker", f"{' '.join(argv)} with PREFECT_API_URL {s.prefect_api_url}")
           if argv[0] == want else
           _fail("node worker", f"the startup script starts {argv[0]}, not the project's "
                 f"{want}: its flow runs would lack torch, peft and prefect-gcp",
                 "start the worker from the node's checkout (tasks/compute/engines.py)"))
    yield _node_api_check(s.prefect_api_url, node_ips)


def _node_api_check(url: str, node_ips: list[str]) -> Check:
    """The node's prefect_api_url: not the shipped placeholder, not the orchestrator's loopback
    (on the node that is the node), and answering GET <url>/health here — the orchestrator is
    in the node's VPC. Loopback is allowed only for a node whose own internal IP is a loopback
    address: the fake Compute Engine's nodes, which run on this machine."""
    from urllib.parse import urlsplit

    import httpx

    name = "node Prefect API"
    fix = ("set [compute.node] prefect_api_url to the Prefect API as the node reaches it over "
           "the VPC: http://<orchestrator VPC IP>:4200/api (`hostname -I` on the orchestrator), "
           "or the Prefect Cloud workspace URL")
    if PLACEHOLDER_MARKER in url or "REPLACE" in url:
        return _fail(name, f"prefect_api_url {url} is the shipped placeholder", fix)
    host = (urlsplit(url).hostname or "").lower()
    on_this_machine = bool(node_ips) and all(ip.startswith("127.") for ip in node_ips)
    if host in LOOPBACK_HOSTS and not on_this_machine:
        return _fail(name, f"prefect_api_url {url} is a loopback address: on the node it is "
                     "the node itself, not the orchestrator", fix)
    from prefect.settings import PREFECT_API_KEY

    key = PREFECT_API_KEY.value()  # Prefect Cloud: its /health wants the key
    key = key.get_secret_value() if hasattr(key, "get_secret_value") else key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    health = url.rstrip("/") + "/health"
    try:
        resp = httpx.get(health, headers=headers, timeout=10)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        return _fail(name, f"GET {health} from the orchestrator failed: {type(e).__name__}: "
                     f"{str(e)[:200]}", "serve the Prefect API on the orchestrator's VPC "
                     "address (`prefect server start --host 0.0.0.0`) and let the node's subnet "
                     "reach port 4200 (a firewall rule), or fix [compute.node] prefect_api_url")
    return _ok(name, f"GET {health} answers {resp.status_code}")


def slots_check(s: Any, slots: int, context_tokens: int) -> Check:
    """llama-server's slots (max_concurrent_requests x context_tokens) beside the weights on
    the node's card, by the estimate of tasks/compute/kv_budget.py: refused when they do not
    fit, with both numbers and the largest setting that does."""
    from tasks.compute.kv_budget import kv_fit, largest_fit

    shape = dict(layers=s.model_layers, kv_heads=s.model_kv_heads, head_dim=s.model_head_dim,
                 weights_gib=s.model_weights_gib, card_gib=s.gpu_memory_gib,
                 cache_type=s.kv_cache_type, sliding_layers=s.model_sliding_layers,
                 sliding_window=s.model_sliding_window)
    fit = kv_fit(slots, context_tokens, **shape)
    if fit.fits:
        return _ok("engine slots", fit.text())
    most = largest_fit(context_tokens, **shape)
    other = "q8_0" if s.kv_cache_type == "f16" else None
    more = (f"; kv_cache_type = \"{other}\" fits "
            f"{largest_fit(context_tokens, **{**shape, 'cache_type': other})}" if other else "")
    return _fail("engine slots", f"{fit.text()}: does not fit",
                 f"set [inference] max_concurrent_requests to {most} or less (the most slots "
                 f"of {context_tokens} tokens that fit){more}, or lower context_tokens"
                 if most else "lower context_tokens, or serve a smaller model")


# --- the node's environment ---------------------------------------------------------------------
def _environment_check(cfg: Profile, training: bool) -> Check:
    """The environment the node's last training run recorded in the bucket against this
    checkout's pyproject.toml and this machine's versions (tasks/environment.py)."""
    from tasks.environment import REBUILD, RECORD_KEY, describe, differences, recorded

    name = "node environment"
    if not training or not cfg.training.gcs_block:
        return _skip(name, "the night does not train on the node through a bucket")
    try:
        node = recorded(cfg.training.gcs_block)
    except Exception as e:  # noqa: BLE001 - the bucket checks above name the cause
        return _skip(name, f"not read: {type(e).__name__}: {str(e)[:200]}")
    if node is None:
        return _skip(name, f"no node run has recorded its environment yet ({RECORD_KEY}): "
                     "`slm-nightly node smoke` does")
    refused, said = differences(describe(), node)
    if refused:
        return _fail(name, f"the node's environment {node.get('digest')} (recorded "
                     f"{node.get('at')}) does not fit this checkout's code: "
                     f"{'; '.join(refused)}", REBUILD)
    return _ok(name, f"{node.get('digest')} (recorded {node.get('at')}) fits pyproject.toml"
               + (f"; within its ranges: {'; '.join(said)}" if said else ""))


# --- the training recipe ------------------------------------------------------------------------
def _recipe_checks(cfg: Profile, training: bool) -> Iterator[Check]:
    if not training:
        yield _skip("training recipe", "the night does not train")
        return
    from tasks.training.params import build_params, resolve
    from tasks.training.preflight import node_limits, preflight

    limits = node_limits(cfg)
    seen: dict[tuple[str, str, str], list[str]] = {}
    for method in ("sft", "dpo"):
        try:
            recipe = resolve(build_params(cfg.training.recipe, {
                "dataset": "", "method": method, "base_model": cfg.training.base_model}))
        except ConfigError as e:
            yield _fail(f"training recipe ({method})", str(e), f"fix recipe "
                        f"{cfg.training.recipe!r}")
            continue
        for c in preflight(recipe, limits, weights_here=False):
            seen.setdefault((c.name, c.status, c.detail), []).append(method)
    for (name, status, detail), methods in seen.items():
        title = f"training recipe ({', '.join(methods)}): {name}"
        yield (_skip(title, detail) if status == "skipped" else _ok(title, detail)
               if status == "ok" else _fail(title, detail, "the detail names it; "
                                            "`slm-nightly train preflight --profile` prints it"))
