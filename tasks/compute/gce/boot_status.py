"""What the node reported: a failure its startup script wrote to the guest attribute
`slm/startup-error` (startup.sh) before exiting, or one the engine's unit wrote to
`slm/engine-error` (its ExecStopPost, when the engine died after the script), read through
instances.getGuestAttributes (queryPath "slm/", api.py ComputeApi.boot_failures), so the
orchestrator's readiness wait ends within seconds with the cause instead of waiting out
readiness_timeout_seconds.

The value is "<epoch seconds> <message>". Guest attributes outlive a stop and start of the
instance, so an error written before the instance's last start (a previous boot's) is not
this boot's and is ignored.

Guest attributes are off unless the instance's metadata has enable-guest-attributes=TRUE
(install_startup_script sets it); with none written, Compute answers 404.
"""

from __future__ import annotations

from tasks.compute.gce.startup import ENGINE_ERROR_ATTRIBUTE, ERROR_ATTRIBUTE

NAMESPACE, KEY = ERROR_ATTRIBUTE.split("/")
ENGINE_KEY = ENGINE_ERROR_ATTRIBUTE.split("/")[1]
CLOCK_SLACK_SECONDS = 5.0  # the guest's clock against Compute's lastStartTimestamp


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
