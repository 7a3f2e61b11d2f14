"""The night's preflight, Google's side: the orchestrator's credentials, each node's instance
in each zone (shape, scheduling, service account, network, IAM, actAs), the GPU quota, and the
node's Secret Manager secrets (tasks/preflight/run.py says what and why)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.transport.requests import AuthorizedSession

from blocks.gce import GceCompute
from tasks.shared.checks import Check, failure, passed, skipped

MACHINE_TYPE = "g2-standard-4"
ACCELERATOR = ("nvidia-l4", 1)
# What GceNode calls on an instance (tasks/compute/gce/), as Compute names the permissions
# (https://cloud.google.com/compute/docs/reference/rest/v1/instances: each method's IAM line).
INSTANCE_PERMISSIONS = (
    "compute.instances.get", "compute.instances.start", "compute.instances.stop",
    "compute.instances.setMetadata", "compute.instances.setScheduling",
    "compute.instances.getGuestAttributes")
# What the artifact store, the dataset hand-over and the run records do in the bucket.
INSTANCE_ADMIN = "grant the orchestrator's account roles/compute.instanceAdmin.v1 on the instance"
# Compute's quota metrics (regions.get / projects.get `quotas[].metric`)
SPOT_L4, ON_DEMAND_L4, ALL_GPUS = "PREEMPTIBLE_NVIDIA_L4_GPUS", "NVIDIA_L4_GPUS", "GPUS_ALL_REGIONS"


def credentials(block: GceCompute) -> Any:
    """The credentials the block's clients use (blocks/gce.py get_credentials)."""
    return block.get_credentials()


def account_email(creds: Any) -> str | None:
    email = getattr(creds, "service_account_email", None)
    return email if email and email != "default" else None  # GCE metadata creds before refresh


def _client(block: GceCompute, creds: Any, kind: str) -> Any:
    """A compute_v1 client (`kind`: "RegionsClient", ...) as get_compute_clients builds its
    own: REST, the same credentials and api_endpoint."""
    from google.cloud import compute_v1

    opts = ClientOptions(api_endpoint=block.api_endpoint) if block.api_endpoint else None
    return getattr(compute_v1, kind)(transport="rest", credentials=creds, client_options=opts)


def compute_checks(block: GceCompute, email: str | None, creds: Any,
                    node_ips: list[str]) -> Iterator[Check]:
    from google.cloud import compute_v1

    client, _ = block.get_compute_clients()
    subnets, routers = _client(block, creds, "SubnetworksClient"), None
    for node, zone in ((n, z) for n in block.node_blocks() for z in n.zones()):
        where = f"instance {zone}/{node.instance_in(zone)}"
        try:
            inst = client.get(project=block.project, zone=zone, instance=node.instance_in(zone))
        except gexc.NotFound:
            yield failure(where, f"{node.where(zone)} not found",
                        "create it: `slm-nightly gcp nodes` (docs/operator-gcp.md, section 6) "
                        "or fix project/zone/"
                        "instance/zone_instances in the profile" + (
                            f" (nodes = {block.nodes}: node i ≥ 2 is the instance "
                            f"{block.instance}-i, built like the first)" if block.nodes > 1
                            else ""))
            continue
        except Exception as e:  # noqa: BLE001 - Forbidden, another API error, the network
            yield failure(where, f"cannot read {node.where(zone)}: {_message(e)}",
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
            yield failure(f"{where}: IAM", f"testIamPermissions failed: {_message(e)}",
                        INSTANCE_ADMIN)
        else:
            missing = [p for p in INSTANCE_PERMISSIONS if p not in granted]
            yield (failure(f"{where}: IAM", f"the orchestrator lacks {', '.join(missing)}",
                         INSTANCE_ADMIN) if missing else
                   passed(f"{where}: IAM", f"{len(INSTANCE_PERMISSIONS)} instance permissions held"))
        yield _act_as(block, where, inst, creds)


def _message(e: Exception) -> str:
    return f"{type(e).__name__}: {getattr(e, 'message', None) or str(e)[:300]}"


def _shape_checks(where: str, inst: Any, email: str | None) -> Iterator[Check]:
    machine = inst.machine_type.rsplit("/", 1)[-1]
    yield (passed(f"{where}: machine type", machine) if machine == MACHINE_TYPE else
           failure(f"{where}: machine type", f"{machine}, not {MACHINE_TYPE}",
                 f"stop it and `gcloud compute instances set-machine-type "
                 f"{inst.name} --machine-type={MACHINE_TYPE}` (the recipes and memory checks "
                 "assume its 16 GB RAM and one L4)"))
    gpus = [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
            for a in inst.guest_accelerators]
    yield (passed(f"{where}: GPU", "1 x nvidia-l4") if gpus == [ACCELERATOR] else
           failure(f"{where}: GPU", f"accelerators {gpus or 'none'}, not one nvidia-l4",
                 "recreate the instance as a g2-standard-4 (which comes with one L4)"))
    maintenance = inst.scheduling.on_host_maintenance
    yield (passed(f"{where}: scheduling", "onHostMaintenance TERMINATE")
           if maintenance == "TERMINATE" else
           failure(f"{where}: scheduling", f"onHostMaintenance {maintenance or 'unset'}",
                 f"`gcloud compute instances set-scheduling {inst.name} "
                 "--maintenance-policy=TERMINATE` (a GPU VM cannot live-migrate)"))
    accounts = [a.email for a in inst.service_accounts]
    if not accounts:
        yield failure(f"{where}: service account", "the instance runs without a service account",
                    "`gcloud compute instances set-service-account` with the node's own "
                    "account (slm-node@…; it reads the bucket and its secrets)")
    elif email and email in accounts:
        yield failure(f"{where}: service account", f"{email} is the orchestrator's own account",
                    "give the node its own service account (docs/operator-gcp.md, section 1): "
                    "the node needs the bucket and its secrets, not instance admin")
    else:
        yield passed(f"{where}: service account", ", ".join(accounts))


SUBNET_URL = re.compile(r"projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)$")


def _network_check(block: GceCompute, where: str, inst: Any, subnets: Any, routers: Any
                   ) -> Check:
    """Whether the node reaches Cloud Storage and Secret Manager: an instance without an
    external IP (`--no-address`: no accessConfigs) needs Private Google Access on its subnet
    (subnetworks.get privateIpGoogleAccess) or a Cloud NAT that covers the subnet."""
    name = f"{where}: network"
    if not inst.network_interfaces:
        return failure(name, "the instance has no network interface", "recreate it "
                     "(docs/operator-gcp.md, section 6)")
    nic = inst.network_interfaces[0]
    if nic.access_configs:
        return passed(name, "an external IP: Google's APIs are reached without Private Google "
                   "Access")
    m = SUBNET_URL.search(nic.subnetwork or "")
    if m is None:
        return skipped(name, f"subnetwork {nic.subnetwork or 'not given'}: not a regional "
                     "subnet URL, Private Google Access not checked")
    project, region, subnet = m.groups()
    fix = (f"`gcloud compute networks subnets update {subnet} --region={region} "
           "--enable-private-ip-google-access` (or a Cloud NAT for the subnet: `gcloud compute "
           "routers nats create`)")
    try:
        sub = subnets.get(project=project, region=region, subnetwork=subnet)
    except Exception as e:  # noqa: BLE001 - Forbidden, NotFound, the network
        return failure(name, f"cannot read subnet {region}/{subnet}: {_message(e)}",
                     "grant the orchestrator roles/compute.networkViewer on the project, or "
                     "check the instance's subnet")
    if sub.private_ip_google_access:
        return passed(name, f"no external IP; subnet {region}/{subnet} has Private Google Access")
    try:
        nats = [(r.name, n.name) for r in routers.list(project=project, region=region)
                if r.network.rsplit("/", 1)[-1] == sub.network.rsplit("/", 1)[-1]
                for n in r.nats if _nat_covers(n, subnet)]
    except Exception as e:  # noqa: BLE001
        return failure(name, f"no external IP, subnet {region}/{subnet} has no Private Google "
                     f"Access, and its Cloud NATs could not be read: {_message(e)}",
                     fix + "; roles/compute.networkViewer lets the preflight see a Cloud NAT")
    if nats:
        return passed(name, f"no external IP; Cloud NAT {nats[0][0]}/{nats[0][1]} covers subnet "
                   f"{region}/{subnet}")
    return failure(name, f"no external IP, and subnet {region}/{subnet} has neither Private "
                 "Google Access nor a Cloud NAT: the node cannot reach Cloud Storage or Secret "
                 "Manager (its datasets, adapters and secrets)", fix)


def _nat_covers(nat: Any, subnet: str) -> bool:
    if nat.source_subnetwork_ip_ranges_to_nat.startswith("ALL_SUBNETWORKS"):
        return True
    return any(s.name.rsplit("/", 1)[-1] == subnet for s in nat.subnetworks)


def quota_checks(block: GceCompute, creds: Any) -> Iterator[Check]:
    """The L4 quota of each provisioning model the night may start with, per region of the
    profile's zones (regions.get), and GPUS_ALL_REGIONS (projects.get): `nodes` GPUs free."""
    models = (["spot"] if block.provisioning == "spot" else []) + (
        ["on-demand"] if block.provisioning == "on-demand" or block.on_demand_fallback else [])
    regions_client = _client(block, creds, "RegionsClient")
    for region in sorted({z.rsplit("-", 1)[0] for z in block.zones()}):
        name = f"GPU quota {region}"
        try:
            quotas = {q.metric: q for q in regions_client.get(project=block.project,
                                                              region=region).quotas}
        except Exception as e:  # noqa: BLE001 - Forbidden, NotFound, the network
            yield failure(name, f"cannot read region {region}: {_message(e)}",
                        "check the zones in the profile; the orchestrator's "
                        "roles/compute.viewer on the project can read regions")
            continue
        if not quotas:
            yield skipped(name, f"Compute returned no quotas for region {region}: not checked")
            continue
        for model in models:
            metric, note = ON_DEMAND_L4, ""
            if model == "spot":
                metric = SPOT_L4
                if _limit(quotas, SPOT_L4) == 0:  # a Spot VM uses the standard quota then
                    metric, note = ON_DEMAND_L4, f" ({SPOT_L4} is 0: spot VMs use {ON_DEMAND_L4})"
            wanted = SPOT_L4 if model == "spot" else ON_DEMAND_L4
            yield _quota(f"{name} ({model})", quotas, metric, note, block,
                         _Ask(wanted, wanted.replace("_", "-") + "-per-project-region",
                              f" --dimensions=region={region}"))
    try:
        quotas = {q.metric: q for q in _client(block, creds, "ProjectsClient").get(
            project=block.project).quotas}
    except Exception as e:  # noqa: BLE001
        yield failure("GPU quota (all regions)", f"cannot read project {block.project}: "
                    f"{_message(e)}", "check the project id and the Compute API")
        return
    yield _quota("GPU quota (all regions)", quotas, ALL_GPUS, "", block,
                 _Ask(ALL_GPUS, "GPUS-ALL-REGIONS-per-project"))


def _limit(quotas: dict[str, Any], metric: str) -> float:
    q = quotas.get(metric)
    return float(q.limit) if q is not None else 0.0


@dataclass(frozen=True)
class _Ask:
    """The quota a fix asks Cloud Quotas for more of: its Compute metric, its Cloud Quotas id
    and the `gcloud` dimensions flag (a region's, or none)."""

    metric: str
    quota_id: str
    dims: str = ""


def _quota(name: str, quotas: dict[str, Any], metric: str, note: str, block: GceCompute,
           ask: _Ask) -> Check:
    """The block's `nodes` GPUs free in `metric`; the fix asks for more of `ask`: its usage
    plus those."""
    need, project = block.nodes, block.project
    q = quotas.get(metric)
    limit, usage = (float(q.limit), float(q.usage)) if q is not None else (0.0, 0.0)
    free = limit - usage
    detail = f"{metric} {free:g} free of {limit:g}{note}, {need} needed"
    if free >= need:
        return passed(name, detail)
    asked = quotas.get(ask.metric)
    want = int(float(asked.usage) if asked is not None else 0.0) + need
    return failure(name, detail + ("" if q is not None else f" (Compute lists no {metric})"),
                 f"`gcloud quotas preferences create --service=compute.googleapis.com "
                 f"--project={project} --quota-id={ask.quota_id} --preferred-value={want}"
                 f"{ask.dims}` "
                 "(or IAM & Admin → Quotas in the console)")


def _act_as(block: GceCompute, where: str, inst: Any, creds: Any) -> Check:
    """iam.serviceAccounts.actAs on the node's account: setMetadata on an instance that runs as
    a service account needs it (roles/iam.serviceAccountUser) besides instance admin."""
    name = f"{where}: actAs"
    accounts = [a.email for a in inst.service_accounts]
    if not accounts:
        return skipped(name, "no service account on the instance")
    if block.api_endpoint:
        return skipped(name, f"not checked: with api_endpoint {block.api_endpoint} the IAM API "
                     "(iam.googleapis.com) is not asked")
    url = (f"https://iam.googleapis.com/v1/projects/{block.project}/serviceAccounts/"
           f"{accounts[0]}:testIamPermissions")
    try:
        resp = AuthorizedSession(creds).post(
            url, json={"permissions": ["iam.serviceAccounts.actAs"]}, timeout=30)
        resp.raise_for_status()
        granted = resp.json().get("permissions", [])
    except Exception as e:  # noqa: BLE001 - the IAM API unreachable or refusing
        return failure(name, f"could not test actAs on {accounts[0]}: {type(e).__name__}: "
                     f"{str(e)[:200]}", "enable iam.googleapis.com, or check by hand with "
                     "`gcloud iam service-accounts get-iam-policy`")
    if "iam.serviceAccounts.actAs" not in granted:
        return failure(name, f"the orchestrator cannot act as {accounts[0]}: setMetadata (the stop "
                     "of the engine after phase 1) would fail with 403",
                     f"grant the orchestrator roles/iam.serviceAccountUser on {accounts[0]}")
    return passed(name, f"the orchestrator may act as {accounts[0]}")



# --- the node's Secret Manager secrets ------------------------------------------------------------
SECRET_MANAGER = "https://secretmanager.googleapis.com"
SECRET_VIEWER = ("grant the orchestrator roles/secretmanager.viewer on the secret (its metadata, "
                 "never its value): `gcloud secrets add-iam-policy-binding {name} "
                 "--member=serviceAccount:{who} --role=roles/secretmanager.viewer`")


def node_secret_checks(block: GceCompute, creds: Any) -> Iterator[Check]:
    """Each secret the node's startup script reads ([compute.node] prefect_api_key_secret,
    prefect_auth_string_secret, engine_api_key_secret) exists in the project with an enabled
    latest version — else the boot fails after the GPU is up. Read with the orchestrator's credentials
    (projects.secrets.versions.get: metadata only). Not checked: that the node's own account may
    access it (a secret's policy does not show roles the node inherits from the project or a
    group; the boot names a secret it cannot read in slm/startup-error)."""
    s = block.node
    names = [(key, getattr(s, key)) for key in ("prefect_api_key_secret",
                                                "prefect_auth_string_secret",
                                                "engine_api_key_secret")
             if getattr(s, key, None)]
    base = (block.secret_manager_endpoint or SECRET_MANAGER).rstrip("/")
    who = account_email(creds) or "ORCHESTRATOR"
    session = AuthorizedSession(creds)
    for key, name in names:
        check = f"secret {name}"
        url = f"{base}/v1/projects/{block.project}/secrets/{name}/versions/latest"
        try:
            resp = session.get(url, timeout=30)
        except Exception as e:  # noqa: BLE001 - the API unreachable
            yield failure(check, f"Secret Manager did not answer: {type(e).__name__}: "
                        f"{str(e)[:200]}", "enable secretmanager.googleapis.com, or check the "
                        "network")
            continue
        if resp.status_code == 404:
            yield failure(check, f"[compute.node] {key} names {name}, which does not exist in "
                        f"project {block.project} or has no version: the node's boot would fail",
                        f"`printf '%s' \"$VALUE\" | gcloud secrets create {name} "
                        f"--data-file=- --project={block.project}`, or fix {key}")
        elif resp.status_code in (401, 403):
            yield failure(check, f"the orchestrator may not read {name}'s metadata "
                        f"(HTTP {resp.status_code})", SECRET_VIEWER.format(name=name, who=who))
        elif resp.status_code != 200:
            yield failure(check, f"Secret Manager answered HTTP {resp.status_code}: "
                        f"{resp.text[:200]}", "retry; check the API's status")
        else:
            state = resp.json().get("state")
            version = str(resp.json().get("name", "")).rsplit("/", 1)[-1]
            yield (passed(check, f"version {version} {state} (the node's access is not checked)")
                   if state == "ENABLED" else
                   failure(check, f"its latest version {version} is {state}: the node cannot read "
                         "it", f"`printf '%s' \"$VALUE\" | gcloud secrets versions add {name} "
                         f"--data-file=-` (or `gcloud secrets versions enable {version} "
                         f"--secret={name}`)"))


