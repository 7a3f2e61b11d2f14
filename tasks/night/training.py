"""Phase 2b as the night runs it: one training run per passing bucket, one after the other,
within one budget; then each promoted adapter served by name. The nightly flow walks the queue
(`TrainingQueue.each`) and trains each bucket where the node says (on the node through its
deployment, the task `train_on_node_task`, or with its own call of the train flow);
`TrainingQueue.took` keeps what became of each run from its final state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from tasks.night.handoff import train_on_node, train_params
from tasks.night.phases import phase, phase_failed
from tasks.records import RunSummary, TrainingMarker, TrainingResult
from tasks.shared.errors import NodePreempted, PhaseFailed
from tasks.training.params import TrainParams
from tasks.training.serving import publish_promoted

if TYPE_CHECKING:
    from tasks.profile import Profile


@dataclass
class BucketTraining:
    """One passing bucket's training run: its marker, its parameters (the profile's recipe on
    the marker's dataset) and when phase 2b's budget ends (time.monotonic())."""

    bucket: str
    marker_path: Path
    params: TrainParams
    deadline: float
    remote: bool  # the node trains (Node.remote_training): its deployment runs the train flow

    def seconds(self) -> float:
        """What is left of phase 2b's budget for this run (at least 1 s)."""
        return max(1.0, self.deadline - time.monotonic())


class TrainingQueue:
    """Phase 2b's training runs, one per bucket that passed the scorecard (of `buckets`, when
    given), and what became of each in the summary: a failed run fails the night after the others have
    had their turn (`end`)."""

    def __init__(self, summary: RunSummary, cfg: Profile, profile: str,
                 timeout_seconds: float) -> None:
        self.summary, self.cfg, self.profile = summary, cfg, profile
        self.timeout_seconds = timeout_seconds
        self.failed: list[str] = []
        self.rows: dict[str, TrainingResult] = {}  # the summary's own `training` (pending)
        self.preempted: NodePreempted | None = None
        self.logger = get_run_logger()

    def pending(self, buckets: list[str] | None) -> list[str]:
        """The buckets to train tonight; none (and the phase marked skipped, saying why)."""
        s = self.summary
        pending = s.scorecard.training_pending if s.scorecard else []
        if buckets is not None:
            passing = pending
            pending = [b for b in pending if b in buckets]
            if not pending and self.cfg.training.enabled:
                s.set_phase("train", "skipped", note=f"none of {sorted(buckets)} passed the "
                            f"scorecard (passing: {sorted(passing) or 'none'})")
                s.training = {}
                return []
        s.training = {}
        assert s.training is not None
        self.rows = s.training  # the record's own dict (assigning validates into a copy)
        if not self.cfg.training.enabled:
            s.set_phase("train", "skipped", note="[training] enabled = false")
            return []
        if not pending:
            s.set_phase("train", "skipped", note="no bucket passed the scorecard")
        return pending

    def each(self, buckets: list[str] | None) -> Iterator[BucketTraining]:
        """The runs, one bucket after the other within one budget; a bucket the budget or a
        preempted node leaves no time for is recorded `not run`."""
        deadline = time.monotonic() + self.timeout_seconds  # one budget for the whole of 2b
        for bucket in self.pending(buckets):
            marker_path = self.cfg.state_dir / "training-pending" / f"{bucket}.json"
            marker = TrainingMarker.load(marker_path)
            why = self._not_run(deadline)
            if why:
                self.rows[bucket] = TrainingResult(state="not run", message=why)
                self.failed.append(bucket)
                continue
            try:  # a recipe that does not build fails this bucket, in its phase record
                with phase(self.summary, f"train:{bucket}"):
                    params = train_params(self.cfg, self.profile, {
                        "dataset": marker.dataset, "bucket": marker.bucket,
                        "method": marker.kind})
            except Exception as e:  # noqa: BLE001 - recorded; the other bucket still trains
                self._failed(bucket, e)
                continue
            yield BucketTraining(bucket, marker_path, params, deadline, self.cfg.node.remote_training)

    def _not_run(self, deadline: float) -> str | None:
        if time.monotonic() >= deadline:
            return (f"phase 2's time ({self.timeout_seconds:.0f} s: its timeout, or what was "
                    "left of the night's budget) was spent before this bucket's turn")
        if self.preempted is not None:  # no node left to train on tonight
            return f"the node was preempted during an earlier bucket: {self.preempted}"
        return None

    def on_node(self, job: BucketTraining, retrain: bool) -> State[TrainingResult]:
        """The job's run on the node, through its deployment: its final state."""
        return train_on_node_task(self.cfg, self.profile, job.params, job.seconds(),
                                  f"train:{job.bucket}", retrain, return_state=True)

    def took(self, job: BucketTraining, state: State[Any]) -> None:
        """What became of `job` (its run's final state: a TrainingResult from the node, a
        manifest from the train flow) in its phase record and the summary's training rows; a
        failure is recorded, not raised (the other buckets still train)."""
        name = f"train:{job.bucket}"
        got = state.result(raise_on_failure=False)
        if isinstance(got, Exception):
            phase_failed(self.summary, name, got)
            self._failed(job.bucket, got)
            return
        m = got if isinstance(got, TrainingResult) else TrainingResult.of_manifest(got)
        m.seconds = round(self.summary.phases[name].seconds or 0.0, 1)
        self.rows[job.bucket] = m
        job.marker_path.unlink(missing_ok=True)  # consumed: the manifest records the dataset
        self.logger.info("%s: adapter %s %s", job.bucket, m.name,
                         "reused (already trained on this data)" if m.reused else
                         "PROMOTED" if m.promoted else "kept, not promoted")

    def _failed(self, bucket: str, e: Exception) -> None:
        state = "preempted" if isinstance(e, NodePreempted) else "failed"
        self.rows[bucket] = TrainingResult(state=state, message=str(e)[:500])
        self.failed.append(bucket)
        if isinstance(e, NodePreempted):
            self.preempted = e

    def end(self) -> None:
        """NodePreempted when the node went, else PhaseFailed naming the buckets that failed."""
        if self.preempted is not None:
            raise NodePreempted(f"training failed for {', '.join(self.failed)}: the node was "
                                f"preempted ({self.preempted}); the next run resumes from the "
                                "last checkpoint")
        if self.failed:
            raise PhaseFailed(f"training failed for {', '.join(self.failed)} (see training "
                              "in the summary)")


@task(name="train-on-node", cache_policy=NO_CACHE)
def train_on_node_task(cfg: Profile, profile: str, params: TrainParams, timeout_seconds: float,
                       label: str, retrain: bool) -> TrainingResult:
    """tasks/night/handoff.py train_on_node as a task of the night, whose state it gets back."""
    return train_on_node(cfg, profile, params, timeout_seconds, label=label,
                         created_by="nightly", retrain=retrain)


def publish_phase(summary: RunSummary, cfg: Profile) -> None:
    """After phase 2 (training is done with the GPU): tell the configured serving endpoint to
    serve each bucket's promoted adapter under the bucket's name, and check the name answers.
    A failure is recorded with its cause, never raised: the promotion stands."""
    if cfg.serving is None:
        return
    logger = get_run_logger()
    with phase(summary, "publish"):
        store = cfg.artifact_store()
        summary.published = results = publish_promoted(cfg.serving, store)
    failed = [b for b, r in results.items() if r.state == "failed"]
    for bucket, r in results.items():
        (logger.warning if r.state == "failed" else logger.info)(
            "serving %s on %s: %s — %s", bucket, cfg.serving.describe(), r.state, r.message)
    if failed:
        summary.phases["publish"].note = f"not served by name: {', '.join(failed)}"
