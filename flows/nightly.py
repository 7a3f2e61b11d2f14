"""The nightly pipeline, as the runbook reads:

boot the node → start the inference server and wait for it → phase 1 (extract) → stop the
inference server, release the accelerator → phase 2: score the corpus, train each passing
bucket (export, verify, register, promote) → stop the node, always. The next night's server
loads the promoted adapter. The stages are tasks/night/stages.py's; the phases that are flows
of their own (extract, scorecard, train) run here as subflows.
"""

from __future__ import annotations

from prefect import flow

from flows.extract import extract
from flows.scorecard import scorecard
from flows.train import train
from tasks.night.clock import phase1_timeout
from tasks.night.fleet import stop_nodes_hook
from tasks.night.handoff import TrainHere
from tasks.night.stages import Night, RunExtract, check_buckets, check_phases
from tasks.profile import load_profile
from tasks.records import AdapterManifest, ExtractionReport, RunSummary, TrainingResult
from tasks.slots import gpu_slot
from tasks.training.params import TrainParams


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
    night = Night(cfg, phases, phase1_timeout_seconds, phase2_timeout_seconds,
                  night_budget_seconds)
    with night.running():  # owns the node; stops it and writes the summary, whatever happens
        night.preflight()
        serving = night.boot()
        with gpu_slot():  # no ad-hoc training shares the card with the inference server
            serving, phase1_error = night.serve_and_extract(serving, _extract(
                profile, full, retry_failed, max_failed_share))
            night.release(serving)
        night.down_extra_nodes()
        night.score(lambda: scorecard(profile=profile))
        night.train(profile, _train_here(profile, retrain), buckets, retrain)
        night.finish(phase1_error)
    return night.summary


def _extract(profile: str, full: bool, retry_failed: bool,
             max_failed_share: float | None) -> RunExtract:
    """Phase 1, the extract flow, on the serving nodes within its budget."""
    def run(budget: float, urls: list[str]) -> ExtractionReport:
        return ExtractionReport.model_validate(
            extract.with_options(timeout_seconds=phase1_timeout(budget))(
                profile=profile, base_url=urls[0], full=full, retry_failed=retry_failed,
                max_failed_share=max_failed_share, base_urls=urls, budget_seconds=budget))
    return run


def _train_here(profile: str, retrain: bool) -> TrainHere:
    """Phase 2b in this process, the train flow (a node that trains remotely runs it itself)."""
    def run(params: TrainParams, timeout_seconds: float) -> TrainingResult:
        return TrainingResult.of_manifest(AdapterManifest.parse(
            train.with_options(timeout_seconds=timeout_seconds)(
                params=params, profile=profile, created_by="nightly", retrain=retrain),
            "the train flow's result"))
    return run
