"""The Compute Engine calls of one GceCompute block, and the one retry of them.

Transient errors of the calls that read or wait (api_errors.transient: 5xx, 429, 403
rateLimitExceeded, connection resets, timeouts) are retried with exponential backoff and full
jitter (tasks/shared/waiting.py backoff_seconds; block: api_retries, retry_base_seconds,
retry_max_seconds; Compute's guidance for 5xx/429: cloud.google.com/compute/docs/api/how-tos/
api-rate-limits). The start call itself is not retried here: a start refused for load moves on
to the next placement (lifecycle.py).

Client calls: the `*_unary` methods plus ZoneOperationsClient.wait (the `.result()` helpers
poll through a client that ignores a custom api_endpoint). Instances come back as the typed
view of instance.py; operations stay inside this module.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import requests
from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError

from blocks.gce import GceCompute
from tasks.compute.gce.api_errors import brief, member, transient
from tasks.compute.gce.boot_status import ENGINE_KEY, KEY, NAMESPACE, parse_error
from tasks.compute.gce.instance import Instance
from tasks.compute.gce.placement import ProvisioningModel
from tasks.compute.gce.startup import metadata_items
from tasks.shared.errors import ConfigError, ServerError
from tasks.shared.waiting import backoff_seconds

log = logging.getLogger("slm_nightly.gce")

T = TypeVar("T")
SA_USER_ROLE = "roles/iam.serviceAccountUser"
METADATA_WRITES = 5  # compare-and-swap attempts before giving up on a metadata write
METADATA_WAIT_SECONDS = 120.0
Errors = list[tuple[str, str]]  # (code, message) of a failed operation


class ComputeApi:
    """Instances and zone operations of the block's project, on its credentials."""

    def __init__(self, block: GceCompute) -> None:
        self.block = block
        self._clients_cache: tuple[Any, Any] | None = None

    def clients(self) -> tuple[Any, Any]:
        """(InstancesClient, ZoneOperationsClient), made once."""
        if self._clients_cache is None:
            try:
                self._clients_cache = self.block.get_compute_clients()
            except DefaultCredentialsError as e:
                raise ConfigError("compute (gce): no Google credentials — set the block's "
                                  "gcp_credentials, or run `gcloud auth application-default "
                                  "login` / use a service account on the orchestrator") from e
        return self._clients_cache

    def call(self, what: str, fn: Callable[[], T],
             final: tuple[type[BaseException], ...] = ()) -> T:
        """fn(), retried on transient errors (module docstring) except those of `final`,
        which the caller handles. The last error is raised when the retries are spent."""
        b = self.block
        for attempt in range(b.api_retries + 1):
            try:
                return fn()
            except final:
                raise
            except Exception as e:
                if not transient(e) or attempt == b.api_retries:
                    raise
                pause = backoff_seconds(attempt, b.retry_base_seconds, b.retry_max_seconds)
                log.warning("compute (gce): %s: %s — retry %d/%d in %.1f s", what,
                            brief(e), attempt + 1, b.api_retries, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    # ---- instances ------------------------------------------------------------------------
    def get(self, zone: str) -> Instance:
        b = self.block
        inst, _ = self.clients()
        try:
            return Instance.from_proto(self.call(
                f"get {b.where(zone)}", lambda: inst.get(project=b.project, zone=zone,
                                                         instance=b.instance_in(zone))), zone)
        except gexc.NotFound as e:
            raise ConfigError(
                f"compute (gce): instance {b.where(zone)} not found — create it (g2-standard-4 "
                "with one L4 and the node image) or fix project/zone/instance in the profile"
            ) from e
        except gexc.Forbidden as e:
            raise ConfigError(
                f"compute (gce): permission denied on {b.where(zone)} ({e.message}) — grant "
                "the credentials roles/compute.instanceAdmin.v1 on the instance (`slm-nightly "
                "gcp nodes` grants the orchestrator's account)") from e

    def instances(self, strict: bool = True) -> Iterator[Instance]:
        """Every configured zone's instance that exists. A missing instance in a fallback zone
        is skipped; in the primary zone it raises when `strict`."""
        for zone in self.block.zones():
            try:
                yield self.get(zone)
            except ConfigError:
                if strict and zone == self.block.zone:
                    raise

    def start(self, zone: str) -> Any:
        """instances.start, once (not retried: see the module docstring); the operation."""
        b = self.block
        client, _ = self.clients()
        return client.start_unary(project=b.project, zone=zone, instance=b.instance_in(zone))

    def stop(self, zone: str) -> Any:
        """instances.stop, retried; the operation (wait for it with `errors`, or not)."""
        b = self.block
        client, _ = self.clients()
        return self.call(f"stop {b.where(zone)}", lambda: client.stop_unary(
            project=b.project, zone=zone, instance=b.instance_in(zone)))

    def set_scheduling(self, zone: str, model: ProvisioningModel, run_limit: int,
                       deadline: float) -> Errors:
        """Set every scheduling field a start depends on (lifecycle.py: Compute keeps the
        fields a setScheduling body leaves out); the operation's errors."""
        from google.cloud import compute_v1

        b = self.block
        client, _ = self.clients()
        sched = compute_v1.Scheduling(
            provisioning_model=model, preemptible=model == "SPOT", automatic_restart=False,
            on_host_maintenance="TERMINATE", instance_termination_action="STOP",
            max_run_duration=compute_v1.Duration(seconds=run_limit))
        try:
            op = self.call(f"setScheduling {b.where(zone)}", lambda: client.set_scheduling_unary(
                project=b.project, zone=zone, instance=b.instance_in(zone),
                scheduling_resource=sched))
        except gexc.GoogleAPICallError as e:
            raise self.refused(zone, "setScheduling", e) from e
        return self.errors(zone, op, deadline)

    def set_metadata(self, zone: str, updates: dict[str, str]) -> None:
        """Compare-and-swap on the metadata fingerprint: another writer in between makes
        Compute refuse the write (412), and it is retried on a fresh read."""
        from google.cloud import compute_v1

        b = self.block
        client, _ = self.clients()
        for _ in range(METADATA_WRITES):
            inst = self.get(zone)
            items = metadata_items([{"key": k, "value": v} for k, v in inst.metadata.items()],
                                   updates)
            body = compute_v1.Metadata(fingerprint=inst.metadata_fingerprint,
                                       items=[compute_v1.Items(**i) for i in items])
            try:
                op = self.call(f"setMetadata {b.where(zone)}", partial(
                    client.set_metadata_unary, project=b.project, zone=zone,
                    instance=b.instance_in(zone), metadata_resource=body))
            except gexc.PreconditionFailed:
                continue
            except (gexc.Forbidden, gexc.BadRequest) as e:
                raise self._metadata_refused(zone, e) from e
            errors = self.errors(zone, op, time.monotonic() + METADATA_WAIT_SECONDS)
            if errors:
                raise ServerError(f"compute (gce): setMetadata on {b.where(zone)} failed: "
                                  f"{errors}")
            return
        raise ServerError(f"compute (gce): metadata of {b.where(zone)} kept changing — retry")

    # ---- operations ----------------------------------------------------------------------
    def errors(self, zone: str, op: Any, deadline: float) -> Errors:
        """Wait for a zone operation until it is DONE or `deadline` passes (the caller then
        sees its instance's status); the (code, message) errors it ended with."""
        op = self._wait(zone, op, deadline)
        if not op.error or not op.error.errors:
            return []
        return [(e.code, e.message) for e in op.error.errors]

    def _wait(self, zone: str, op: Any, deadline: float) -> Any:
        """ZoneOperationsClient.wait until DONE (it returns early, within ~2 min, DONE or not;
        our deadline may be sooner)."""
        from google.cloud import compute_v1

        b = self.block
        _, ops = self.clients()
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                return op
            def wait_once(name: str = op.name) -> Any:  # the timeout anew at each retry
                return ops.wait(project=b.project, zone=zone, operation=name,
                                timeout=max(1.0, min(130.0, deadline - time.monotonic())))

            try:
                op = self.call(f"wait for {op.name} in {zone}", wait_once,
                               final=(requests.exceptions.Timeout, gexc.DeadlineExceeded))
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return op  # the caller sees the deadline passed and reports it
        return op

    def preemption(self, inst: Instance) -> str | None:
        """When Compute recorded a preemption of this instance: 'spot preemption at T'."""
        from google.cloud import compute_v1

        _, ops = self.clients()
        try:
            page = ops.list(request=compute_v1.ListZoneOperationsRequest(
                project=self.block.project, zone=inst.zone,
                filter='operationType="compute.instances.preempted"'))
            for op in page:
                if str(op.target_id) == inst.id or op.target_link.endswith(
                        f"/instances/{inst.name}"):
                    return f"spot preemption at {op.end_time or op.insert_time}"
        except Exception as e:  # noqa: BLE001 - the status already tells the story
            log.debug("preemption lookup failed: %s", e)
        return None

    def boot_failures(self, zone: str, instance: str) -> dict[str, str]:
        """The failures this boot of the instance reported, by guest attribute key
        (boot_status.py: `startup-error`, `engine-error`); empty when none was written, guest
        attributes are unreadable, or each is a previous boot's."""
        from google.cloud import compute_v1

        client, _ = self.clients()
        project = self.block.project
        try:
            attrs = client.get_guest_attributes(
                request=compute_v1.GetGuestAttributesInstanceRequest(
                    project=project, zone=zone, instance=instance, query_path=f"{NAMESPACE}/"))
            inst = Instance.from_proto(client.get(project=project, zone=zone,
                                                  instance=instance), zone)
        except gexc.NotFound:
            return {}  # nothing written (or guest attributes off)
        except gexc.GoogleAPICallError as e:  # a read error must not end a healthy boot
            log.debug("guest attributes of %s unreadable: %s", instance, e)
            return {}
        found = {item.key: parse_error(item.value, inst.last_start)
                 for item in attrs.query_value.items
                 if item.namespace == NAMESPACE and item.key in (KEY, ENGINE_KEY)}
        return {key: message for key, message in found.items() if message}

    # ---- refusals ------------------------------------------------------------------------
    def refused(self, zone: str, verb: str, e: Any) -> ConfigError:
        """A refusal no other zone would answer differently, as a ConfigError with the fix."""
        b = self.block
        if isinstance(e, gexc.Forbidden):
            caller = self.caller()
            return ConfigError(
                f"compute (gce): {verb} on {b.where(zone)} refused: {brief(e)} — grant "
                f"{caller} roles/compute.instanceAdmin.v1 on the instance: gcloud compute "
                f"instances add-iam-policy-binding {b.instance_in(zone)} --zone={zone} "
                f"--project={b.project} --member={member(caller)} "
                "--role=roles/compute.instanceAdmin.v1")
        if isinstance(e, gexc.NotFound):
            return ConfigError(f"compute (gce): {verb} on {b.where(zone)}: not found — create "
                               "the instance or fix project/zone/instance in the profile")
        return ConfigError(f"compute (gce): {verb} on {b.where(zone)} refused: {brief(e)} — "
                           "check the instance's configuration (machine type, GPU, scheduling) "
                           "in the console")

    def _metadata_refused(self, zone: str, e: Any) -> ConfigError:
        """setMetadata on an instance that runs as a service account also needs
        iam.serviceAccounts.actAs on that account (instances.setMetadata's IAM permissions in
        the Compute API reference): name the role, both principals and the command."""
        b = self.block
        text = brief(e)
        if "actAs" not in text and "serviceAccountUser" not in text:
            return self.refused(zone, "setMetadata", e)
        try:
            node_sa = self.get(zone).service_account or "the node's service account"
        except Exception:  # noqa: BLE001 - the message names the role either way
            node_sa = "the node's service account"
        caller = self.caller()
        return ConfigError(
            f"compute (gce): setMetadata on {b.where(zone)} refused: {text} — the instance runs "
            f"as {node_sa}, so writing its metadata needs {SA_USER_ROLE} on that account for "
            f"{caller}: gcloud iam service-accounts add-iam-policy-binding {node_sa} "
            f"--project={b.project} --member={member(caller)} --role={SA_USER_ROLE}")

    def caller(self) -> str:
        """The principal the orchestrator's credentials act as (for messages)."""
        gc = self.block.gcp_credentials
        try:
            if gc is not None and gc.service_account_info is not None:
                return str(gc.service_account_info.get_secret_value()["client_email"])
            if gc is not None and gc.service_account_file is not None:
                return str(json.loads(Path(gc.service_account_file).read_text())["client_email"])
            client, _ = self.clients()
            creds = client._transport._credentials  # noqa: SLF001 - only for the message
            email = getattr(creds, "service_account_email", None)
            if email and email != "default":
                return str(email)
        except Exception:  # noqa: BLE001 - only a name for a message
            pass
        return "the orchestrator's credentials (`gcloud auth list`)"
