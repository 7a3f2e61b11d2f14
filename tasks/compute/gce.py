"""The GCE node's lifecycle (the node protocol of tasks/compute/protocol.py on a GceCompute
block): start with zone/spot fallbacks, wait for vLLM, stop it and the node, detect
preemption, read the cost.

Stopping the inference server. The node's startup script (tasks/compute/startup_script.py)
runs a watcher that obeys the instance metadata key `slm-vllm` (`stopped` | `running`):
stop_inference sets it to `stopped` and then checks that port 9080 no longer answers.

The node record (<state_dir>/gce-<instance>.json) says which zone this run's node is in, so a
later call — the teardown hook, the reaper, another process — stops the right one.

Client calls: the `*_unary` methods plus ZoneOperationsClient.wait (the `.result()` helpers
poll through a client that ignores a custom api_endpoint).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute import inference_server
from tasks.compute.cost import UP, timestamp, total_usage, zone_usage
from tasks.compute.boot_status import startup_failure
from tasks.compute.placement import is_stockout, placements, provisioning_name
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

log = logging.getLogger("slm_nightly.gce")

STOPPED = {"TERMINATED", "STOPPED"}
BOOT_STATUS_SECONDS = 10.0  # how often the wait for the engine reads the startup script's error


@dataclass
class NodeRecord:
    zone: str
    instance: str
    ip: str
    model: str  # SPOT | STANDARD


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
            return inst.get(project=b.project, zone=zone, instance=b.instance_in(zone))
        except gexc.NotFound as e:
            raise ConfigError(
                f"compute (gce): instance {b.where(zone)} not found — create it (g2-standard-4 "
                "with one L4 and the node image) or fix project/zone/instance in the profile"
            ) from e
        except gexc.Forbidden as e:
            raise ConfigError(
                f"compute (gce): permission denied on {b.where(zone)} ({e.message}) — grant "
                "the credentials roles/compute.instanceAdmin.v1 on the project") from e

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

        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                return op
            try:  # the server answers within ~2 min even if not DONE; our deadline may be sooner
                op = ops.wait(project=self.block.project, zone=zone, operation=op.name,
                              timeout=max(1.0, min(130.0, deadline - time.monotonic())))
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return op  # the caller sees the deadline passed and reports it
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
    def start(self) -> str:
        """Start the node (or reuse one already up) and wait until it is RUNNING with an IP.
        Returns a description: instance, zone, provisioning model, IP."""
        b = self.block
        started_at = time.time()
        for zone, inst in self._instances():  # idempotent: a node up in any zone is reused
            if inst.status in UP:
                node = self._await_running(zone, time.monotonic() + b.boot_timeout_seconds)
                self._write_record(node, started_at=self._read_record().get("started_at",
                                                                            started_at))
                return self._describe(node, reused=True)
        attempts: list[str] = []
        for zone, model in placements(b.zones(), b.provisioning, b.on_demand_fallback):
            outcome = self._try_start(zone, model)
            if isinstance(outcome, NodeRecord):
                self._write_record(outcome, started_at=started_at, attempts=attempts)
                return self._describe(outcome, attempts=attempts)
            attempts.append(f"{zone} {model.lower()}: {outcome}")
            log.warning("compute (gce): %s %s: %s", b.where(zone), model, outcome)
        hint = ("" if b.on_demand_fallback or b.provisioning == "on-demand" else
                " — set on_demand_fallback = true to allow on-demand,")
        raise NodeUnavailable(
            f"compute (gce): could not start {b.instance} in any zone ({'; '.join(attempts)})"
            f"{hint} add fallback_zones, or retry later")

    def _describe(self, node: NodeRecord, reused: bool = False,
                  attempts: list[str] | None = None) -> str:
        text = (f"GCE {self.block.project}/{node.zone}/{node.instance} "
                f"({provisioning_name(node.model)}, g2-standard-4) at {node.ip}")
        if reused:
            text += ", already running (reused)"
        if attempts:
            text += f"; fell back after: {'; '.join(attempts)}"
        return text

    def _try_start(self, zone: str, model: str) -> NodeRecord | str:
        """Start in one zone with one provisioning model: the node, or why not."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        b = self.block
        try:
            inst = self._get(zone)
        except ConfigError as e:
            if zone == b.zone:
                raise
            return f"skipped ({e})"
        deadline = time.monotonic() + b.boot_timeout_seconds
        if inst.status == "STOPPING":
            self._await_status(zone, STOPPED, deadline)
        elif inst.status not in STOPPED:
            return f"instance is {inst.status} (cannot start from that state)"
        client, _ = self._clients()
        if any(i.key == AGENT_KEY and i.value == "stopped" for i in inst.metadata.items):
            # the last run stopped vLLM through metadata: let it start at boot this time
            self._set_metadata(zone, {AGENT_KEY: "running"})
        current = inst.scheduling.provisioning_model or ("SPOT" if inst.scheduling.preemptible
                                                         else "STANDARD")
        if current != model:
            sched = compute_v1.Scheduling(provisioning_model=model, automatic_restart=False,
                                          on_host_maintenance="TERMINATE")
            if model == "SPOT":
                sched.instance_termination_action = "STOP"
            op = client.set_scheduling_unary(project=b.project, zone=zone,
                                             instance=b.instance_in(zone),
                                             scheduling_resource=sched)
            op = self._wait(zone, op, deadline)
            if self._op_errors(op):
                return f"setScheduling {model} failed: {self._op_errors(op)}"
        try:
            op = client.start_unary(project=b.project, zone=zone, instance=b.instance_in(zone))
        except gexc.GoogleAPICallError as e:
            # a refused call carries Compute's error items (code = reason, message) in details
            if is_stockout([(e.reason or "", e.message or "")] + _details(e)):
                return f"stocked out ({e.message})"
            raise
        op = self._wait(zone, op, deadline)
        errors = self._op_errors(op)
        if errors:
            if is_stockout(errors):
                return "stocked out (" + "; ".join(c for c, _ in errors) + ")"
            raise ServerError(f"compute (gce): start of {b.where(zone)} failed: {errors}")
        return self._await_running(zone, deadline)

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

    def _await_running(self, zone: str, deadline: float) -> NodeRecord:
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
        raise NodeBootTimeout(
            f"compute (gce): {b.where(zone)} not RUNNING after {b.boot_timeout_seconds:.0f} s "
            f"(status {inst.status}); a stop was requested — raise boot_timeout_seconds if the "
            "image is slow to boot")

    def _request_stop_in(self, zone: str) -> None:
        client, _ = self._clients()
        client.stop_unary(project=self.block.project, zone=zone,
                          instance=self.block.instance_in(zone))

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

    def check_running(self) -> None:
        """NodePreempted unless the node this run started is RUNNING."""
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
                op = client.set_metadata_unary(project=b.project, zone=zone,
                                               instance=b.instance_in(zone),
                                               metadata_resource=body)
            except gexc.PreconditionFailed:
                continue
            op = self._wait(zone, op, time.monotonic() + 120)
            if self._op_errors(op):
                raise ServerError(f"compute (gce): setMetadata on {b.where(zone)} failed: "
                                  f"{self._op_errors(op)}")
            return
        raise ServerError(f"compute (gce): metadata of {b.where(zone)} kept changing — retry")

    def install_startup_script(self, endpoint: InferenceEndpoint,
                               lora_modules: dict[str, str] | None = None,
                               api_key_secret: str | None = None) -> list[str]:
        """Write the rendered startup script (engine + watcher + Prefect worker) into every
        zone's instance metadata (`startup-script`, with enable-guest-attributes=TRUE so a
        failed boot can say why); it takes effect at the next boot. Returns the zones written."""
        script = render_startup_script(endpoint, lora_modules, port=self.block.inference_port,
                                       settings=self.block.node, api_key_secret=api_key_secret)
        done = []
        for zone in self.block.zones():
            # guest attributes are off by default on Compute Engine: the script reports a
            # failed boot through one (slm/startup-error), which start_inference reads
            self._set_metadata(zone, {"startup-script": script,
                                      "enable-guest-attributes": "TRUE"})
            done.append(zone)
        return done

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
                op = client.stop_unary(project=b.project, zone=zone, instance=b.instance_in(zone))
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

    def usage(self, since: float | None = None) -> dict[str, Any]:
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
        return total_usage(zones)


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
