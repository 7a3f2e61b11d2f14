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
- each bucket the profile names exists and takes a write;
- Secret-typed fields of the loaded blocks are not empty (the profile load already failed on
  a saved block that does not load);
- the Prefect API answers; the node's work pool and the training deployment exist, the
  deployment is on that pool and changes into the node's checkout; outside a night, the
  orchestrator's deployments (nightly/production, node-reaper/production) too;
- the node's engine can load its model's architecture (tasks/compute/engines.py, from the
  engine's own list) and speaks the inference block's dialect; the startup script's worker
  runs from the node's checkout ({project_dir}/.venv/bin/prefect: a process worker runs each
  flow in its own Python) with a Prefect API URL;
- the training recipe's own preflight (tasks/training/preflight.py) for the node's memory.

The nightly runs it (`night=True`) before it boots anything; `slm-nightly preflight` prints it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
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
SET_WORKING_DIRECTORY = "prefect.deployments.steps.set_working_directory"
INSTANCE_ADMIN = "grant the orchestrator's account roles/compute.instanceAdmin.v1 on the instance"


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
    if creds is not None:
        report.checks.extend(_compute_checks(block, email, creds))
    training = trains_on_node(cfg)
    report.checks.extend(_bucket_checks(cfg, training))
    report.checks.extend(_secret_checks(cfg))
    report.checks.extend(_prefect_checks(cfg, block, night, training))
    report.checks.extend(_node_checks(cfg, block, training))
    report.checks.extend(_recipe_checks(cfg, training))
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


def _compute_checks(block: GceCompute, email: str | None, creds: Any) -> Iterator[Check]:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    client, _ = block.get_compute_clients()
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
def _bucket_checks(cfg: Profile, training: bool) -> Iterator[Check]:
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
        yield from _one_bucket(name, gcs)


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


# --- Prefect: pools and deployments -------------------------------------------------------------
def _prefect_checks(cfg: Profile, block: GceCompute, night: bool, training: bool
                    ) -> Iterator[Check]:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        yield _fail("Prefect API", "PREFECT_API_URL is not set: the pools and deployments live "
                    "on the server the node's worker talks to", "export PREFECT_API_URL (and "
                    "PREFECT_API_KEY for Prefect Cloud) on the orchestrator")
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


def _node_settings(block: GceCompute) -> Any:
    return block.node


def _deployment(client: Any, name: str, pool: str | None, settings: Any,
                pools: set[str]) -> Iterator[Check]:
    from prefect.exceptions import ObjectNotFound

    check = f"deployment {name}"
    try:
        dep = client.read_deployment_by_name(name)
    except ObjectNotFound:
        yield _fail(check, "not on the Prefect server", "`prefect --no-prompt deploy --all` "
                    "from the checkout (prefect.yaml)")
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
    if pool == settings.work_pool:  # the node's deployment: its checkout is the node's
        dirs = [s[SET_WORKING_DIRECTORY].get("directory") for s in dep.pull_steps or []
                if isinstance(s, dict) and SET_WORKING_DIRECTORY in s]
        project_dir = settings.project_dir
        if dirs != [project_dir]:
            yield _fail(check, f"changes into {dirs or 'no directory'}, the node's checkout is "
                        f"{project_dir}", "deploy from the checkout at the node's project_dir "
                        "(the same path on both machines), or fix project_dir")
            return
    yield _ok(check, f"on pool {pool}")


# --- the node: its engine and its worker ---------------------------------------------------------
def _node_checks(cfg: Profile, block: GceCompute, training: bool) -> Iterator[Check]:
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
