"""The night's stages, in the order the runbook reads: recover what a dead run left, preflight,
boot, serve, take phase 1's outcome, release, turn to training, finish, and end (every node
stopped, the summary written), whatever happened. flows/nightly.py calls them in that order and
runs the flows that are phases of their own (extract, scorecard, train) itself, each with
`return_state=True`; the stages take the states it gets back."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run as current_run
from prefect.states import State

from tasks.compute.node import compute_up, inference_down, inference_up
from tasks.compute.protocol import Node
from tasks.compute.stale_runs import cancel_stale_node_runs
from tasks.extraction.capacity import Phase1Measured, capacity_report
from tasks.night.clock import NightClock, night_budget, night_seconds
from tasks.night.fleet import Fleet, drop_failed, each, node_lost, raise_first
from tasks.night.phases import final_status, phase, phase_failed
from tasks.night.reaper import reap
from tasks.night.summary import new_summary, render_markdown
from tasks.night.training import TrainingQueue, publish_phase
from tasks.preflight.run import run_preflight
from tasks.records import (
    ExtractionReport,
    ReaperResult,
    ReconciledManifest,
    RunSummary,
    ScorecardSummary,
    StaleNodeRun,
    SyncReport,
)
from tasks.shared.errors import ConfigError, NodePreempted, PhaseFailed
from tasks.shared.gcs_sync import mirror_records
from tasks.training.reconcile import reconcile_store
from tasks.training.serving import LocalServing, local_serving, served_gguf

if TYPE_CHECKING:
    from tasks.profile import Profile

PHASES = ("all", "extract", "train")  # the nightly's `phases`: the whole night, or one half

def check_phases(phases: str, buckets: list[str] | None) -> None:
    if phases not in PHASES:
        raise ConfigError(f"nightly: phases {phases!r} — one of {', '.join(PHASES)}")
    if buckets is not None and phases == "extract":
        raise ConfigError("nightly: buckets name what to train; phases = \"extract\" trains "
                          "nothing — drop buckets, or run phases = \"train\"")


def check_buckets(cfg: Profile, buckets: list[str] | None) -> None:
    known = set(cfg.corpus.buckets()) if buckets is not None else set()
    unknown = sorted(set(buckets or []) - known)
    if unknown:
        raise ConfigError(f"nightly: buckets {unknown} are not the profile's corpus buckets "
                          f"({', '.join(sorted(known))}) — fix the buckets parameter")


class NightlyRun:
    """One run of the nightly on a profile: its summary, its clock, its nodes."""

    def __init__(self, cfg: Profile, phases: str, phase1_timeout_seconds: float,
                 phase2_timeout_seconds: float, night_budget_seconds: float | None) -> None:
        self.cfg, self.phases = cfg, phases
        self.phase1_seconds, self.phase2_seconds = phase1_timeout_seconds, phase2_timeout_seconds
        self.logger = get_run_logger()
        self.summary = new_summary(cfg.name)
        self.summary.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        night = float(night_budget_seconds or night_seconds(cfg, phase1_timeout_seconds,
                                                            phase2_timeout_seconds))
        self.clock = NightClock(night)
        self.summary.night_budget_seconds = night
        # the primary (phase 2's) first; once booting, every one is stopped. Phase 2 alone needs
        # only the primary (its worker takes the node runs).
        self.fleet = Fleet(cfg.nodes if phases != "train" else cfg.nodes[:1])
        self.serving: list[Node] = []  # the nodes whose engines are up (release stops them)
        self.urls: list[str] = []  # their base URLs, phase 1's endpoints
        self.phase1_failed: str | None = None  # why, when it did (phase 2 runs first)
        self.training: TrainingQueue | None = None

    def recover(self) -> None:
        """While holding the `nightly` slot, before anything boots: a node up now was left by a
        dead run; so were manifests left `running` and node runs left open."""
        self.summary.reaper = _reap_at_start(self.cfg, self.logger)
        self.summary.reconciled = _reconcile_at_start(self.cfg, self.logger)
        if self.cfg.node.remote_training:  # a local node has no node runs
            self.summary.stale_node_runs = _cancel_stale_node_runs(self.cfg, self.logger)

    def ended_with(self, e: BaseException) -> None:
        """The night stopped on `e`: its status (preempted, cancelled or failed)."""
        self.summary.status = final_status(e)

    def end(self) -> None:
        """Whatever happened: every node stopped, then the summary written, copied to the
        bucket and published."""
        s = self.summary
        try:
            self.fleet.down(s, self.logger)
        except Exception:
            s.status = "failed"
            raise
        finally:
            s.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
            path = _write_summary(s, self.cfg.state_dir)
            _mirror_records(self.cfg, self.logger)
            create_markdown_artifact(render_markdown(s), key="nightly-summary",
                                     description="Nightly run summary")
            self.logger.info("run summary written to %s", path)

    def preflight(self) -> None:
        """A node that trains remotely (GCE): nothing boots before its preflight passes."""
        if self.cfg.node.remote_training:
            with phase(self.summary, "preflight"):
                _preflight(self.cfg, self.logger)

    def boot(self) -> list[Node]:
        """Every node up, within the night's budget; the nodes that booted."""
        nodes, s = self.fleet.nodes, self.summary
        with phase(s, "compute_up"):
            booted = each(compute_up, nodes, max_run_seconds=night_budget(
                self.cfg, self.phase1_seconds, self.phase2_seconds, self.clock.budget),
                endpoint=self.cfg.inference,
                timeout_seconds=self.clock.give_or_none(self.cfg.node.boot_timeout_seconds))
            up, where = drop_failed(nodes, booted, "boot", self.logger)
            self.serving = up  # their engines start with the node: release stops them
            s.node = where[0] if len(nodes) == 1 else " | ".join(
                f"node {i}: {w}" for i, w in enumerate(where, 1)) + (
                f" ({len(nodes) - len(where)} of {len(nodes)} did not boot)"
                if len(where) < len(nodes) else "")
        return up

    def wants(self, name: str) -> bool:
        """Whether tonight runs phase `name` ("extract", "scorecard", "train"); when it does
        not, the summary says why (its phase `skipped`)."""
        skip = {"extract": "train", "scorecard": "extract", "train": "extract"}[name]
        if self.phases == skip:
            self.summary.set_phase(name, "skipped", note=f"phases = {skip}")
            return False
        if name == "scorecard" and not self.cfg.corpus.root:
            self.summary.set_phase(name, "skipped", note="no [corpus] root in the profile")
            return False
        return True

    def phase(self, name: str) -> AbstractContextManager[None]:
        """The block as the summary's phase `name` (tasks/night/phases.py)."""
        return phase(self.summary, name)

    def serve(self, nodes: list[Node]) -> bool:
        """The inference servers up on `nodes` with tonight's adapter; False when none came up
        (the failure is recorded: phase 2 runs, then `finish` fails the night naming it)."""
        self.serving = nodes
        try:
            self.serving, self.urls = self._serve(nodes)
        except NodePreempted:
            raise
        except Exception as e:
            self._phase1_failed(e)
            return False
        return True

    def phase1_budget(self) -> float:
        """Phase 1's seconds: its timeout, or what is left of the night before phase 2's."""
        return self.clock.phase1(self.phase1_seconds, self.phase2_seconds)

    def extracted(self, state: State[ExtractionReport]) -> None:
        """Phase 1's outcome (the extract flow's final state) in the summary. The corpus does
        not depend on tonight's graph, so a failed phase 1 is recorded, not raised: the caller
        releases the GPU and runs phase 2, and `finish` fails the night naming it
        (`summary.error` holds it already). A node that is gone (NodePreempted) is raised:
        there is nothing left to train on."""
        s = self.summary
        got = state.result(raise_on_failure=False)
        s.merge_extraction(got if isinstance(got, ExtractionReport) else
                           got.report if isinstance(got, PhaseFailed) else None)
        lost = node_lost(self.cfg.node)  # documents failed with it: done next run
        if lost is not None:
            phase_failed(s, "extract", lost)
            raise lost from (got if isinstance(got, Exception) else None)
        if not isinstance(got, ExtractionReport):
            phase_failed(s, "extract", got)
            self._phase1_failed(got)
            return
        _mark_partial(s, got)
        if got.extract_seconds or got.pending:  # something to measure
            s.capacity = _capacity(got, len(self.serving))

    def _phase1_failed(self, e: Exception) -> None:
        self.phase1_failed = self.summary.error or f"{type(e).__name__}: {e}"
        self.logger.error("phase 1 failed (%s); the inference server is stopped and phase 2 "
                          "runs", self.phase1_failed)

    def _serve(self, nodes: list[Node]) -> tuple[list[Node], list[str]]:
        s, cfg = self.summary, self.cfg
        with phase(s, "inference_up"):
            serving = served_adapter(cfg)
            s.serving_adapter = str(serving.adapter) if serving.adapter else None
            if serving.note:
                s.serving_note = serving.note
                self.logger.warning("%s", serving.note)
            elif serving.adapter and serving.names:
                s.serving_note = f"served as {cfg.inference.model} and {', '.join(serving.names)}"
            endpoint = cfg.inference.model_copy(update={
                "readiness_timeout_seconds":
                    self.clock.give(cfg.inference.readiness_timeout_seconds)})
            ready = each(inference_up, nodes, endpoint=endpoint, adapter=serving.adapter,
                         names=serving.names)
            return drop_failed(nodes, ready, "inference", self.logger)

    def scored(self, card: ScorecardSummary) -> None:
        """Phase 2a's card (the scorecard flow's result) in the summary: the buckets that pass
        are tonight's training turns."""
        self.summary.scorecard = card

    def release(self) -> None:
        """The inference servers down (those the boot left up when phase 1 did not run): the
        accelerator is phase 2's."""
        with phase(self.summary, "inference_down"):
            raise_first(each(inference_down, self.serving))

    def down_extra_nodes(self) -> None:
        """Only the primary's worker may take phase 2's node runs: the others go down now."""
        if len(self.fleet.nodes) > 1:
            with phase(self.summary, "extra_nodes_down"):
                self.fleet.down_extra()

    def training_queue(self, profile: str) -> TrainingQueue:
        """Phase 2b's training runs (tasks/night/training.py), within what is left of phase 2's
        time."""
        self.training = TrainingQueue(self.summary, self.cfg, profile,
                                      self.clock.give(self.phase2_seconds))
        return self.training

    def finish(self) -> None:
        """What was promoted served by name (though a bucket failed); then a failed training
        run fails the night, and a failed phase 1 does once phase 2 has had its turn."""
        publish_phase(self.summary, self.cfg)
        if self.training is not None:
            self.training.end()
        if self.phase1_failed is not None:
            raise PhaseFailed(f"phase 1 failed ({self.phase1_failed}); phase 2 had its turn")
        self.summary.status = "partial" if self.summary.phases["extract"].status == "partial" \
            else "completed"


def _reap_at_start(cfg: Profile, logger: Any) -> ReaperResult:
    """Run the reaper's logic while holding the slot: a node up now was left by a dead run."""
    try:
        return reap(cfg, exclude=current_run.get_id(), holding_slot=True, logger=logger)
    except Exception as e:  # noqa: BLE001 - compute_up reuses or restarts the node anyway
        logger.warning("reaper at start failed: %s: %s", type(e).__name__, e)
        return ReaperResult(action="error", error=f"{type(e).__name__}: {e}")


def _reconcile_at_start(cfg: Profile, logger: Any) -> list[ReconciledManifest] | None:
    """Training manifests left `running` by a run that is gone are marked failed/cancelled
    with the reason (tasks/training/reconcile.py), before tonight's runs look at them."""
    if not cfg.training.enabled:
        return None
    store = cfg.artifact_store()
    try:
        done = reconcile_store(store)
    except Exception as e:  # noqa: BLE001 - a registry that does not read must not stop the night
        logger.warning("could not reconcile the training manifests: %s", e)
        return None
    for r in done:
        logger.warning("adapter %s: %s → %s (%s)", r.name, r.was, r.now, r.reason)
    return [ReconciledManifest(name=r.name, was=r.was, now=r.now, reason=r.reason)
            for r in done] or None


def _cancel_stale_node_runs(cfg: Profile, logger: Any) -> list[StaleNodeRun] | None:
    """Node runs a dead orchestrator left open would be taken by the node's worker as soon as it
    boots, before tonight's: cancel those no live nightly owns (this run holds the slot)."""
    own = current_run.get_id()
    try:
        return cancel_stale_node_runs(cfg.training.node_deployment,
                                      exclude={str(own)} if own else None, holding_slot=True,
                                      logger=logger) or None
    except Exception as e:  # noqa: BLE001 - the night goes on; the summary says it was not done
        logger.warning("could not cancel stale node runs: %s: %s", type(e).__name__, e)
        return [StaleNodeRun(error=f"{type(e).__name__}: {e}")]


def _preflight(cfg: Profile, logger: Any) -> None:
    """tasks/preflight/ for tonight (the orchestrator's own deployments left out):
    a failing check fails the night, naming each failure and its fix, before anything boots."""
    report = run_preflight(cfg, night=True)
    for check in report.checks:
        (logger.info if check.ok else logger.error)("preflight %s", check.line())
    if not report.ok:
        raise report.error()


def served_adapter(cfg: Profile) -> LocalServing:
    """Tonight's server loads the promoted adapter of the profile's serve_bucket, if any, when
    it was trained on the GGUF the server serves (else the base model, and why), and serves it
    under the bucket's name too."""
    bucket = cfg.training.serve_bucket
    if not bucket or not cfg.training.enabled:
        return LocalServing(None)
    store = cfg.artifact_store()  # from GCS when it is the truth
    if not cfg.node.loads_adapters:  # the node says it does not load it (tasks/compute/gce/)
        return LocalServing(store.serving(bucket))
    return local_serving(store, bucket, served_gguf(cfg.node.base_model))


def _mark_partial(summary: RunSummary, report: ExtractionReport) -> None:
    """Phase 1 ended on its budget: the phase is `partial`, and says how much is pending."""
    if report.status != "partial":
        return
    record = summary.phases["extract"]
    record.status = "partial"
    record.note = (f"{sum(report.pending.values())} documents pending: the budget "
                   f"({report.budget_seconds or 0:.0f} s) ended phase 1; they go first "
                   "on the next run")


def _capacity(report: ExtractionReport, nodes: int) -> Any:
    """Tonight's phase-1 rate and the backlog it leaves (tasks/extraction/capacity.py)."""
    return capacity_report(Phase1Measured(
        extracted_documents=sum(c.extracted for c in report.documents.values()),
        completion_tokens=report.completion_tokens, prompt_tokens=report.prompt_tokens,
        phase1_seconds=report.extract_seconds or 0.0,
        backlog_documents=sum(report.pending.values()), backlog_tokens=report.pending_tokens),
        phase1_budget_seconds=report.budget_seconds, nodes=nodes)


def _write_summary(summary: RunSummary, state_dir: Path) -> Path:
    runs = state_dir / "runs"
    path = summary.save(runs / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-"
                               f"{(current_run.get_id() or 'local')[:8]}.json")
    summary.save(runs / "last-run.json")
    return path


def _mirror_records(cfg: Profile, logger: Any) -> None:
    """Run summaries, scorecards and the dead-letter file to the profile's GcsBucket."""
    try:
        report = mirror_records(cfg.state_dir, cfg.gcs_block)
    except Exception as e:  # noqa: BLE001 - the local records are kept either way
        report = SyncReport(error=f"{type(e).__name__}: {e}")
    if report and report.error:
        logger.warning("run records not copied to GCS (kept in %s): %s", cfg.state_dir,
                       report.error)
    elif report:
        logger.info("run records copied to gs://%s/%s (%d new or changed)", report.bucket,
                    report.prefix, report.uploaded)
