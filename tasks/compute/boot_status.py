"""What the node's startup script reported: a failure it wrote to the guest attribute
`slm/startup-error` (tasks/compute/startup_script.py) before exiting, read through
instances.getGuestAttributes (queryPath "slm/"), so the orchestrator's readiness wait ends at
once with the cause instead of waiting out readiness_timeout_seconds.

The value is "<epoch seconds> <message>". Guest attributes outlive a stop and start of the
instance, so an error written before the instance's last start (a previous boot's) is not
this boot's and is ignored.

Guest attributes are off unless the instance's metadata has enable-guest-attributes=TRUE
(install_startup_script sets it); with none written, Compute answers 404.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from tasks.compute.startup_script import ERROR_ATTRIBUTE

log = logging.getLogger("slm_nightly.gce")

NAMESPACE, KEY = ERROR_ATTRIBUTE.split("/")
CLOCK_SLACK_SECONDS = 5.0  # the guest's clock against Compute's lastStartTimestamp


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def parse_error(value: str, last_start: float | None) -> str | None:
    """The message of a startup-error value, or None when it is empty or older than
    `last_start` (epoch seconds of the instance's last start)."""
    head, _, message = value.strip().partition(" ")
    try:
        written = float(head)
    except ValueError:  # not our format: report it whole rather than drop it
        return value.strip() or None
    if last_start is not None and written < last_start - CLOCK_SLACK_SECONDS:
        return None
    return message.strip() or None


def startup_failure(instances_client: Any, project: str, zone: str, instance: str) -> str | None:
    """The startup script's failure on this boot of the instance, or None (none written, guest
    attributes unreadable, or a previous boot's)."""
    from google.api_core import exceptions as gexc

    try:
        from google.cloud import compute_v1

        attrs = instances_client.get_guest_attributes(
            request=compute_v1.GetGuestAttributesInstanceRequest(
                project=project, zone=zone, instance=instance, query_path=f"{NAMESPACE}/"))
        inst = instances_client.get(project=project, zone=zone, instance=instance)
    except gexc.NotFound:
        return None  # nothing written (or guest attributes off)
    except gexc.GoogleAPICallError as e:  # a read error must not end a healthy boot
        log.debug("guest attributes of %s unreadable: %s", instance, e)
        return None
    last_start = _epoch(inst.last_start_timestamp) if inst.last_start_timestamp else None
    for item in attrs.query_value.items:
        if item.namespace == NAMESPACE and item.key == KEY:
            return parse_error(item.value, last_start)
    return None
