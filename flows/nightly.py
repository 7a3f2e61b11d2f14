"""The nightly pipeline, as the runbook reads:

boot the node → start the inference server and wait for it → phase 1 (extract) → stop the
inference server, release the accelerator → phase 2: score the corpus, train each passing
bucket (export, verify, register, promote) → stop the node, always. The next night's server
loads the promoted adapter. The stages are tasks/night/stages.py's; the phases that are flows
of their own (extract, scorecard, train) run here as subflows, and the stages take their final
states (`return_state=True`). The subflows read the profile this flow loaded (profile_in_use).
"""

from __future__ import annotations

from prefect import flow

from flows.extract import extract
from flows.scorecard import scorecard
from flows.train import train
from tasks.night.clock import phase1_timeout
from tasks.night.fleet import stop_nodes_hook
from tasks.night.stages import NightlyRun, check_buckets, check_phases
from tasks.profile import load_profile, profile_in_use
from tasks.records import RunSummary
from tasks.shared.slots import gpu_slot, owning_the_node


@flow(name="nightly", on_cancellation=[stop_nodes_hook], on_crashed=[stop_nodes_hook])
def nightly(profile: str = "local", full: bool = False, retry_failed: bool = False,
            phase1_timeout_seconds: int = 7200, phase2_timeout_seconds: int = 7200,
            max_failed_share: float | None = None,
            night_budget_seconds: int | None = None, phases: str = "all",
            buckets: list[str] | None = None, retrain: bool = False) -> RunSummary:
    """Run the nightly pipeline on the profile's blocks and return the run summary.

    `night_budget_seconds`: one deadline for the boot, the engine's readiness, phase 1 and
    phase 2 (default: the sum of their timeouts); each gets the smaller of its own timeout and
    what is left (NightClock). `phases`: "all"; "extract" (phase 1 only: no scorecard, no
    training); "train" (phase 2 only: the primary node boots, its engine is stopped at once,
    nothing is extracted). `buckets`: train only these of the buckets that pass (the others'
    markers stay for the next night); `retrain`: train them even when an adapter of the same
    data and parameters exists."""
    check_phases(phases, buckets)
    cfg = load_profile(profile)
    check_buckets(cfg, buckets)
    night = NightlyRun(cfg, phases, phase1_timeout_seconds, phase2_timeout_seconds,
                       night_budget_seconds)
    with owning_the_node(), profile_in_use(profile, cfg):
        night.recover()
        try:
            night.preflight()
            nodes = night.boot()
            with gpu_slot():  # no ad-hoc training shares the card with the inference server
                if night.wants("extract") and night.serve(nodes):
                    with night.phase("extract"):
                        budget = night.phase1_budget()
                        run = extract.with_options(timeout_seconds=phase1_timeout(budget))(
                            profile=profile, base_url=night.urls[0], full=full,
                            retry_failed=retry_failed, max_failed_share=max_failed_share,
                            base_urls=night.urls, budget_seconds=budget, return_state=True)
                    night.extracted(run)
                night.release()
            night.down_extra_nodes()
            if night.wants("scorecard"):
                with night.phase("scorecard"):
                    night.scored(scorecard(profile=profile))
            if night.wants("train"):
                queue = night.training_queue(profile)
                for job in queue.each(buckets):
                    with night.phase(f"train:{job.bucket}"):
                        trained = queue.on_node(job, retrain) if job.remote else \
                            train.with_options(timeout_seconds=job.seconds())(
                                params=job.params, profile=profile, created_by="nightly",
                                retrain=retrain, return_state=True)
                    queue.took(job, trained)
            night.finish()
        except BaseException as e:
            night.ended_with(e)
            raise
        finally:
            night.end()  # every node stopped and the summary written, whatever happened
    return night.summary
