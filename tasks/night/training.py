"""Phase 2b as the night runs it: one training run per passing bucket, one after the other,
within one budget; then each promoted adapter served by name."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prefect import get_run_logger

from tasks.errors import NodePreempted, PhaseFailed
from tasks.night.handoff import TrainHere, run_for_marker
from tasks.night.phases import phase
from tasks.records import RunSummary, TrainingMarker, TrainingResult
from tasks.training.serving import publish_promoted

if TYPE_CHECKING:
    from tasks.profile import Profile


def train_passing_buckets(summary: RunSummary, cfg: Profile, profile: str,
                          train_here: TrainHere, timeout_seconds: float,
                          buckets: list[str] | None = None, retrain: bool = False) -> None:
    """One training run per passing bucket (of `buckets`, when given), one after the other
    (each holds the `gpu` slot). A failed run fails the night after the others have had
    their turn."""
    logger = get_run_logger()
    pending = summary.scorecard.training_pending if summary.scorecard else []
    if buckets is not None:
        passing = pending
        pending = [b for b in pending if b in buckets]
        if not pending and cfg.training.enabled:
            summary.set_phase("train", "skipped", note=f"none of {sorted(buckets)} passed the "
                              f"scorecard (passing: {sorted(passing) or 'none'})")
            summary.training = {}
            return
    summary.training = {}
    training = summary.training  # the record's own dict (assigning validates into a copy)
    if not cfg.training.enabled:
        summary.set_phase("train", "skipped", note="[training] enabled = false")
        return
    if not pending:
        summary.set_phase("train", "skipped", note="no bucket passed the scorecard")
        return
    failed = []
    preempted: NodePreempted | None = None
    deadline = time.monotonic() + timeout_seconds  # one budget for the whole of phase 2b
    for bucket in pending:
        marker_path = cfg.state_dir / "training-pending" / f"{bucket}.json"
        marker = TrainingMarker.load(marker_path)
        if time.monotonic() >= deadline:
            training[bucket] = TrainingResult(state="not run", message="phase 2's time "
                                              f"({timeout_seconds:.0f} s: its timeout, or what "
                                              "was left of the night's budget) was spent "
                                              "before this bucket's turn")
            failed.append(bucket)
            continue
        if preempted is not None:  # no node left to train on tonight
            training[bucket] = TrainingResult(state="not run", message="the node was "
                                              f"preempted during an earlier bucket: {preempted}")
            failed.append(bucket)
            continue
        try:
            with phase(summary, f"train:{bucket}"):
                m = run_for_marker(cfg, profile, marker, max(1.0, deadline - time.monotonic()),
                                   train_here, retrain=retrain)
        except Exception as e:  # noqa: BLE001 - recorded; the other bucket still trains
            state = "preempted" if isinstance(e, NodePreempted) else "failed"
            training[bucket] = TrainingResult(state=state, message=str(e)[:500])
            failed.append(bucket)
            if isinstance(e, NodePreempted):
                preempted = e
            continue
        training[bucket] = m
        marker_path.unlink(missing_ok=True)  # consumed: the manifest records the dataset
        logger.info("%s: adapter %s %s", bucket, m.name,
                    "reused (already trained on this data)" if m.reused else
                    "PROMOTED" if m.promoted else "kept, not promoted")
    if preempted is not None:
        raise NodePreempted(f"training failed for {', '.join(failed)}: the node was preempted "
                            f"({preempted}); the next run resumes from the last checkpoint")
    if failed:
        raise PhaseFailed(f"training failed for {', '.join(failed)} (see training in the summary)")


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
