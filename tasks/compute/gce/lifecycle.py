"""The GCE node's lifecycle (the node protocol of tasks/compute/protocol.py on a GceCompute
block): start with zone/spot fallbacks, wait for the engine, stop it and the node, detect
preemption, read the cost.

The engine on the node — its startup script, the wait for it, its stop — is engine.py; the
node record that says which zone this run's node is in is record.py.

Every start sets the scheduling first (instances.setScheduling, all of its fields: Compute
keeps the fields a body leaves out, so a SPOT instance's preemptible/STOP would survive a switch
to on-demand and make it invalid): the placement's provisioning model, automaticRestart false,
onHostMaintenance TERMINATE (an L4 cannot live-migrate), instanceTerminationAction STOP and
maxRunDuration = the night's budget, so Compute stops a node whose orchestrator died (the
reaper, flows/reaper.py, is the second layer).

Start errors are sorted (cloud.google.com/compute/docs/troubleshooting/
troubleshooting-resource-availability, …/quotas; api_errors.py): a stockout
(ZONE_RESOURCE_POOL_EXHAUSTED*), QUOTA_EXCEEDED, UNSUPPORTED_OPERATION, a 5xx/429/rate limit on
the start call and a preemption during boot move on to the next placement (placement.py); a
refusal that no other zone would answer differently (permission, not found, bad request) ends
the start at once with the fix. The calls that read or wait are retried (api.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import requests
from google.api_core import exceptions as gexc
from prefect import get_run_logger

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute.gce import engine
from tasks.compute.gce.api import ComputeApi
from tasks.compute.gce.api_errors import brief, http_start_failure
from tasks.compute.gce.cost import total_usage, zone_usage
from tasks.compute.gce.instance import STOPPED, UP, Instance, Status
from tasks.compute.gce.placement import (
    ProvisioningModel,
    StartFailureKind,
    placements,
    provisioning_name,
    region_of,
    start_failure,
)
from tasks.compute.gce.record import NodeRecord, RecordFile
from tasks.compute.gce.startup import ENGINE_STATE_KEY
from tasks.records import NodeUsage, ZoneSpan
from tasks.shared.errors import (
    ConfigError,
    NodeBootTimeout,
    NodePreempted,
    NodeUnavailable,
    ServerError,
)
from tasks.shared.processes import ManagedServer, port_open
from tasks.shared.waiting import poll

log = logging.getLogger("slm_nightly.gce")

MIN_RUN_SECONDS, MAX_RUN_SECONDS = 30, 120 * 86400  # maxRunDuration's range (limit-vm-runtime)


@dataclass
class StartFailed:
    """Why one placement did not come up, when the next one may: kind (stocked out, quota
    exceeded, unsupported, server error, rate limited, preempted while booting, …) and the
    text the final error names it with."""
    kind: StartFailureKind
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
        self.api = ComputeApi(block)
        self.record = RecordFile(block)

    def __repr__(self) -> str:
        return f"GceNode({self.block!r})"

    @property
    def base_model(self) -> str | None:
        return None  # the node's engine weights are not a training base on this machine

    @property
    def boot_timeout_seconds(self) -> float | None:
        return self.block.boot_timeout_seconds

    @property
    def stop_timeout_seconds(self) -> float | None:
        return self.block.stop_timeout_seconds

    # ---- start ----------------------------------------------------------------------------
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

        for inst in self.api.instances():  # idempotent: a node up in any zone is reused
            if inst.status in UP:
                node = self._await_running(inst.zone, *deadline())
                self.record.write(node, started_at=self.record.read().get("started_at",
                                                                          started_at))
                return self._describe(node, reused=True)
        attempts: list[str] = []
        kinds: set[StartFailureKind] = set()
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
                self.record.write(outcome, started_at=started_at, attempts=attempts)
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

    def _try_start(self, zone: str, model: ProvisioningModel, run_limit: int, deadline: float,
                   limit: float) -> NodeRecord | StartFailed:
        """Start in one zone with one provisioning model, waiting until `deadline` (`limit`
        seconds from now): the node, or why not (when another placement may do better);
        ConfigError/ServerError when none would."""
        b = self.block
        try:
            inst = self.api.get(zone)
        except ConfigError as e:
            if zone == b.zone:
                raise
            return StartFailed("skipped", f"skipped ({e})")
        if inst.status == "STOPPING":
            self._await_status(zone, STOPPED, deadline)
        elif inst.status not in STOPPED:
            return StartFailed("state", f"instance is {inst.status} (cannot start from that "
                                        "state)")
        if inst.metadata.get(ENGINE_STATE_KEY) == "stopped":
            # the last run stopped the engine through metadata: let it start at boot this time
            self.api.set_metadata(zone, {ENGINE_STATE_KEY: "running"})
        errors = self.api.set_scheduling(zone, model, run_limit, deadline)
        if errors:
            return StartFailed("scheduling", f"setScheduling {model} failed: {errors}")
        try:
            op = self.api.start(zone)
        except (gexc.GoogleAPICallError, requests.exceptions.RequestException) as e:
            kind = http_start_failure(e)
            if kind is None:
                raise self.api.refused(zone, "start", e) from e
            if kind in ("server error", "connection"):
                # the start may have reached Compute before the answer was lost: look first,
                # so that a node coming up here is not left running beside the next one
                if self.api.get(zone).status in UP:
                    return self._boot(zone, deadline, limit)
            return StartFailed(kind, f"{kind} ({brief(e)})")
        errors = self.api.errors(zone, op, deadline)
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

    def _await_status(self, zone: str, wanted: frozenset[Status] | set[Status],
                      deadline: float) -> Instance:
        """The instance once its status is one of `wanted`, or as it is at `deadline`."""
        last: list[Instance] = []

        def reached() -> Instance | None:
            last[:] = [self.api.get(zone)]
            return last[0] if last[0].status in wanted else None

        every = self.block.poll_seconds
        return poll(reached, deadline - time.monotonic(), first=min(every, 0.5), factor=1.5,
                    cap=every) or last[0]

    def _await_running(self, zone: str, deadline: float, limit: float) -> NodeRecord:
        b = self.block
        inst = self._await_status(zone, {"RUNNING", *STOPPED}, deadline)
        if inst.status == "RUNNING" and inst.internal_ip:
            return NodeRecord(zone, b.instance_in(zone), inst.internal_ip,
                              inst.provisioning_model or "STANDARD")
        if inst.status in STOPPED:
            raise NodePreempted(f"compute (gce): {b.where(zone)} went {inst.status} while "
                                "booting (spot preemption?) — rerun the flow")
        self.api.stop(zone)  # do not pay for a node this run gives up on
        capped = limit < b.boot_timeout_seconds  # the night's budget, not the block, ended it
        raise NodeBootTimeout(
            f"compute (gce): {b.where(zone)} not RUNNING after {limit:.0f} s (status "
            f"{inst.status}); a stop was requested — " + (
                "the night's budget left no more time for the boot" if capped else
                "raise boot_timeout_seconds if the image is slow to boot"))

    # ---- watch ----------------------------------------------------------------------------
    @property
    def watch_seconds(self) -> float:
        """How often a watch of work on the node (run_on_node) checks it: poll_seconds."""
        return self.block.poll_seconds

    def check_running(self) -> None:
        """NodePreempted unless the node this run started is RUNNING (transient API errors
        are retried: a watch survives them)."""
        self._running_node()

    def _running_node(self) -> NodeRecord:
        node = self.record.node()
        if node is None:
            raise ServerError("compute (gce): no node was started by this run — call start() first")
        inst = self.api.get(node.zone)
        if inst.status != "RUNNING":
            why = self._preemption(inst)
            raise NodePreempted(f"compute (gce): {self.block.where(node.zone)} is {inst.status} "
                                f"while the run uses it ({why}) — rerun the flow")
        return node

    def _preemption(self, inst: Instance) -> str:
        """'preempted at T' when Compute recorded a preemption of this instance, else a guess."""
        recorded = self.api.preemption(inst)
        if recorded:
            return recorded
        if inst.max_run_seconds:  # Compute records no operation of its own for this stop
            return (f"stopped outside this run, preempted, or stopped by Compute at its max run "
                    f"duration ({inst.max_run_seconds} s RUNNING: raise max_run_seconds if the "
                    "night needs longer)")
        return "stopped outside this run, or preempted"

    def running(self) -> dict[str, str]:
        """zone → status for every configured zone whose instance is not stopped."""
        return {inst.zone: inst.status for inst in self.api.instances(strict=False)
                if inst.status not in STOPPED}

    # ---- the engine (engine.py) -----------------------------------------------------------
    def start_inference(self, endpoint: InferenceEndpoint, adapter: Path | None = None,
                        names: tuple[str, ...] = ()) -> str:
        """Wait for the engine (started by the node's startup script) at http://IP:port to
        list a model, checking the node is still RUNNING while waiting; return the base URL.
        `adapter` is not loaded (loads_adapters is False): a warning says so."""
        if adapter is not None:  # not built: fetching it onto the node and restarting the engine
            _progress(f"promoted adapter {adapter} is NOT loaded by the GCE node's engine (not "
                      "built yet; a 7B adapter also needs a 7B server) — set [training] "
                      "serve_bucket = \"\" to silence this", logging.WARNING)
        return engine.wait_ready(self.api, self._running_node(), endpoint, self.check_running,
                                 _progress)

    def stop_inference(self) -> bool:
        """Tell the node's watcher to stop the engine (metadata slm-engine=stopped) and wait until
        the port no longer answers, so training has the GPU. Returns True if a server was up."""
        node = self.record.node()
        if node is None or self.api.get(node.zone).status != "RUNNING":
            return False
        return engine.stop(self.api, node)

    def inference_running(self) -> bool:
        node = self.record.node()
        return node is not None and port_open(self.block.inference_port, node.ip)

    def install_startup_script(self, endpoint: InferenceEndpoint,
                               lora_modules: dict[str, str] | None = None,
                               api_key_secret: str | None = None) -> list[str]:
        """Write the rendered startup script (engine + watcher + Prefect worker) into every
        zone's instance metadata (`startup-script`, with enable-guest-attributes=TRUE so a
        failed boot can say why); it takes effect at the next boot. Returns the zones written."""
        wanted = engine.script_metadata(self.block, endpoint, lora_modules, api_key_secret)
        for zone in self.block.zones():
            self.api.set_metadata(zone, wanted)
        return self.block.zones()

    def prepare(self, endpoint: InferenceEndpoint) -> list[str]:
        """Make what the node boots match the profile: in each zone whose instance metadata
        holds another `startup-script` (or guest attributes off), write the one rendered from
        the blocks (install_startup_script). Run before every start, so a changed profile
        reaches the node at its next boot without a manual step. Returns the zones written."""
        wanted = engine.script_metadata(self.block, endpoint)
        written = []
        for inst in self.api.instances():
            if any(inst.metadata.get(k) != v for k, v in wanted.items()):
                self.api.set_metadata(inst.zone, wanted)
                written.append(inst.zone)
        return written

    # ---- stop -----------------------------------------------------------------------------
    def request_stop(self) -> list[str]:
        """Ask Compute to stop the node without waiting (seconds, not minutes): the first thing
        a cancelled run's `finally` does within Prefect's 30 s grace. The zone of this run's
        node from the node record; without a record, every configured zone whose instance is
        up. Returns the zones asked; `stop()` then waits for TERMINATED."""
        node = self.record.node()
        zones = [node.zone] if node else [z for z, s in self.running().items()
                                          if s != "STOPPING"]
        for zone in zones:
            self.api.stop(zone)
        return zones

    def stop(self) -> list[str]:
        """Stop the node in every configured zone where it is up, and wait until TERMINATED.
        Idempotent: already stopped → nothing to do. Returns the zones stopped."""
        b = self.block
        stopped: list[str] = []
        deadline = time.monotonic() + b.stop_timeout_seconds
        for inst in self.api.instances():
            zone = inst.zone
            if inst.status in STOPPED:
                continue
            if inst.status != "STOPPING":
                self.api.errors(zone, self.api.stop(zone), deadline)
            inst = self._await_status(zone, STOPPED, deadline)
            if inst.status not in STOPPED:
                raise ServerError(f"compute (gce): {b.where(zone)} still {inst.status} after "
                                  f"{b.stop_timeout_seconds:.0f} s — check the console; it "
                                  "keeps costing money while up")
            stopped.append(zone)
        rec = self.record.read()
        if rec:
            self.record.write(None, started_at=rec.get("started_at"),
                              last_node=rec.get("node") or rec.get("last_node"))
        return stopped

    def signal_stops(self) -> list[tuple[str, ManagedServer, Callable[[], bool]]]:
        """Nothing of the GCE node runs on this machine: the run's teardown stops the node."""
        return []

    server_exit = None  # the engine is the node's; a preemption is check_running's to see

    def engine_here(self, state_dir: Path) -> Self | None:
        """None: the engine runs on the VM, which only the nightly boots."""
        return None

    def usage(self, since: float | None = None) -> NodeUsage:
        """RUNNING seconds and estimated cost of the node since `since` (epoch seconds; default:
        this run's first start). From each instance's lastStart/lastStopTimestamp: the most
        recent RUNNING span per zone (cost.py)."""
        b = self.block
        since = since if since is not None else self.record.read().get("started_at") or 0.0
        now = time.time()
        zones: dict[str, ZoneSpan] = {}
        for inst in self.api.instances(strict=False):
            used = zone_usage(inst, since=since, now=now,
                              spot_usd_per_hour=b.spot_usd_per_hour,
                              on_demand_usd_per_hour=b.on_demand_usd_per_hour)
            if used is not None:
                zones[inst.zone] = used
        return total_usage(zones)


def _tried(attempts: list[str]) -> str:
    return f" (tried before: {'; '.join(attempts)})" if attempts else ""


def _unavailable_hint(kinds: set[StartFailureKind], on_demand_allowed: bool) -> str:
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


def _progress(message: str, level: int = logging.INFO) -> None:
    """Log to the Prefect run when there is one (the UI shows it), else to this module's log."""
    try:
        get_run_logger().log(level, message)
    except Exception:  # noqa: BLE001 - MissingContextError outside a run
        log.log(level, message)
