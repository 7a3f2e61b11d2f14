"""The GCE node's lifecycle (the node protocol of tasks/compute/protocol.py on a GceCompute
block): start with zone/spot fallbacks, wait for vLLM, stop it and the node, detect
preemption, read the cost.

Stopping the inference server. The node's startup script (tasks/compute/startup_script.py)
runs a watcher that obeys the instance metadata key `slm-vllm` (`stopped` | `running`):
stop_inference sets it to `stopped` and then checks that port 9080 no longer answers.

The node record (<state_dir>/gce-<instance>.json) says which zone this run's node is in, so a
later call — the teardown hook, the reaper, another process — stops the right one.

Every start sets the scheduling first (instances.setScheduling, all of its fields: Compute
keeps the fields a body leaves out, so a SPOT instance's preemptible/STOP would survive a switch
to on-demand and make it invalid): the placement's provisioning model, automaticRestart false,
onHostMaintenance TERMINATE (an L4 cannot live-migrate), instanceTerminationAction STOP and
maxRunDuration = the night's budget, so Compute stops a node whose orchestrator died (the
reaper, flows/reaper.py, is the second layer).

Start errors are sorted (cloud.google.com/compute/docs/troubleshooting/
troubleshooting-resource-availability, …/quotas): a stockout (ZONE_RESOURCE_POOL_EXHAUSTED*),
QUOTA_EXCEEDED, UNSUPPORTED_OPERATION, a 5xx/429/rate limit on the start call and a preemption
during boot move on to the next placement (tasks/compute/placement.py); a refusal that no other
zone would answer differently (permission, not found, bad request) ends the start at once with
the fix. Transient errors of the calls that read or wait (5xx, 429, 403 rateLimitExceeded,
connection resets, timeouts) are retried with exponential backoff and full jitter
(block: api_retries, retry_base_seconds, retry_max_seconds).

Client calls: the `*_unary` methods plus ZoneOperationsClient.wait (the `.result()` helpers
poll through a client that ignores a custom api_endpoint).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute import inference_server
from tasks.compute.boot_status import startup_failure
from tasks.compute.cost import UP, timestamp, total_usage, zone_usage
from tasks.compute.placement import (
    placements,
    provisioning_name,
    region_of,
    start_failure,
)
from tasks.compute.startup_script import (
    AGENT_KEY,
    ENGINE_UNIT,
    WATCH_UNIT,
    metadata_items,
    render_startup_script,
)
from tasks.errors import (
    ConfigError,
    NodeBootTimeout,
    NodePreempted,
    NodeUnavailable,
    ServerError,
)
from tasks.files import write_atomic
from tasks.processes import ManagedServer
from tasks.records import NodeUsage

log = logging.getLogger("slm_nightly.gce")

STOPPED = {"TERMINATED", "STOPPED"}
BOOT_STATUS_SECONDS = 10.0  # how often the wait for the engine reads the startup script's error
BOOTING = {"PROVISIONING", "STAGING", "RUNNING"}
MIN_RUN_SECONDS, MAX_RUN_SECONDS = 30, 120 * 86400  # maxRunDuration's range (limit-vm-runtime)
RATE_LIMIT_REASONS = {"rateLimitExceeded", "userRateLimitExceeded"}
SA_USER_ROLE = "roles/iam.serviceAccountUser"


@dataclass
class NodeRecord:
    zone: str
    instance: str
    ip: str
    model: str  # SPOT | STANDARD


@dataclass
class StartFailed:
    """Why one placement did not come up, when the next one may: kind (stocked out, quota
    exceeded, unsupported, server error, rate limited, preempted while booting, …) and the
    text the final error names it with."""
    kind: str
    text: str


class GceNode:
    """A Compute Engine VM as the node (see blocks/gce.py for zones and fallbacks)."""

    remote_training = True  # the GPU is on the node: training runs there (its deployment)
    # The node's extraction server serves the 32B base; the promoted adapters are trained on
    # the 7B and served by name by the [serving] endpoint (tasks/training/serving.py).
    loads_adapters = False
    cpu_threads = 2

    def __init__(self, block: GceCompute) -> None:
        self.block = block
        self._clients_cache: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"GceNode({self.block!r})"

    @property
    def base_model(self) -> str | None:
        return None  # the node's vLLM weights are not a training base on this machine

    @property
    def boot_timeout_seconds(self) -> float | None:
        return self.block.boot_timeout_seconds

    @property
    def stop_timeout_seconds(self) -> float | None:
        return self.block.stop_timeout_seconds

    # ---- clients --------------------------------------------------------------------------
    def _clients(self) -> tuple[Any, Any]:
        if self._clients_cache is None:
            from google.auth.exceptions import DefaultCredentialsError

            try:
                self._clients_cache = self.block.get_compute_clients()
            except DefaultCredentialsError as e:
                raise ConfigError("compute (gce): no Google credentials — set the block's "
                                  "gcp_credentials, or run `gcloud auth application-default "
                                  "login` / use a service account on the orchestrator") from e
        return self._clients_cache

    def _get(self, zone: str) -> Any:
        from google.api_core import exceptions as gexc

        b = self.block
        inst, _ = self._clients()
        try:
            return self._call(f"get {b.where(zone)}", inst.get, project=b.project, zone=zone,
                              instance=b.instance_in(zone))
        except gexc.NotFound as e:
            raise ConfigError(
                f"compute (gce): instance {b.where(zone)} not found — create it (g2-standard-4 "
                "with one L4 and the node image) or fix project/zone/instance in the profile"
            ) from e
        except gexc.Forbidden as e:
            raise ConfigError(
                f"compute (gce): permission denied on {b.where(zone)} ({e.message}) — grant "
                "the credentials roles/compute.instanceAdmin.v1 on the project") from e

    def _call(self, what: str, fn: Callable[..., Any], /, **kw: Any) -> Any:
        """fn(**kw), retried on transient errors (5xx, 429, 403 rate limits, resets, timeouts)
        with exponential backoff and full jitter (AWS architecture blog, "Exponential Backoff
        And Jitter"; Compute's guidance for 5xx/429: cloud.google.com/compute/docs/api/
        how-tos/api-rate-limits). The last error is raised when the retries are spent."""
        b = self.block
        for attempt in range(b.api_retries + 1):
            try:
                return fn(**kw)
            except Exception as e:
                if not _transient(e) or attempt == b.api_retries:
                    raise
                pause = self._pause(attempt)
                log.warning("compute (gce): %s: %s — retry %d/%d in %.1f s", what,
                            _brief(e), attempt + 1, b.api_retries, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _pause(self, attempt: int) -> float:
        """Seconds before retry `attempt` (0-based): full jitter on a doubling ceiling."""
        b = self.block
        return random.uniform(0, min(b.retry_max_seconds, b.retry_base_seconds * 2 ** attempt))

    def _instances(self, strict: bool = True) -> Iterator[tuple[str, Any]]:
        """(zone, instance) for every configured zone whose instance exists. A missing
        instance in a fallback zone is skipped; in the primary zone it raises when `strict`."""
        for zone in self.block.zones():
            try:
                yield zone, self._get(zone)
            except ConfigError:
                if strict and zone == self.block.zone:
                    raise

    def _wait(self, zone: str, op: Any, deadline: float) -> Any:
        """Wait for a zone operation to be DONE (ZoneOperationsClient.wait returns early)."""
        _, ops = self._clients()
        import requests
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        b = self.block
        failures = 0
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                return op
            try:  # the server answers within ~2 min even if not DONE; our deadline may be sooner
                op = ops.wait(project=b.project, zone=zone, operation=op.name,
                              timeout=max(1.0, min(130.0, deadline - time.monotonic())))
                failures = 0
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return op  # the caller sees the deadline passed and reports it
            except Exception as e:  # a transient error of one wait: back off and wait again
                if not _transient(e) or failures >= b.api_retries:
                    raise
                pause = self._pause(failures)
                failures += 1
                log.warning("compute (gce): wait for %s in %s: %s — retry %d/%d in %.1f s",
                            op.name, zone, _brief(e), failures, b.api_retries, pause)
                time.sleep(pause)
        return op

    @staticmethod
    def _op_errors(op: Any) -> list[tuple[str, str]]:
        if not op.error or not op.error.errors:
            return []
        return [(e.code, e.message) for e in op.error.errors]

    # ---- node record ----------------------------------------------------------------------
    def _record_path(self) -> Path:
        return Path(self.block.state_dir) / f"gce-{self.block.instance}.json"

    def _write_record(self, node: NodeRecord | None, **extra: Any) -> None:
        data = {"node": asdict(node) if node else None, **extra}
        write_atomic(self._record_path(), json.dumps(data))

    def _read_record(self) -> dict[str, Any]:
        try:
            return json.loads(self._record_path().read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return {}

    def _node(self) -> NodeRecord | None:
        n = self._read_record().get("node")
        return NodeRecord(**n) if n else None

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self, max_run_seconds: float | None = None,
              timeout_seconds: float | None = None) -> str:
        """Start the node (or reuse one already up) and wait until it is RUNNING with an IP.
        Each start first sets the instance's scheduling (module docstring): Compute stops the
        node itself after `max_run_seconds` RUNNING (default: the block's max_run_seconds).
        Each placement tried waits up to boot_timeout_seconds; `timeout_seconds` caps the
        whole start besides (the nightly: what is left of the night's budget), and when it is
        spent no further placement is tried (NodeBootTimeout, naming what was).
        Returns a description: instance, zone, provisioning model, IP."""
        b = self.block
        run_limit = self._run_limit(max_run_seconds)
        started_at = time.time()
        if timeout_seconds is not None and timeout_seconds <= 0:
            raise NodeBootTimeout(f"compute (gce): no time left to boot {b.instance} "
                                  f"({timeout_seconds:.0f} s) — nothing was started")
        until = None if timeout_seconds is None else time.monotonic() + timeout_seconds

        def deadline() -> tuple[float, float]:  # (deadline, seconds) of the next boot wait
            limit = b.boot_timeout_seconds
            if until is not None:
                limit = min(limit, until - time.monotonic())
            return time.monotonic() + limit, limit

        for zone, inst in self._instances():  # idempotent: a node up in any zone is reused
            if inst.status in UP:
                node = self._await_running(zone, *deadline())
                self._write_record(node, started_at=self._read_record().get("started_at",
                                                                            started_at))
                return self._describe(node, reused=True)
        attempts: list[str] = []
        kinds: set[str] = set()
        no_quota: set[tuple[str, str]] = set()  # (region, model): GPU quota is per region
        for zone, model in placements(b.zones(), b.provisioning, b.on_demand_fallback):
            if (region_of(zone), model) in no_quota:
                attempts.append(f"{zone} {provisioning_name(model)}: skipped (quota exceeded "
                                f"in region {region_of(zone)})")
                continue
            if until is not None and time.monotonic() >= until:
                raise NodeBootTimeout(
                    f"compute (gce): {b.instance} not started within {timeout_seconds:.0f} s "
                    f"(the night's budget left for the boot){_tried(attempts)} — no "
                    f"{'further ' if attempts else ''}zone was tried; raise the night's "
                    "budget, or add fallback zones that have capacity")
            try:
                outcome = self._try_start(zone, model, run_limit, *deadline())
            except (ConfigError, ServerError) as e:  # no other placement would do better
                if attempts:  # name what was tried before (same type: callers sort on it)
                    raise type(e)(f"{e}{_tried(attempts)}") from e
                raise
            if isinstance(outcome, NodeRecord):
                self._write_record(outcome, started_at=started_at, attempts=attempts)
                return self._describe(outcome, attempts=attempts)
            attempts.append(f"{zone} {provisioning_name(model)}: {outcome.text}")
            kinds.add(outcome.kind)
            if outcome.kind == "quota exceeded":
                no_quota.add((region_of(zone), model))
            log.warning("compute (gce): %s %s: %s", b.where(zone), model, outcome.text)
        raise NodeUnavailable(
            f"compute (gce): could not start {b.instance} in any zone ({'; '.join(attempts)})"
            f" — {_unavailable_hint(kinds, b.on_demand_fallback or b.provisioning == 'on-demand')}")

    def _run_limit(self, max_run_seconds: float | None) -> int:
        """maxRunDuration in whole seconds, within Compute's 30 s … 120 days."""
        secs = self.block.max_run_seconds if max_run_seconds is None else max_run_seconds
        whole = math.ceil(secs)
        if not MIN_RUN_SECONDS <= whole <= MAX_RUN_SECONDS:
            raise ConfigError(f"compute (gce): max run {secs:.0f} s is outside Compute's "
                              f"maxRunDuration range ({MIN_RUN_SECONDS} s … 120 days) — fix "
                              "the block's max_run_seconds or the night's budget")
        return whole

    def _describe(self, node: NodeRecord, reused: bool = False,
                  attempts: list[str] | None = None) -> str:
        text = (f"GCE {self.block.project}/{node.zone}/{node.instance} "
                f"({provisioning_name(node.model)}, g2-standard-4) at {node.ip}")
        if reused:
            text += ", already running (reused)"
        if attempts:
            text += f"; fell back after: {'; '.join(attempts)}"
        return text

    def _try_start(self, zone: str, model: str, run_limit: int, deadline: float,
                   limit: float) -> NodeRecord | StartFailed:
        """Start in one zone with one provisioning model, waiting until `deadline` (`limit`
        seconds from now): the node, or why not (when another placement may do better);
        ConfigError/ServerError when none would."""
        import requests
        from google.api_core import exceptions as gexc

        b = self.block
        try:
            inst = self._get(zone)
        except ConfigError as e:
            if zone == b.zone:
                raise
            return StartFailed("skipped", f"skipped ({e})")
        if inst.status == "STOPPING":
            self._await_status(zone, STOPPED, deadline)
        elif inst.status not in STOPPED:
            return StartFailed("state", f"instance is {inst.status} (cannot start from that "
                                        "state)")
        client, _ = self._clients()
        if any(i.key == AGENT_KEY and i.value == "stopped" for i in inst.metadata.items):
            # the last run stopped vLLM through metadata: let it start at boot this time
            self._set_metadata(zone, {AGENT_KEY: "running"})
        failed = self._set_scheduling(zone, model, run_limit, deadline)
        if failed is not None:
            return failed
        try:  # not retried here: a start refused for load moves on to the next placement
            op = client.start_unary(project=b.project, zone=zone, instance=b.instance_in(zone))
        except (gexc.GoogleAPICallError, requests.exceptions.RequestException) as e:
            kind = _http_start_failure(e)
            if kind is None:
                raise self._refused(zone, "start", e) from e
            if kind in ("server error", "connection"):
                # the start may have reached Compute before the answer was lost: look first,
                # so that a node coming up here is not left running beside the next one
                if self._get(zone).status in BOOTING:
                    return self._boot(zone, deadline, limit)
            return StartFailed(kind, f"{kind} ({_brief(e)})")
        op = self._wait(zone, op, deadline)
        errors = self._op_errors(op)
        if errors:
            kind = start_failure(errors)
            if kind is None:
                raise ServerError(f"compute (gce): start of {b.where(zone)} failed: {errors}")
            if kind == "stocked out":
                return StartFailed(kind, "stocked out (" + "; ".join(c for c, _ in errors) + ")")
            return StartFailed(kind, f"{kind} (" + "; ".join(f"{c}: {m}" for c, m in errors)
                               + ")")
        return self._boot(zone, deadline, limit)

    def _boot(self, zone: str, deadline: float, limit: float) -> NodeRecord | StartFailed:
        try:
            return self._await_running(zone, deadline, limit)
        except NodePreempted as e:  # spot capacity went while booting: the next placement
            return StartFailed("preempted while booting", f"preempted while booting ({e})")

    def _set_scheduling(self, zone: str, model: str, run_limit: int,
                        deadline: float) -> StartFailed | None:
        """Set every scheduling field a start depends on (module docstring: Compute keeps the
        fields a setScheduling body leaves out). None when done."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        b = self.block
        client, _ = self._clients()
        sched = compute_v1.Scheduling(
            provisioning_model=model, preemptible=model == "SPOT", automatic_restart=False,
            on_host_maintenance="TERMINATE", instance_termination_action="STOP",
            max_run_duration=compute_v1.Duration(seconds=run_limit))
        try:
            op = self._call(f"setScheduling {b.where(zone)}", client.set_scheduling_unary,
                            project=b.project, zone=zone, instance=b.instance_in(zone),
                            scheduling_resource=sched)
        except gexc.GoogleAPICallError as e:
            raise self._refused(zone, "setScheduling", e) from e
        op = self._wait(zone, op, deadline)
        if self._op_errors(op):
            return StartFailed("scheduling", f"setScheduling {model} failed: "
                                             f"{self._op_errors(op)}")
        return None

    def _refused(self, zone: str, verb: str, e: Any) -> ConfigError:
        """A refusal no other zone would answer differently, as a ConfigError with the fix."""
        from google.api_core import exceptions as gexc

        b = self.block
        if isinstance(e, gexc.Forbidden):
            caller = self._caller()
            return ConfigError(
                f"compute (gce): {verb} on {b.where(zone)} refused: {_brief(e)} — grant "
                f"{caller} roles/compute.instanceAdmin.v1: gcloud projects "
                f"add-iam-policy-binding {b.project} --member={_member(caller)} "
                "--role=roles/compute.instanceAdmin.v1")
        if isinstance(e, gexc.NotFound):
            return ConfigError(f"compute (gce): {verb} on {b.where(zone)}: not found — create "
                               "the instance or fix project/zone/instance in the profile")
        return ConfigError(f"compute (gce): {verb} on {b.where(zone)} refused: {_brief(e)} — "
                           "check the instance's configuration (machine type, GPU, scheduling) "
                           "in the console")

    def _caller(self) -> str:
        """The principal the orchestrator's credentials act as (for messages)."""
        gc = self.block.gcp_credentials
        try:
            if gc is not None and gc.service_account_info is not None:
                return str(gc.service_account_info.get_secret_value()["client_email"])
            if gc is not None and gc.service_account_file is not None:
                return str(json.loads(Path(gc.service_account_file).read_text())["client_email"])
            client, _ = self._clients()
            creds = client._transport._credentials  # noqa: SLF001 - only for the message
            email = getattr(creds, "service_account_email", None)
            if email and email != "default":
                return str(email)
        except Exception:  # noqa: BLE001 - only a name for a message
            pass
        return "the orchestrator's credentials (`gcloud auth list`)"

    def _await_status(self, zone: str, wanted: set[str], deadline: float) -> Any:
        poll = min(self.block.poll_seconds, 0.5)
        while True:
            inst = self._get(zone)
            if inst.status in wanted:
                return inst
            if time.monotonic() > deadline:
                return inst
            time.sleep(poll)
            poll = min(poll * 1.5, self.block.poll_seconds)

    def _await_running(self, zone: str, deadline: float, limit: float) -> NodeRecord:
        b = self.block
        inst = self._await_status(zone, {"RUNNING", *STOPPED}, deadline)
        if inst.status == "RUNNING" and inst.network_interfaces and \
                inst.network_interfaces[0].network_i_p:
            return NodeRecord(zone, b.instance_in(zone), inst.network_interfaces[0].network_i_p,
                              inst.scheduling.provisioning_model or "STANDARD")
        if inst.status in STOPPED:
            raise NodePreempted(f"compute (gce): {b.where(zone)} went {inst.status} while "
                                "booting (spot preemption?) — rerun the flow")
        self._request_stop_in(zone)  # do not pay for a node this run gives up on
        capped = limit < b.boot_timeout_seconds  # the night's budget, not the block, ended it
        raise NodeBootTimeout(
            f"compute (gce): {b.where(zone)} not RUNNING after {limit:.0f} s (status "
            f"{inst.status}); a stop was requested — " + (
                "the night's budget left no more time for the boot" if capped else
                "raise boot_timeout_seconds if the image is slow to boot"))

    def _request_stop_in(self, zone: str) -> None:
        client, _ = self._clients()
        self._call(f"stop {self.block.where(zone)}", client.stop_unary,
                   project=self.block.project, zone=zone, instance=self.block.instance_in(zone))

    def request_stop(self) -> list[str]:
        """Ask Compute to stop the node without waiting (seconds, not minutes): the first thing
        a cancelled run's `finally` does within Prefect's 30 s grace. The zone of this run's
        node from the node record; without a record, every configured zone whose instance is
        up. Returns the zones asked; `stop()` then waits for TERMINATED."""
        node = self._node()
        zones = [node.zone] if node else [z for z, s in self.running().items()
                                          if s != "STOPPING"]
        for zone in zones:
            self._request_stop_in(zone)
        return zones

    @property
    def watch_seconds(self) -> float:
        """How often a watch of work on the node (run_on_node) checks it: poll_seconds."""
        return self.block.poll_seconds

    def check_running(self) -> None:
        """NodePreempted unless the node this run started is RUNNING (transient API errors
        are retried: a watch survives them)."""
        self._running_node()

    def _running_node(self) -> NodeRecord:
        node = self._node()
        if node is None:
            raise ServerError("compute (gce): no node was started by this run — call start() first")
        inst = self._get(node.zone)
        if inst.status != "RUNNING":
            why = self._preemption(node.zone, inst)
            raise NodePreempted(f"compute (gce): {self.block.where(node.zone)} is {inst.status} "
                                f"while the run uses it ({why}) — rerun the flow")
        return node

    def _preemption(self, zone: str, inst: Any) -> str:
        """'preempted at T' when Compute recorded a preemption of this instance, else a guess."""
        _, ops = self._clients()
        try:
            from google.cloud import compute_v1

            page = ops.list(request=compute_v1.ListZoneOperationsRequest(
                project=self.block.project, zone=zone,
                filter='operationType="compute.instances.preempted"'))
            for op in page:
                if str(op.target_id) == str(inst.id) or op.target_link.endswith(
                        f"/instances/{inst.name}"):
                    return f"spot preemption at {op.end_time or op.insert_time}"
        except Exception as e:  # noqa: BLE001 - the status already tells the story
            log.debug("preemption lookup failed: %s", e)
        limit = inst.scheduling.max_run_duration.seconds if inst.scheduling.max_run_duration \
            else 0
        if limit:  # Compute records no operation of its own for this stop that we rely on
            return (f"stopped outside this run, preempted, or stopped by Compute at its max run "
                    f"duration ({limit} s RUNNING: raise max_run_seconds if the night needs "
                    "longer)")
        return "stopped outside this run, or preempted"

    def start_inference(self, endpoint: InferenceEndpoint, adapter: Path | None = None,
                        names: tuple[str, ...] = ()) -> str:
        """Wait for vLLM (started by the node's startup script) at http://IP:port to list a
        model, checking the node is still RUNNING while waiting; return the base URL.
        `adapter` is not loaded (loads_adapters is False): a warning says so."""
        b = self.block
        if adapter is not None:  # not built: fetching it onto the node and restarting vLLM
            _progress(f"promoted adapter {adapter} is NOT loaded by the GCE node's vLLM (not "
                      "built yet; a 7B adapter also needs a 7B server) — set [training] "
                      "serve_bucket = \"\" to silence this", logging.WARNING)
        node = self._running_node()
        base_url = endpoint.base_url or f"http://{node.ip}:{b.inference_port}"
        key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
        if self._metadata(node.zone).get(AGENT_KEY) == "stopped":
            self._set_metadata(node.zone, {AGENT_KEY: "running"})
        started = time.monotonic()
        deadline = started + endpoint.readiness_timeout_seconds
        poll = 1.0
        next_check = started + b.poll_seconds
        # a failed boot is read from a guest attribute: cheap, so sooner than the status poll
        boot_every = min(b.poll_seconds, BOOT_STATUS_SECONDS)
        next_boot_check = started + boot_every
        next_report = started + b.progress_seconds
        while True:
            stage, models = inference_server.probe(base_url, key)
            if stage == "ready":
                break
            now = time.monotonic()
            if now > deadline:
                raise ServerError(
                    f"inference endpoint {base_url} not ready after "
                    f"{endpoint.readiness_timeout_seconds:.0f} s (last: {stage}) — check the "
                    f"node's serial console / `journalctl -u {ENGINE_UNIT}` on {node.instance}, or "
                    "raise the inference block's readiness_timeout_seconds")
            if now >= next_report:
                _progress(f"waiting for vLLM at {base_url}: {stage} — {now - started:.0f} s "
                          f"of {endpoint.readiness_timeout_seconds:.0f} s")
                next_report = now + b.progress_seconds
            if now >= next_check:
                self.check_running()
                next_check = now + b.poll_seconds
            if now >= next_boot_check:
                self._raise_startup_failure(node)
                next_boot_check = now + boot_every
            time.sleep(poll)
            poll = min(poll * 1.5, 10.0)
        if endpoint.model not in models:
            raise ConfigError(f"vLLM at {base_url} serves {models}, not {endpoint.model!r} — set "
                              "the inference block's model to the node's --served-model-name "
                              "(the startup script uses the block's model: re-run "
                              "install_startup_script after changing it)")
        _progress(f"vLLM ready at {base_url} after {time.monotonic() - started:.0f} s "
                  f"(serving {', '.join(models)})")
        return base_url

    def _raise_startup_failure(self, node: NodeRecord) -> None:
        """ServerError with the cause when the node's startup script reported a failure."""
        client, _ = self._clients()
        cause = startup_failure(client, self.block.project, node.zone, node.instance)
        if cause:
            raise ServerError(
                f"the startup script of {self.block.where(node.zone)} failed: {cause} — fix it "
                f"and rerun; the whole log is in `journalctl -u google-startup-scripts` on "
                f"{node.instance} (the engine's: `journalctl -u {ENGINE_UNIT}`)")

    def _metadata(self, zone: str) -> dict[str, str]:
        return {i.key: i.value for i in self._get(zone).metadata.items}

    def _set_metadata(self, zone: str, updates: dict[str, str]) -> None:
        """Compare-and-swap on the metadata fingerprint: another writer in between makes
        Compute refuse the write (412), and it is retried on a fresh read."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        b = self.block
        client, _ = self._clients()
        for _ in range(5):
            md = self._get(zone).metadata
            items = metadata_items([{"key": i.key, "value": i.value} for i in md.items], updates)
            body = compute_v1.Metadata(fingerprint=md.fingerprint,
                                       items=[compute_v1.Items(**i) for i in items])
            try:
                op = self._call(f"setMetadata {b.where(zone)}", client.set_metadata_unary,
                                project=b.project, zone=zone, instance=b.instance_in(zone),
                                metadata_resource=body)
            except gexc.PreconditionFailed:
                continue
            except (gexc.Forbidden, gexc.BadRequest) as e:
                raise self._metadata_refused(zone, e) from e
            op = self._wait(zone, op, time.monotonic() + 120)
            if self._op_errors(op):
                raise ServerError(f"compute (gce): setMetadata on {b.where(zone)} failed: "
                                  f"{self._op_errors(op)}")
            return
        raise ServerError(f"compute (gce): metadata of {b.where(zone)} kept changing — retry")

    def _metadata_refused(self, zone: str, e: Any) -> ConfigError:
        """setMetadata on an instance that runs as a service account also needs
        iam.serviceAccounts.actAs on that account (instances.setMetadata's IAM permissions in
        the Compute API reference): name the role, both principals and the command."""
        b = self.block
        text = _brief(e)
        if "actAs" not in text and "serviceAccountUser" not in text:
            return self._refused(zone, "setMetadata", e)
        try:
            node_sa = self._get(zone).service_accounts[0].email
        except Exception:  # noqa: BLE001 - the message names the role either way
            node_sa = "the node's service account"
        caller = self._caller()
        return ConfigError(
            f"compute (gce): setMetadata on {b.where(zone)} refused: {text} — the instance runs "
            f"as {node_sa}, so writing its metadata needs {SA_USER_ROLE} on that account for "
            f"{caller}: gcloud iam service-accounts add-iam-policy-binding {node_sa} "
            f"--project={b.project} --member={_member(caller)} --role={SA_USER_ROLE}")

    def install_startup_script(self, endpoint: InferenceEndpoint,
                               lora_modules: dict[str, str] | None = None,
                               api_key_secret: str | None = None) -> list[str]:
        """Write the rendered startup script (engine + watcher + Prefect worker) into every
        zone's instance metadata (`startup-script`, with enable-guest-attributes=TRUE so a
        failed boot can say why); it takes effect at the next boot. Returns the zones written."""
        wanted = self._script_metadata(endpoint, lora_modules, api_key_secret)
        done = []
        for zone in self.block.zones():
            self._set_metadata(zone, wanted)
            done.append(zone)
        return done

    def _script_metadata(self, endpoint: InferenceEndpoint,
                         lora_modules: dict[str, str] | None = None,
                         api_key_secret: str | None = None) -> dict[str, str]:
        """The metadata a node boots from: the startup script rendered from the blocks, and
        guest attributes on (off by default on Compute Engine: the script reports a failed
        boot through one, slm/startup-error, which start_inference reads)."""
        b = self.block
        try:
            script = render_startup_script(
                endpoint, lora_modules, port=b.inference_port, settings=b.node,
                api_key_secret=api_key_secret or b.node.engine_api_key_secret)
        except ValueError as e:
            raise ConfigError(f"compute (gce): {e}") from e
        return {"startup-script": script, "enable-guest-attributes": "TRUE"}

    def prepare(self, endpoint: InferenceEndpoint) -> list[str]:
        """Make what the node boots match the profile: in each zone whose instance metadata
        holds another `startup-script` (or guest attributes off), write the one rendered from
        the blocks (install_startup_script). Run before every start, so a changed profile
        reaches the node at its next boot without a manual step. Returns the zones written."""
        wanted = self._script_metadata(endpoint)
        written = []
        for zone, inst in self._instances():
            current = {i.key: i.value for i in inst.metadata.items}
            if any(current.get(k) != v for k, v in wanted.items()):
                self._set_metadata(zone, wanted)
                written.append(zone)
        return written

    def stop_inference(self) -> bool:
        """Tell the node's watcher to stop vLLM (metadata slm-vllm=stopped) and wait until the
        port no longer answers, so training has the GPU. Returns True if a server was up."""
        node = self._node()
        if node is None:
            return False
        inst = self._get(node.zone)
        if inst.status != "RUNNING":
            return False
        url = f"http://{node.ip}:{self.block.inference_port}"
        was_up = inference_server.models_ready(url)
        self._set_metadata(node.zone, {AGENT_KEY: "stopped"})
        deadline = time.monotonic() + 120
        while self.inference_running():
            if time.monotonic() > deadline:
                raise ServerError(f"vLLM on {node.instance} still answers at {url} 120 s after "
                                  f"slm-vllm=stopped — check the {WATCH_UNIT} unit on the node")
            time.sleep(0.5)
        return was_up

    def inference_running(self) -> bool:
        node = self._node()
        if node is None:
            return False
        from tasks.processes import port_open

        return port_open(self.block.inference_port, node.ip)

    def stop(self) -> list[str]:
        """Stop the node in every configured zone where it is up, and wait until TERMINATED.
        Idempotent: already stopped → nothing to do. Returns the zones stopped."""
        b = self.block
        stopped: list[str] = []
        deadline = time.monotonic() + b.stop_timeout_seconds
        for zone, inst in self._instances():
            if inst.status in STOPPED:
                continue
            if inst.status != "STOPPING":
                client, _ = self._clients()
                op = self._call(f"stop {b.where(zone)}", client.stop_unary,
                                project=b.project, zone=zone, instance=b.instance_in(zone))
                self._wait(zone, op, deadline)
            inst = self._await_status(zone, STOPPED, deadline)
            if inst.status not in STOPPED:
                raise ServerError(f"compute (gce): {b.where(zone)} still {inst.status} after "
                                  f"{b.stop_timeout_seconds:.0f} s — check the console; it "
                                  "keeps costing money while up")
            stopped.append(zone)
        rec = self._read_record()
        if rec:
            self._write_record(None, started_at=rec.get("started_at"),
                               last_node=rec.get("node") or rec.get("last_node"))
        return stopped

    def running(self) -> dict[str, str]:
        """zone → status for every configured zone whose instance is not stopped."""
        return {zone: inst.status for zone, inst in self._instances(strict=False)
                if inst.status not in STOPPED}

    def signal_stops(self) -> list[tuple[str, ManagedServer, Callable[[], bool]]]:
        """Nothing of the GCE node runs on this machine: the run's teardown stops the node."""
        return []

    def usage(self, since: float | None = None) -> NodeUsage:
        """RUNNING seconds and estimated cost of the node since `since` (epoch seconds; default:
        this run's first start). From each instance's lastStart/lastStopTimestamp: the most
        recent RUNNING span per zone (tasks/compute/cost.py)."""
        b = self.block
        since = since if since is not None else self._read_record().get("started_at") or 0.0
        now = time.time()
        zones: dict[str, dict[str, Any]] = {}
        for zone, inst in self._instances(strict=False):
            used = zone_usage(status=inst.status, last_start=timestamp(inst.last_start_timestamp),
                              last_stop=timestamp(inst.last_stop_timestamp),
                              spot=(inst.scheduling.provisioning_model or "") == "SPOT",
                              since=since, now=now, spot_usd_per_hour=b.spot_usd_per_hour,
                              on_demand_usd_per_hour=b.on_demand_usd_per_hour)
            if used is not None:
                zones[zone] = used
        return NodeUsage.model_validate(total_usage(zones))


def _reasons(e: Any) -> set[str]:
    return {r for r, _ in _details(e)} | ({e.reason} if getattr(e, "reason", None) else set())


def _transient(e: BaseException) -> bool:
    """Whether a failed call may succeed when repeated: 5xx, 429, 403 rate limits (Compute
    answers 403 rateLimitExceeded for its per-minute limits), connection resets, timeouts."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import TransportError

    if isinstance(e, (gexc.ServerError, gexc.TooManyRequests, gexc.DeadlineExceeded,
                      gexc.ServiceUnavailable, requests.exceptions.ConnectionError,
                      requests.exceptions.Timeout, TransportError, ConnectionError)):
        return True
    return isinstance(e, gexc.Forbidden) and bool(_reasons(e) & RATE_LIMIT_REASONS)


def _http_start_failure(e: BaseException) -> str | None:
    """A start call refused with an HTTP error: the kind, when another placement may do
    better; None for a refusal every zone would repeat (permission, not found, bad request)."""
    import requests
    from google.api_core import exceptions as gexc

    if isinstance(e, requests.exceptions.RequestException):
        return "connection"
    reasons = _reasons(e)
    items = [(r, m) for r, m in _details(e)] + [("", getattr(e, "message", "") or "")]
    kind = start_failure(items + [(r, "") for r in reasons])
    if kind is not None:
        return kind
    if isinstance(e, gexc.ServerError):
        return "server error"
    if isinstance(e, gexc.TooManyRequests) or reasons & RATE_LIMIT_REASONS:
        return "rate limited"
    return None


def _brief(e: BaseException) -> str:
    """An API error in one line: HTTP code, reason, message (no URL, no credentials)."""
    code = getattr(e, "code", None)
    reasons = ",".join(sorted(_reasons(e))) if hasattr(e, "errors") else ""
    message = getattr(e, "message", None) or str(e)
    message = message.split(": ", 1)[1] if message.startswith(("GET ", "POST ")) else message
    head = " ".join(str(x) for x in (code, reasons) if x)
    return f"{head}: {message}" if head else message


def _member(principal: str) -> str:
    """An IAM member for a principal named in a message."""
    if principal.endswith(".gserviceaccount.com"):
        return f"serviceAccount:{principal}"
    return f"user:{principal}" if "@" in principal else "serviceAccount:ORCHESTRATOR_SA_EMAIL"


def _tried(attempts: list[str]) -> str:
    return f" (tried before: {'; '.join(attempts)})" if attempts else ""


def _unavailable_hint(kinds: set[str], on_demand_allowed: bool) -> str:
    """What to do when no placement came up, from why each did not."""
    hints = []
    if kinds & {"stocked out", "preempted while booting", "server error", "rate limited",
                "connection"}:
        hints.append("add fallback_zones, or retry later")
        if not on_demand_allowed:
            hints.append("set on_demand_fallback = true to allow on-demand")
    if "quota exceeded" in kinds:
        hints.append("raise the GPU quota named above (console: IAM & Admin → Quotas; "
                     "PREEMPTIBLE_NVIDIA_L4_GPUS for spot, NVIDIA_L4_GPUS for on-demand, per "
                     "region) or list zones in another region")
    if "unsupported" in kinds:
        hints.append("use zones that offer the L4 with this provisioning model "
                     "(`gcloud compute accelerator-types list --filter=name=nvidia-l4`)")
    return "; ".join(hints) or "see each attempt above"


def _details(e: Any) -> list[tuple[str, str]]:
    """(reason, message) of the error items a refused Compute call carries."""
    out = []
    for d in e.errors or []:
        if isinstance(d, dict):
            out.append((str(d.get("reason", "")), str(d.get("message", ""))))
    return out


def _progress(message: str, level: int = logging.INFO) -> None:
    """Log to the Prefect run when there is one (the UI shows it), else to this module's log."""
    try:
        from prefect import get_run_logger

        get_run_logger().log(level, message)
    except Exception:  # noqa: BLE001 - MissingContextError outside a run
        log.log(level, message)
