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
  checkout's, tasks/shared/code_version.py); outside a night, the
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
The node's Secret Manager secrets ([compute.node] prefect_api_key_secret,
prefect_auth_string_secret, engine_api_key_secret) exist with an enabled latest version
(projects.secrets.versions.get with the orchestrator's credentials, which need
roles/secretmanager.viewer: metadata, never the value). Not checked:
that the node's own account may read them (a secret's IAM policy does not show grants inherited
from the project, folder or organisation, nor through groups: such a check would fail projects
that are ready).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tasks.compute.protocol import gce_block
from tasks.preflight.google import (
    account_email,
    compute_checks,
    credentials,
    node_secret_checks,
    quota_checks,
)
from tasks.preflight.node import environment_check, node_checks
from tasks.preflight.orchestrator import bucket_checks, folder_checks, graph_checks, secret_checks
from tasks.preflight.prefect_api import prefect_checks
from tasks.shared.checks import Check, PreflightFailed, failure, passed, skipped
from tasks.shared.errors import ConfigError
from tasks.training.params import build_params, resolve
from tasks.training.preflight import node_limits, preflight

if TYPE_CHECKING:
    from tasks.profile import Profile


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



    def error(self) -> PreflightFailed:
        """The failure the nightly raises: every failed check with its fix."""
        return PreflightFailed("; ".join(f"{c.name}: {c.detail} — fix: {c.fix}"
                                         for c in self.failed), self.failed)


def trains_on_node(cfg: Profile) -> bool:
    """Whether a night on this profile can reach training (a corpus to score, training on)."""
    return bool(cfg.training.enabled and cfg.corpus.root)


def run_preflight(cfg: Profile, *, night: bool = False) -> PreflightReport:
    """Every check for the profile's GCE node (see the module docstring). `night`: the checks
    tonight's run depends on — the orchestrator's own deployments are left out (the run is
    already going)."""
    report = PreflightReport(cfg.name)
    block = gce_block(cfg.compute)
    if block is None:
        report.checks.append(skipped("compute", f"{type(cfg.compute).__name__}: not a GCE "
                                   "node, nothing to check"))
        return report
    add = report.checks.append
    creds, email = None, None
    try:
        creds = credentials(block)
        email = account_email(creds)
        who = email or "an account whose e-mail the credentials do not say"
        add(passed("credentials", f"the orchestrator acts as {who}"))
    except Exception as e:  # noqa: BLE001 - google.auth's DefaultCredentialsError and kin
        add(failure("credentials", f"{type(e).__name__}: {str(e)[:300]}",
                  "set the compute block's gcp_credentials, or give the orchestrator "
                  "Application Default Credentials (its VM's service account, or `gcloud auth "
                  "application-default login`)"))
    node_ips: list[str] = []  # the instances' internal IPs, as instances.get gives them
    if creds is not None:
        report.checks.extend(compute_checks(block, email, creds, node_ips))
        report.checks.extend(quota_checks(block, creds))
        report.checks.extend(node_secret_checks(block, creds))
    training = trains_on_node(cfg)
    report.checks.extend(bucket_checks(cfg, training, email))
    report.checks.extend(secret_checks(cfg))
    report.checks.extend(graph_checks(cfg))
    report.checks.extend(folder_checks(cfg))
    report.checks.extend(prefect_checks(cfg, block, night, training))
    report.checks.extend(node_checks(cfg, block, training, node_ips))
    report.checks.extend(recipe_checks(cfg, training))
    report.checks.append(environment_check(cfg, training))
    return report



# --- the training recipe ------------------------------------------------------------------------
def recipe_checks(cfg: Profile, training: bool) -> Iterator[Check]:
    if not training:
        yield skipped("training recipe", "the night does not train")
        return
    limits = node_limits(cfg)
    seen: dict[tuple[str, str, str], list[str]] = {}
    for method in ("sft", "dpo"):
        try:
            recipe = resolve(build_params(cfg.training.recipe, {
                "dataset": "", "method": method, "base_model": cfg.training.base_model}))
        except ConfigError as e:
            yield failure(f"training recipe ({method})", str(e), f"fix recipe "
                        f"{cfg.training.recipe!r}")
            continue
        for c in preflight(recipe, limits, weights_here=False):
            seen.setdefault((c.name, c.status, c.detail), []).append(method)
    for (name, status, detail), methods in seen.items():
        title = f"training recipe ({', '.join(methods)}): {name}"
        yield (skipped(title, detail) if status == "skipped" else passed(title, detail)
               if status == "ok" else failure(title, detail, "the detail names it; "
                                            "`slm-nightly train preflight --profile` prints it"))
