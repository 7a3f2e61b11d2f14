"""The night's preflight, Prefect's side: the API answers, and the node's work pool and the
deployments exist, on the right pool, running this checkout's code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

from blocks.gce import GceCompute
from tasks.profile import read_profile
from tasks.shared.checks import Check, failure, passed, skipped
from tasks.shared.code_version import code_version
from tasks.shared.errors import ConfigError
from tasks.shared.paths import PROJECT_ROOT

if TYPE_CHECKING:
    from tasks.profile import Profile

ORCHESTRATOR_DEPLOYMENTS = ("nightly/production", "node-reaper/production")
PULL_FROM_GCS = "prefect_gcp.deployments.steps.pull_from_gcs"
DEPLOY_NODE = "prefect --no-prompt deploy --name train/node"
DEPLOY_ALL = ("prefect --no-prompt deploy --name nightly/production --name "
              "node-reaper/production --name train/node --name nightly/extract --name "
              "nightly/retrain")
API_URL_FIX = ("`prefect config set PREFECT_API_URL=http://<orchestrator>:4200/api` on the "
               "orchestrator (Prefect Cloud: `prefect cloud login`)")


# --- Prefect: pools and deployments -------------------------------------------------------------
def api_url_unset(profile: str | None = None) -> Check | None:
    """A failed check when PREFECT_API_URL is unset and the profile needs the Prefect server
    (a GCE node, or a saved block) — said before anything loads a saved block: without the
    setting, Prefect 3 starts a temporary local server that holds none of them. `profile`
    None: always needed. None when it is set, or not needed."""
    if PREFECT_API_URL.value() or (profile is not None and not _needs_api(profile)):
        return None
    return failure("Prefect API", "PREFECT_API_URL is not set: the saved blocks, the node's work "
                 "pool and the deployments live on the orchestrator's Prefect server (without "
                 "it Prefect would start a temporary local server that has none of them)",
                 API_URL_FIX)


def _needs_api(profile: str) -> bool:
    try:
        _, data = read_profile(profile)
    except (OSError, ConfigError):
        return False  # the profile load says what is wrong with the file
    if data.get("compute", {}).get("type") == "gce":
        return True
    if any("block" in v for v in data.values() if isinstance(v, dict)):
        return True  # a saved block
    gcs = data.get("gcs_block")
    return isinstance(gcs, str) and not gcs.startswith("gs://")  # a saved GcsBucket


def prefect_checks(cfg: Profile, block: GceCompute, night: bool, training: bool
                    ) -> Iterator[Check]:
    url = PREFECT_API_URL.value()
    if not url:
        unset = api_url_unset()
        assert unset is not None
        yield unset
        return
    with get_client(sync_client=True) as client:
        down = client.api_healthcheck()
        if down is not None:
            yield failure("Prefect API", f"{url} does not answer: {down}",
                        "start the Prefect server, or fix PREFECT_API_URL")
            return
        yield passed("Prefect API", str(url))
        settings = _node_settings(block)
        wanted: list[tuple[str, str | None]] = []
        if training:
            wanted.append((cfg.training.node_deployment, settings.work_pool))
        else:
            yield skipped("node deployment", "the night does not train (no [corpus] root, or "
                        "[training] enabled = false)")
        if not night:
            wanted += [(d, None) for d in ORCHESTRATOR_DEPLOYMENTS]
        pools: set[str] = set()
        for name, pool in wanted:
            yield from _deployment(client, name, pool, settings, pools)


def _node_code(dep: Any) -> str | None:
    """What is wrong with the code the node's deployment runs (prefect.yaml: pushed to GCS at
    deploy time, pulled by each run): None when it pulls this checkout's version."""
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
    check = f"deployment {name}"
    try:
        dep = client.read_deployment_by_name(name)
    except ObjectNotFound:
        yield failure(check, "not on the Prefect server", f"`{DEPLOY_ALL}` from the checkout "
                    "(prefect.yaml)")
        return
    pool = pool or dep.work_pool_name
    if pool is None:
        yield failure(check, "has no work pool", "redeploy it from prefect.yaml")
        return
    if pool not in pools:  # each pool once
        pools.add(pool)
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            yield failure(f"work pool {pool}", "not on the Prefect server",
                        f"`prefect work-pool create {pool} --type process`")
        else:
            yield passed(f"work pool {pool}", "exists")
    if dep.work_pool_name != pool:
        yield failure(check, f"on pool {dep.work_pool_name}, but the node's worker serves {pool}",
                    "set the node's work_pool to the deployment's pool, or redeploy")
        return
    if pool == settings.work_pool:  # the node's deployment runs the code deployed with it
        problem = _node_code(dep)
        if problem:
            yield failure(check, problem, f"redeploy it from this checkout: `{DEPLOY_NODE}`")
            return
        yield passed(check, f"on pool {pool}, runs this checkout's code {dep.version} "
                  "(pulled from GCS)")
        return
    yield passed(check, f"on pool {pool}")


