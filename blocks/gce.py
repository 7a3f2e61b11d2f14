"""The GPU node on Compute Engine: a g2-standard-4 (one NVIDIA L4) that already exists, is
stopped between runs, and runs vLLM on port 9080 from its startup script.

Zones and fallbacks. A spot start fails when the zone has no L4 capacity (Compute answers the
start operation with ZONE_RESOURCE_POOL_EXHAUSTED). The block then tries `fallback_zones` in
order, and after that — if `on_demand_fallback` — the same zones again on-demand. Each zone
has its own pre-built instance (same image, disk with the weights, startup script): by
default the instance has the same name in every zone (`instance`); `zone_instances` overrides
the name per zone. Instances are never created or deleted by the flow. On-demand is reached by
changing the stopped instance's provisioning model (instances.setScheduling); the next spot
run sets it back to SPOT before starting.

Stopping the inference server. The node's startup script (blocks/vllm_node.py) runs a watcher
that obeys the instance metadata key `slm-vllm` (`stopped` | `running`): stop_inference sets it
to `stopped` and then checks that port 9080 no longer answers.

Client calls: the `*_unary` methods plus ZoneOperationsClient.wait (the `.result()` helpers
poll through a client that ignores a custom api_endpoint).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect.blocks.core import Block
from prefect_gcp import GcpCredentials
from pydantic import Field, PrivateAttr, field_validator, model_validator

from blocks.inference import InferenceEndpoint
from blocks.vllm_node import AGENT_KEY, VllmServeSettings, metadata_items, render_startup_script
from tasks.compute import inference_server
from tasks.errors import ConfigError, ServerError, SlmNightlyError

log = logging.getLogger("slm_nightly.gce")

STOCKOUT_CODES = {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                  "STOCKOUT", "RESOURCE_POOL_EXHAUSTED"}
UP = {"PROVISIONING", "STAGING", "RUNNING"}
MODEL = {"spot": "SPOT", "on-demand": "STANDARD"}


class NodeUnavailable(SlmNightlyError):
    """No zone/provisioning combination could start the node (stockouts)."""


class NodePreempted(SlmNightlyError):
    """The node stopped while the run was using it (spot preemption, or stopped outside the
    run). Rerun the flow; it starts the node again (possibly in a fallback zone)."""


class NodeBootTimeout(ServerError):
    """The node did not reach RUNNING within boot_timeout_seconds (a stop was requested)."""


@dataclass
class _Node:
    zone: str
    instance: str
    ip: str
    model: str  # SPOT | STANDARD


class GceCompute(Block):
    """A Compute Engine VM as the node (see the module docstring for zones and fallbacks)."""

    _block_type_name = "SLM GCE Compute"
    _description = "Starts/stops a pre-built GPU VM (g2-standard-4 + L4) running vLLM on port 9080."

    project: str = Field(description="GCP project id.")
    zone: str = Field(description="Primary zone, e.g. us-central1-a.")
    instance: str = Field(description="Instance name (the same name in each fallback zone unless "
                                      "zone_instances says otherwise).")
    fallback_zones: list[str] = Field(default_factory=list,
                                      description="Zones tried in order when a zone is stocked out.")
    zone_instances: dict[str, str] = Field(default_factory=dict,
                                           description="Per-zone instance name overrides.")
    provisioning: Literal["spot", "on-demand"] = Field(default="spot")
    on_demand_fallback: bool = Field(default=False, description="After every zone is stocked out "
                                     "for spot, try the zones again on-demand (~2.5x the price).")
    gcp_credentials: GcpCredentials | None = Field(
        default=None, description="prefect-gcp GcpCredentials block; empty = Application Default "
        "Credentials (gcloud login, or the orchestrator's service account).")
    api_endpoint: str | None = Field(default=None, description="Compute API endpoint override "
                                     "(private endpoint, or a local fake in tests).")
    boot_timeout_seconds: float = Field(default=600.0, gt=0,
                                        description="Start call → instance RUNNING with an IP.")
    stop_timeout_seconds: float = Field(default=300.0, gt=0)
    inference_port: int = Field(default=9080, ge=1, le=65535)
    poll_seconds: float = Field(default=5.0, gt=0, description="Instance status polling interval.")
    progress_seconds: float = Field(default=60.0, gt=0, description="How often the wait for "
                                    "vLLM logs where the server is.")
    spot_usd_per_hour: float = Field(
        default=0.28, ge=0,
        description="g2-standard-4 spot, us-central1, late 2025 (~$0.28/h; spot prices move "
                    "monthly). Disk not included. Configure for your region.")
    on_demand_usd_per_hour: float = Field(
        default=0.71, ge=0,
        description="g2-standard-4 on-demand incl. the L4, us-central1 (~$0.7068/h). Configure "
                    "for your region.")
    vllm: VllmServeSettings = Field(default_factory=VllmServeSettings,
                                    description="How the node's startup script runs vLLM.")
    state_dir: str = Field(default=".slm-nightly", description="Where the node record is kept.")
    _client_cache: Any = PrivateAttr(default=None)

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with https:// (or http:// for a local fake)")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _zones(self) -> GceCompute:
        zones = self.zones()
        if len(set(zones)) != len(zones):
            raise ValueError(f"fallback_zones repeat a zone: {zones}")
        extra = sorted(set(self.zone_instances) - set(zones))
        if extra:
            raise ValueError(f"zone_instances names zones not in zone/fallback_zones: {extra}")
        return self

    # ---- clients --------------------------------------------------------------------------
    def zones(self) -> list[str]:
        return [self.zone, *self.fallback_zones]

    def instance_in(self, zone: str) -> str:
        return self.zone_instances.get(zone, self.instance)

    def _clients(self) -> tuple[Any, Any]:
        if self._client_cache is not None:
            return self._client_cache  # type: ignore[no-any-return]
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        if self.gcp_credentials is not None:
            creds = self.gcp_credentials.get_credentials_from_service_account()
        else:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                creds, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"])
            except DefaultCredentialsError as e:
                raise ConfigError("compute (gce): no Google credentials — set the block's "
                                  "gcp_credentials, or run `gcloud auth application-default "
                                  "login` / use a service account on the orchestrator") from e
        opts = ClientOptions(api_endpoint=self.api_endpoint) if self.api_endpoint else None
        pair = (compute_v1.InstancesClient(transport="rest", credentials=creds, client_options=opts),
                compute_v1.ZoneOperationsClient(transport="rest", credentials=creds,
                                                client_options=opts))
        self._client_cache = pair
        return pair

    def _where(self, zone: str) -> str:
        return f"projects/{self.project}/zones/{zone}/instances/{self.instance_in(zone)}"

    def _get(self, zone: str) -> Any:
        from google.api_core import exceptions as gexc

        inst, _ = self._clients()
        try:
            return inst.get(project=self.project, zone=zone, instance=self.instance_in(zone))
        except gexc.NotFound as e:
            raise ConfigError(
                f"compute (gce): instance {self._where(zone)} not found — create it (g2-standard-4 "
                "with one L4 and the node image) or fix project/zone/instance in the profile"
            ) from e
        except gexc.Forbidden as e:
            raise ConfigError(
                f"compute (gce): permission denied on {self._where(zone)} ({e.message}) — grant "
                "the credentials roles/compute.instanceAdmin.v1 on the project") from e

    def _instances(self, strict: bool = True) -> Iterator[tuple[str, Any]]:
        """(zone, instance) for every configured zone whose instance exists. A missing
        instance in a fallback zone is skipped; in the primary zone it raises when `strict`."""
        for zone in self.zones():
            try:
                yield zone, self._get(zone)
            except ConfigError:
                if strict and zone == self.zone:
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
                op = ops.wait(project=self.project, zone=zone, operation=op.name,
                              timeout=max(1.0, min(130.0, deadline - time.monotonic())))
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return op  # the caller sees the deadline passed and reports it
        return op

    @staticmethod
    def _op_errors(op: Any) -> list[tuple[str, str]]:
        if not op.error or not op.error.errors:
            return []
        return [(e.code, e.message) for e in op.error.errors]

    # ---- node record (so a later call — hook, reaper — knows what this run started) --------
    def _record_path(self) -> Path:
        return Path(self.state_dir) / f"gce-{self.instance}.json"

    def _write_record(self, node: _Node | None, **extra: Any) -> None:
        path = self._record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"node": node.__dict__ if node else None, **extra}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    def _read_record(self) -> dict[str, Any]:
        try:
            return json.loads(self._record_path().read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return {}

    def _node(self) -> _Node | None:
        n = self._read_record().get("node")
        return _Node(**n) if n else None

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Start the node (or reuse one already up) and wait until it is RUNNING with an IP.
        Returns a description: instance, zone, provisioning model, IP."""
        started_at = time.time()
        for zone, inst in self._instances():  # idempotent: a node up in any zone is reused
            if inst.status in UP:
                node = self._await_running(zone, time.monotonic() + self.boot_timeout_seconds)
                self._write_record(node, started_at=self._read_record().get("started_at",
                                                                            started_at))
                return self._describe(node, reused=True)
        attempts: list[str] = []
        models = [MODEL[self.provisioning]]
        if self.provisioning == "spot" and self.on_demand_fallback:
            models.append("STANDARD")
        for model in models:
            for zone in self.zones():
                outcome = self._try_start(zone, model)
                if isinstance(outcome, _Node):
                    self._write_record(outcome, started_at=started_at, attempts=attempts)
                    return self._describe(outcome, attempts=attempts)
                attempts.append(f"{zone} {model.lower()}: {outcome}")
                log.warning("compute (gce): %s %s: %s", self._where(zone), model, outcome)
        hint = ("" if self.on_demand_fallback or self.provisioning == "on-demand" else
                " — set on_demand_fallback = true to allow on-demand,")
        raise NodeUnavailable(
            f"compute (gce): could not start {self.instance} in any zone ({'; '.join(attempts)})"
            f"{hint} add fallback_zones, or retry later")

    def _describe(self, node: _Node, reused: bool = False, attempts: list[str] | None = None) -> str:
        model = "spot" if node.model == "SPOT" else "on-demand"
        text = (f"GCE {self.project}/{node.zone}/{node.instance} ({model}, "
                f"g2-standard-4) at {node.ip}")
        if reused:
            text += ", already running (reused)"
        if attempts:
            text += f"; fell back after: {'; '.join(attempts)}"
        return text

    def _try_start(self, zone: str, model: str) -> _Node | str:
        """Start in one zone with one provisioning model: the node, or why not."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        try:
            inst = self._get(zone)
        except ConfigError as e:
            if zone == self.zone:
                raise
            return f"skipped ({e})"
        deadline = time.monotonic() + self.boot_timeout_seconds
        if inst.status == "STOPPING":
            self._await_status(zone, {"TERMINATED", "STOPPED"}, deadline)
        elif inst.status not in {"TERMINATED", "STOPPED"}:
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
            op = client.set_scheduling_unary(project=self.project, zone=zone,
                                             instance=self.instance_in(zone),
                                             scheduling_resource=sched)
            op = self._wait(zone, op, deadline)
            if self._op_errors(op):
                return f"setScheduling {model} failed: {self._op_errors(op)}"
        try:
            op = client.start_unary(project=self.project, zone=zone, instance=self.instance_in(zone))
        except gexc.GoogleAPICallError as e:
            if any(c in str(e) for c in STOCKOUT_CODES) or "enough resources" in str(e):
                return f"stocked out ({e.message})"
            raise
        op = self._wait(zone, op, deadline)
        errors = self._op_errors(op)
        if errors:
            if any(code in STOCKOUT_CODES or "does not have enough resources" in msg
                   for code, msg in errors):
                return "stocked out (" + "; ".join(c for c, _ in errors) + ")"
            raise ServerError(f"compute (gce): start of {self._where(zone)} failed: {errors}")
        return self._await_running(zone, deadline)

    def _await_status(self, zone: str, wanted: set[str], deadline: float) -> Any:
        poll = min(self.poll_seconds, 0.5)
        while True:
            inst = self._get(zone)
            if inst.status in wanted:
                return inst
            if time.monotonic() > deadline:
                return inst
            time.sleep(poll)
            poll = min(poll * 1.5, self.poll_seconds)

    def _await_running(self, zone: str, deadline: float) -> _Node:
        inst = self._await_status(zone, {"RUNNING", "TERMINATED", "STOPPED"}, deadline)
        if inst.status == "RUNNING" and inst.network_interfaces and \
                inst.network_interfaces[0].network_i_p:
            return _Node(zone, self.instance_in(zone), inst.network_interfaces[0].network_i_p,
                         inst.scheduling.provisioning_model or "STANDARD")
        if inst.status in {"TERMINATED", "STOPPED"}:
            raise NodePreempted(f"compute (gce): {self._where(zone)} went {inst.status} while "
                                "booting (spot preemption?) — rerun the flow")
        self.request_stop(zone)  # do not pay for a node this run gives up on
        raise NodeBootTimeout(
            f"compute (gce): {self._where(zone)} not RUNNING after {self.boot_timeout_seconds:.0f} s "
            f"(status {inst.status}); a stop was requested — raise boot_timeout_seconds if the "
            "image is slow to boot")

    def request_stop(self, zone: str) -> None:
        """Ask Compute to stop the instance in `zone` without waiting (for cancellation paths,
        which have ~30 s before SIGKILL)."""
        client, _ = self._clients()
        client.stop_unary(project=self.project, zone=zone, instance=self.instance_in(zone))

    def request_stop_node(self) -> list[str]:
        """Ask Compute to stop the node without waiting (seconds, not minutes): the first thing
        a cancelled run's `finally` does within Prefect's 30 s grace. The zone of this run's
        node from the node record; without a record, every configured zone whose instance is
        up. Returns the zones asked; `stop()` then waits for TERMINATED."""
        node = self._node()
        zones = [node.zone] if node else [z for z, s in self.running_nodes().items()
                                          if s != "STOPPING"]
        for zone in zones:
            self.request_stop(zone)
        return zones

    def check_running(self) -> _Node:
        """The node this run started, verified RUNNING; NodePreempted if it is not."""
        node = self._node()
        if node is None:
            raise ServerError("compute (gce): no node was started by this run — call start() first")
        inst = self._get(node.zone)
        if inst.status != "RUNNING":
            why = self._preemption(node.zone, inst)
            raise NodePreempted(f"compute (gce): {self._where(node.zone)} is {inst.status} while "
                                f"the run uses it ({why}) — rerun the flow")
        return node

    def _preemption(self, zone: str, inst: Any) -> str:
        """'preempted at T' when Compute recorded a preemption of this instance, else a guess."""
        _, ops = self._clients()
        try:
            from google.cloud import compute_v1

            page = ops.list(request=compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone,
                filter='operationType="compute.instances.preempted"'))
            for op in page:
                if str(op.target_id) == str(inst.id) or op.target_link.endswith(
                        f"/instances/{inst.name}"):
                    return f"spot preemption at {op.end_time or op.insert_time}"
        except Exception as e:  # noqa: BLE001 - the status already tells the story
            log.debug("preemption lookup failed: %s", e)
        return "stopped outside this run, or preempted"

    def start_inference(self, endpoint: InferenceEndpoint) -> str:
        """Wait for vLLM (started by the node's startup script) at http://IP:port to list a
        model, checking the node is still RUNNING while waiting; return the base URL."""
        node = self.check_running()
        base_url = endpoint.base_url or f"http://{node.ip}:{self.inference_port}"
        key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
        if self._metadata(node.zone).get(AGENT_KEY) == "stopped":
            self._set_metadata(node.zone, {AGENT_KEY: "running"})
        started = time.monotonic()
        deadline = started + endpoint.readiness_timeout_seconds
        poll = 1.0
        next_check = started + self.poll_seconds
        next_report = started + self.progress_seconds
        while True:
            stage, models = inference_server.probe(base_url, key)
            if stage == "ready":
                break
            now = time.monotonic()
            if now > deadline:
                raise ServerError(
                    f"inference endpoint {base_url} not ready after "
                    f"{endpoint.readiness_timeout_seconds:.0f} s (last: {stage}) — check the "
                    f"node's serial console / `journalctl -u slm-vllm` on {node.instance}, or "
                    "raise the inference block's readiness_timeout_seconds")
            if now >= next_report:
                _progress(f"waiting for vLLM at {base_url}: {stage} — {now - started:.0f} s "
                          f"of {endpoint.readiness_timeout_seconds:.0f} s")
                next_report = now + self.progress_seconds
            if now >= next_check:
                self.check_running()
                next_check = now + self.poll_seconds
            time.sleep(poll)
            poll = min(poll * 1.5, 10.0)
        if endpoint.model not in models:
            raise ConfigError(f"vLLM at {base_url} serves {models}, not {endpoint.model!r} — set "
                              "the inference block's model to the node's --served-model-name "
                              f"(blocks/vllm_node.py uses the block's model: re-run "
                              "install_startup_script after changing it)")
        _progress(f"vLLM ready at {base_url} after {time.monotonic() - started:.0f} s "
                  f"(serving {', '.join(models)})")
        return base_url

    def _metadata(self, zone: str) -> dict[str, str]:
        return {i.key: i.value for i in self._get(zone).metadata.items}

    def _set_metadata(self, zone: str, updates: dict[str, str]) -> None:
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        client, _ = self._clients()
        for _ in range(5):  # fingerprint races with other writers: re-read and retry
            md = self._get(zone).metadata
            items = metadata_items([{"key": i.key, "value": i.value} for i in md.items], updates)
            body = compute_v1.Metadata(fingerprint=md.fingerprint,
                                       items=[compute_v1.Items(**i) for i in items])
            try:
                op = client.set_metadata_unary(project=self.project, zone=zone,
                                               instance=self.instance_in(zone),
                                               metadata_resource=body)
            except gexc.PreconditionFailed:
                continue
            op = self._wait(zone, op, time.monotonic() + 120)
            if self._op_errors(op):
                raise ServerError(f"compute (gce): setMetadata on {self._where(zone)} failed: "
                                  f"{self._op_errors(op)}")
            return
        raise ServerError(f"compute (gce): metadata of {self._where(zone)} kept changing — retry")

    def install_startup_script(self, endpoint: InferenceEndpoint,
                               lora_modules: dict[str, str] | None = None,
                               api_key_secret: str | None = None) -> list[str]:
        """Write the rendered startup script (vLLM + watcher + Prefect worker) into every
        zone's instance metadata (`startup-script`); it takes effect at the next boot.
        Returns the zones written."""
        script = render_startup_script(endpoint, lora_modules, port=self.inference_port,
                                       settings=self.vllm, api_key_secret=api_key_secret)
        done = []
        for zone in self.zones():
            self._set_metadata(zone, {"startup-script": script})
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
        url = f"http://{node.ip}:{self.inference_port}"
        was_up = inference_server.models_ready(url)
        self._set_metadata(node.zone, {AGENT_KEY: "stopped"})
        deadline = time.monotonic() + 120
        while self.inference_running():
            if time.monotonic() > deadline:
                raise ServerError(f"vLLM on {node.instance} still answers at {url} 120 s after "
                                  "slm-vllm=stopped — check the slm-vllm-watch unit on the node")
            time.sleep(0.5)
        return was_up

    def inference_running(self) -> bool:
        node = self._node()
        if node is None:
            return False
        from tasks.processes import port_open

        return port_open(self.inference_port, node.ip)

    def stop(self) -> list[str]:
        """Stop the node in every configured zone where it is up, and wait until TERMINATED.
        Idempotent: already stopped → nothing to do. Returns the zones stopped."""
        stopped: list[str] = []
        deadline = time.monotonic() + self.stop_timeout_seconds
        for zone, inst in self._instances():
            if inst.status in {"TERMINATED", "STOPPED"}:
                continue
            if inst.status != "STOPPING":
                client, _ = self._clients()
                op = client.stop_unary(project=self.project, zone=zone,
                                       instance=self.instance_in(zone))
                self._wait(zone, op, deadline)
            inst = self._await_status(zone, {"TERMINATED", "STOPPED"}, deadline)
            if inst.status not in {"TERMINATED", "STOPPED"}:
                raise ServerError(f"compute (gce): {self._where(zone)} still {inst.status} after "
                                  f"{self.stop_timeout_seconds:.0f} s — check the console; it "
                                  "keeps costing money while up")
            stopped.append(zone)
        rec = self._read_record()
        if rec:
            self._write_record(None, started_at=rec.get("started_at"),
                               last_node=rec.get("node") or rec.get("last_node"))
        return stopped

    def running_nodes(self) -> dict[str, str]:
        """zone → status for every configured zone whose instance is not stopped."""
        out = {}
        for zone, inst in self._instances(strict=False):
            if inst.status not in {"TERMINATED", "STOPPED"}:
                out[zone] = inst.status
        return out

    def usage(self, since: float | None = None) -> dict[str, Any]:
        """RUNNING seconds and estimated cost of the node since `since` (epoch seconds; default:
        this run's first start). From each instance's lastStart/lastStopTimestamp: the most
        recent RUNNING span per zone, so a start → preemption → restart counts the last span."""
        since = since if since is not None else self._read_record().get("started_at") or 0.0
        now = time.time()
        zones: dict[str, dict[str, Any]] = {}
        total_s = total_usd = 0.0
        for zone, inst in self._instances(strict=False):
            start = _ts(inst.last_start_timestamp)
            if start is None or start < since - 1.0:
                continue
            stop = _ts(inst.last_stop_timestamp)
            end = now if inst.status in UP or stop is None or stop < start else stop
            seconds = max(0.0, end - start)
            spot = (inst.scheduling.provisioning_model or "") == "SPOT"
            rate = self.spot_usd_per_hour if spot else self.on_demand_usd_per_hour
            usd = seconds / 3600.0 * rate
            zones[zone] = {"running_seconds": round(seconds, 3), "provisioning":
                           "spot" if spot else "on-demand", "usd_per_hour": rate,
                           "estimated_usd": round(usd, 6), "status": inst.status}
            total_s += seconds
            total_usd += usd
        return {"running_seconds": round(total_s, 3), "gpu_hours": round(total_s / 3600.0, 6),
                "estimated_usd": round(total_usd, 6),
                "zones": zones, "note": "estimate from lastStart/lastStopTimestamp × the "
                "block's hourly rates; disk and egress not included"}


def _progress(message: str) -> None:
    """Log to the Prefect run when there is one (the UI shows it), else to this module's log."""
    try:
        from prefect import get_run_logger

        get_run_logger().info(message)
    except Exception:  # noqa: BLE001 - MissingContextError outside a run
        log.info(message)


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()
