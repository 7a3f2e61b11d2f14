"""The reaper as a flow: stops the nodes a nightly run left up, when no live nightly run owns
them (the policy: tasks/night/reaper.py). Schedule the `reaper` deployment e.g. hourly
(prefect.yaml)."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_run

from tasks.night.reaper import reap
from tasks.profile import load_profile
from tasks.records import ReaperResult


@flow(name="node-reaper")
def node_reaper(profile: str, max_run_hours: float = 12.0,
                startup_grace_seconds: float = 300.0) -> ReaperResult:
    """Stop the profile's node if it is up and no nightly run is using it; return what was done."""
    return reap(load_profile(profile), exclude=current_run.get_id(), max_run_hours=max_run_hours,
                startup_grace_seconds=startup_grace_seconds, logger=get_run_logger())


# The flow's old name, kept for its callers: the function carries the flow's name because
# `prefect deploy --name node-reaper/production` matches the entrypoint's function name with
# '-' read as '_' (flows/train.py says the same of `train`).
reaper = node_reaper
