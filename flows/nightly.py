"""The nightly pipeline, as the runbook reads:

boot the node → start the inference server and wait for it → phase 1 (extract) → stop the
inference server, release the accelerator → phase 2: score the corpus, train each passing
bucket (export, verify, register, promote) → stop the node, always. The next night's server
loads the promoted adapter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run as current_run

from flows.extract import extract
from flows.reaper import reap
from flows.scorecard import scorecard
from flows.train import run_for_marker
from tasks.compute.gpu import LEASE_SECONDS, NIGHTLY_LIMIT, gpu_slot, holders, nightly_slot
from tasks.compute.node import compute_down, compute_up, inference_down, inference_up, node_usage
from tasks.compute.protocol import Node
from tasks.errors import ConfigError, NodePreempted, PhaseFailed, PhaseTimedOut
from tasks.profile import Profile, load_profile
from tasks.records import RunSummary, ScorecardSummary, TrainingMarker, TrainingResult
from tasks.summary import cost_summary, new_summary, render_markdown
from tasks.training.serving import LocalServing, local_serving, publish_promoted, served_gguf

NIGHTLY_SLOT_WAIT_SECONDS = 3 * LEASE_SECONDS  # > a dead run's lease + the repossessor's loop


def _stop_node_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """Backstop for cancellation and crashes: the `finally` below may not have run. Every
    node of the profile is stopped, each on its own (one that fails leaves no other up)."""
    try:
        nodes = load_profile(flow_run.parameters.get("profile", "local")).nodes
    except Exception as e:  # noqa: BLE001 - a hook must not raise
        print(f"nightly teardown hook could not load the profile to stop its nodes: {e}")
        return
    for i, node in enumerate(nodes, 1):
        try:
            node.stop()
        except Exception as e:  # noqa: BLE001 - a hook must not raise
            print(f"nightly teardown hook could not stop node {i}: {e}")


def _take_nightly_slot(stack: ExitStack) -> None:
    """Hold the `nightly` slot for the whole run (tasks/compute/gpu.py): it tells the reaper this run
    is alive and owns the node. A recorded holder on this machine whose process is gone is
    taken over at once; one on another host loses its lease when it expires (≤ ~75 s)."""
    try:
        stack.enter_context(nightly_slot(timeout_seconds=NIGHTLY_SLOT_WAIT_SECONDS))
    except TimeoutError as e:
        held = "; ".join(holders(NIGHTLY_LIMIT)) or "no holder recorded on this machine"
        raise PhaseFailed(
            f"the 'nightly' concurrency slot is still held after {NIGHTLY_SLOT_WAIT_SECONDS:.0f} s "
            f"(holders: {held}) — another nightly run is alive (prefect flow-run ls --flow-name "
            "nightly --state RUNNING: wait for it or cancel it); a holder on this machine whose "
            "process is gone is taken over by itself. A slot held with no live run anywhere (a "
            "killed run from before slot records, or a server restarted without its leases): "
            "`prefect gcl update nightly --active-slots 0`", {}) from e


def _reap_at_start(cfg: Any, logger: Any) -> dict[str, Any]:
    """Run the reaper's logic while holding the slot: a node up now was left by a dead run."""
    try:
        return reap(cfg, exclude=current_run.get_id(), holding_slot=True, logger=logger)
    except Exception as e:  # noqa: BLE001 - compute_up reuses or restarts the node anyway
        logger.warning("reaper at start failed: %s: %s", type(e).__name__, e)
        return {"action": "error", "error": f"{type(e).__name__}: {e}"}


def _request_stop(node: Node, logger: Any) -> None:
    """First thing in `finally`: ask for the stop without waiting, so a cancelled run (30 s of
    grace before SIGKILL) has at least requested it; compute_down then waits for it."""
    try:
        node.request_stop()
    except Exception as e:  # noqa: BLE001 - compute_down retries the stop and reports
        logger.warning("stop request failed (compute_down retries): %s", e)


def _node_lost(node: Node) -> NodePreempted | None:
    """The node went away under phase 1 (spot preemption): what failed is its doing."""
    try:
        node.check_running()
    except NodePreempted as e:
        return e
    except Exception:  # noqa: BLE001 - cannot tell: the phase's own outcome stands
        return None
    return None


def _final_status(e: BaseException) -> Literal["preempted", "cancelled", "failed"]:
    from prefect.exceptions import TerminationSignal

    if isinstance(e, NodePreempted):
        return "preempted"
    # KeyboardInterrupt: `slm-nightly run` stopped by Ctrl-C or SIGTERM (tasks/runtime/interrupts.py).
    return "cancelled" if isinstance(e, TerminationSignal | KeyboardInterrupt) else "failed"


@contextmanager
def _phase(summary: RunSummary, name: str) -> Iterator[None]:
    start = time.monotonic()
    record = summary.set_phase(name, "running")
    try:
        yield
        record.status = "completed"
    except BaseException as e:
        # Prefect's FlowRunTimeoutError and TaskRunTimeoutError are TimeoutErrors, and so is
        # PhaseTimedOut; run_on_node raises TimeoutError when a node run outlives its budget.
        record.status = "timed_out" if isinstance(e, TimeoutError | PhaseTimedOut) \
            else _final_status(e)
        if isinstance(e, PhaseFailed):
            summary.merge_extraction(e.summary)
        why = str(e) or ("the run was cancelled" if _final_status(e) == "cancelled" else "")
        if summary.error is None:  # the first phase that failed says why
            summary.error = f"{name}: {type(e).__name__}" + (f": {why}" if why else "")
        raise
    finally:
        record.seconds = round(time.monotonic() - start, 2)


def _write_summary(summary: RunSummary, state_dir: Path) -> Path:
    runs = state_dir / "runs"
    path = summary.save(runs / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-"
                               f"{(current_run.get_id() or 'local')[:8]}.json")
    summary.save(runs / "last-run.json")
    return path


def _mirror_records(cfg: Profile, logger: Any) -> None:
    """Run summaries, scorecards and the dead-letter file to the profile's GcsBucket."""
    from tasks.gcs_sync import mirror_records

    try:
        report = mirror_records(cfg.state_dir, cfg.gcs_block)
    except Exception as e:  # noqa: BLE001 - the local records are kept either way
        report = {"error": f"{type(e).__name__}: {e}"}
    if report and report.get("error"):
        logger.warning("run records not copied to GCS (kept in %s): %s", cfg.state_dir,
                       report["error"])
    elif report:
        logger.info("run records copied to gs://%s/%s (%d new or changed)", report["bucket"],
                    report["prefix"], report["uploaded"])


def _train_passing_buckets(summary: RunSummary, cfg: Profile, profile: str,
                           timeout_seconds: float, buckets: list[str] | None = None,
                           retrain: bool = False) -> None:
    """Phase 2b: one training run per passing bucket (of `buckets`, when given), one after the
    other (each holds the `gpu` slot). A failed run fails the night after the others have had
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
            with _phase(summary, f"train:{bucket}"):
                m = run_for_marker(marker, profile, max(1.0, deadline - time.monotonic()),
                                   retrain=retrain)
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


def _reconcile_at_start(cfg: Profile, logger: Any) -> list[dict[str, str]] | None:
    """Training manifests left `running` by a run that is gone are marked failed/cancelled
    with the reason (tasks/training/reconcile.py), before tonight's runs look at them."""
    if not cfg.training.enabled:
        return None
    from tasks.training.reconcile import reconcile_store

    store = cfg.artifact_store()
    try:
        done = reconcile_store(store)
    except Exception as e:  # noqa: BLE001 - a registry that does not read must not stop the night
        logger.warning("could not reconcile the training manifests: %s", e)
        return None
    for r in done:
        logger.warning("adapter %s: %s → %s (%s)", r.name, r.was, r.now, r.reason)
    return [{"name": r.name, "was": r.was, "now": r.now, "reason": r.reason} for r in done] or None


def _cancel_stale_node_runs(cfg: Profile, logger: Any) -> list[dict[str, str]] | None:
    """Node runs a dead orchestrator left open would be taken by the node's worker as soon as it
    boots, before tonight's: cancel those no live nightly owns (this run holds the slot)."""
    from tasks.compute.stale_runs import cancel_stale_node_runs

    own = current_run.get_id()
    try:
        return cancel_stale_node_runs(cfg.training.node_deployment,
                                      exclude={str(own)} if own else None, holding_slot=True,
                                      logger=logger) or None
    except Exception as e:  # noqa: BLE001 - the night goes on; the summary says it was not done
        logger.warning("could not cancel stale node runs: %s: %s", type(e).__name__, e)
        return [{"error": f"{type(e).__name__}: {e}"}]


# Besides its timed phases the node stays up for the scorecard, the dataset uploads, publishing
# and the stop: the margin its own max run duration allows for them.
NODE_MARGIN_SECONDS = 1800
PHASES = ("all", "extract", "train")  # the nightly's `phases`: the whole night, or one half


def night_seconds(cfg: Profile, phase1_timeout_seconds: float,
                  phase2_timeout_seconds: float) -> float:
    """The night's budget when none is given: the boot timeout (a GCE node), the engine's
    readiness timeout and both phase timeouts — each phase can have all of its own."""
    from blocks.gce import GceCompute

    boot = cfg.compute.boot_timeout_seconds if isinstance(cfg.compute, GceCompute) else 0.0
    return (boot + cfg.inference.readiness_timeout_seconds + phase1_timeout_seconds
            + phase2_timeout_seconds)


def night_budget(cfg: Profile, phase1_timeout_seconds: float,
                 phase2_timeout_seconds: float, night: float | None = None) -> float | None:
    """How long tonight's node may run before Compute stops it by itself (its max run duration,
    in case this orchestrator dies): the night's budget (`night`, or night_seconds), the stop
    and a margin. None for a local node (nothing stops this machine)."""
    from blocks.gce import GceCompute

    compute = cfg.compute
    if not isinstance(compute, GceCompute):
        return None
    if night is None:
        night = night_seconds(cfg, phase1_timeout_seconds, phase2_timeout_seconds)
    return night + compute.stop_timeout_seconds + NODE_MARGIN_SECONDS


class NightClock:
    """One deadline for the whole night: boot, readiness, phase 1 and phase 2 each get the
    smaller of their own timeout and what is left. Phase 1 (which can end `partial` on time)
    first sets aside phase 2's share: its timeout, at most half of what is left."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget = budget_seconds
        self.deadline = time.time() + budget_seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def give(self, own_seconds: float) -> float:
        return min(own_seconds, self.left())

    def phase1(self, own_seconds: float, phase2_seconds: float) -> float:
        left = self.left()
        return max(0.0, min(own_seconds, left - min(phase2_seconds, left / 2)))


def _merge_usage(usages: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Every node's usage as one: RUNNING seconds, GPU-hours and cost add up; each node's zones
    kept (a node after the first is named in its keys)."""
    got = [(i, u) for i, u in enumerate(usages, 1) if u]
    if not got:
        return None
    if len(usages) == 1:
        return got[0][1]
    zones: dict[str, Any] = {}
    for i, u in got:
        for zone, z in u.get("zones", {}).items():
            zones[zone if i == 1 else f"{zone} (node {i})"] = z
    notes = [f"node {i}: {u['note']}" for i, u in got if u.get("note")]
    missing = [str(i) for i, u in enumerate(usages, 1) if not u]
    if missing:
        notes.append(f"usage unavailable for node {', '.join(missing)}")
    return {"running_seconds": sum(u["running_seconds"] for _, u in got),
            "gpu_hours": sum(u["gpu_hours"] for _, u in got),
            "estimated_usd": sum(u["estimated_usd"] for _, u in got),
            "zones": zones, "note": "; ".join(notes)}


def _preflight(cfg: Profile, logger: Any) -> None:
    """tasks/preflight/ for tonight (the orchestrator's own deployments left out):
    a failing check fails the night, naming each failure and its fix, before anything boots."""
    from tasks.preflight.run import run_preflight

    report = run_preflight(cfg, night=True)
    for check in report.checks:
        (logger.info if check.ok else logger.error)("preflight %s", check.line())
    if not report.ok:
        raise report.error()


def _served_adapter(cfg: Profile) -> LocalServing:
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


def _publish(summary: RunSummary, cfg: Profile) -> None:
    """After phase 2 (training is done with the GPU): tell the configured serving endpoint to
    serve each bucket's promoted adapter under the bucket's name, and check the name answers.
    A failure is recorded with its cause, never raised: the promotion stands."""
    if cfg.serving is None:
        return
    logger = get_run_logger()
    with _phase(summary, "publish"):
        store = cfg.artifact_store()
        summary.published = results = publish_promoted(cfg.serving, store)
    failed = [b for b, r in results.items() if r.state == "failed"]
    for bucket, r in results.items():
        (logger.warning if r.state == "failed" else logger.info)(
            "serving %s on %s: %s — %s", bucket, cfg.serving.describe(), r.state, r.message)
    if failed:
        summary.phases["publish"].note = f"not served by name: {', '.join(failed)}"


def _each(task: Any, nodes: list[Node], **kwargs: Any) -> list[Any]:
    """`task(node, **kwargs)` on every node — at once when there are several — and each one's
    result or the exception it raised (the caller decides what a failure costs)."""
    if len(nodes) == 1:
        try:
            return [task(nodes[0], **kwargs)]
        except Exception as e:  # noqa: BLE001 - returned to the caller, who re-raises
            return [e]
    futures = [task.submit(n, **kwargs) for n in nodes]
    out: list[Any] = []
    for f in futures:
        try:
            out.append(f.result())
        except Exception as e:  # noqa: BLE001 - returned to the caller, who re-raises
            out.append(e)
    return out


def _drop_failed(nodes: list[Node], results: list[Any], what: str, logger: Any
                 ) -> tuple[list[Node], list[Any]]:
    """The primary node failing fails the step; another node failing is left out of tonight's
    phase 1 (it is stopped with the rest at the end) with a warning."""
    if isinstance(results[0], BaseException):
        raise results[0]
    kept = [(n, r) for n, r in zip(nodes, results, strict=True)
            if not isinstance(r, BaseException)]
    for i, r in enumerate(results[1:], 2):
        if isinstance(r, BaseException):
            logger.warning("node %d left out of tonight's phase 1 (%s failed): %s: %s", i, what,
                           type(r).__name__, r)
    return [n for n, _ in kept], [r for _, r in kept]


def _stop_directly(nodes: list[Node], index: list[int],
                   usages: dict[int, dict[str, Any] | None], logger: Any) -> None:
    """Each node stopped without Prefect tasks (a cancelled run may not start new ones), each
    in its own try: one that cannot be stopped does not leave the others up."""
    for i, n in zip(index, nodes, strict=True):
        try:
            n.stop()
        except Exception as e:  # noqa: BLE001 - the next node still gets its stop
            logger.error("node %d could not be stopped: %s: %s", i + 1, type(e).__name__, e)
        usages[i] = node_usage(n, logger)


def _mark_partial(summary: RunSummary, phase1: dict[str, Any]) -> None:
    """Phase 1 ended on its budget: the phase is `partial`, and says how much is pending."""
    if phase1.get("status") != "partial":
        return
    record = summary.phases["extract"]
    record.status = "partial"
    record.note = (f"{sum(phase1.get('pending', {}).values())} documents pending: the budget "
                   f"({phase1.get('budget_seconds') or 0:.0f} s) ended phase 1; they go first "
                   "on the next run")


def _capacity(phase1: dict[str, Any], nodes: int) -> Any:
    """Tonight's phase-1 rate and the backlog it leaves (tasks/capacity.py)."""
    from tasks.capacity import capacity_report

    return capacity_report(
        extracted_documents=sum(c["extracted"] for c in phase1["documents"].values()),
        completion_tokens=phase1["completion_tokens"], prompt_tokens=phase1["prompt_tokens"],
        phase1_seconds=phase1.get("extract_seconds") or 0.0,
        phase1_budget_seconds=phase1.get("budget_seconds"),
        backlog_documents=sum(phase1.get("pending", {}).values()),
        backlog_tokens=phase1.get("pending_tokens", 0), nodes=nodes)


def _phase1_timeout(budget: float) -> float:
    """Prefect's hard limit on phase 1, a backstop only: the phase ends itself at its budget
    (in-flight requests finish, then the last writes) — a margin past it, never the clock."""
    return budget + max(120.0, 0.1 * budget)


def _phase1(summary: RunSummary, cfg: Profile, profile: str, clock: NightClock,
            nodes: list[Node], logger: Any, full: bool, retry_failed: bool,
            max_failed_share: float | None, phase1_timeout_seconds: float,
            phase2_timeout_seconds: float) -> tuple[list[Node], Exception | None]:
    """Serve and extract on `nodes`: the nodes that served, and phase 1's failure, if any. The
    corpus does not depend on tonight's graph, so a failed phase 1 is returned, not raised:
    the caller releases the GPU and runs phase 2, then fails the night with this reason
    (`summary.error` holds it already). A node that is gone (NodePreempted) and a cancelled
    run (BaseException) are raised: there is nothing left to train on."""
    serving_nodes = nodes
    try:
        with _phase(summary, "inference_up"):
            serving = _served_adapter(cfg)
            summary.serving_adapter = str(serving.adapter) if serving.adapter else None
            if serving.note:
                summary.serving_note = serving.note
                logger.warning("%s", serving.note)
            elif serving.adapter and serving.names:
                summary.serving_note = (f"served as {cfg.inference.model} and "
                                        f"{', '.join(serving.names)}")
            endpoint = cfg.inference.model_copy(update={
                "readiness_timeout_seconds":
                    clock.give(cfg.inference.readiness_timeout_seconds)})
            ready = _each(inference_up, serving_nodes, endpoint=endpoint,
                          adapter=serving.adapter, names=serving.names)
            serving_nodes, urls = _drop_failed(serving_nodes, ready, "inference", logger)
        with _phase(summary, "extract"):
            budget1 = clock.phase1(phase1_timeout_seconds, phase2_timeout_seconds)
            try:
                phase1 = extract.with_options(timeout_seconds=_phase1_timeout(budget1))(
                    profile=profile, base_url=urls[0], full=full,
                    retry_failed=retry_failed, max_failed_share=max_failed_share,
                    base_urls=urls, budget_seconds=budget1).model_dump(mode="json")
            except Exception as e:
                lost = _node_lost(cfg.node)
                if lost is None:
                    raise
                if isinstance(e, PhaseFailed):
                    summary.merge_extraction(e.summary)
                raise lost from e
            summary.merge_extraction(phase1)
            lost = _node_lost(cfg.node)  # documents failed with it: done next run
            if lost is not None:
                raise lost
        _mark_partial(summary, phase1)
        if phase1.get("extract_seconds") or phase1.get("pending"):  # something to measure
            summary.capacity = _capacity(phase1, len(serving_nodes))
    except NodePreempted:
        raise
    except Exception as e:
        logger.error("phase 1 failed (%s); the inference server is stopped and phase 2 runs",
                     summary.error or f"{type(e).__name__}: {e}")
        return serving_nodes, e
    return serving_nodes, None


@flow(name="nightly", on_cancellation=[_stop_node_hook], on_crashed=[_stop_node_hook])
def nightly(profile: str = "local", full: bool = False, retry_failed: bool = False,
            phase1_timeout_seconds: int = 7200, phase2_timeout_seconds: int = 7200,
            max_failed_share: float | None = None,
            night_budget_seconds: int | None = None, phases: str = "all",
            buckets: list[str] | None = None, retrain: bool = False) -> dict[str, Any]:
    """Run the nightly pipeline on the profile's blocks and return the run summary.

    `night_budget_seconds`: one deadline for the boot, the engine's readiness, phase 1 and
    phase 2 (default: the sum of their timeouts); each gets the smaller of its own timeout and
    what is left (NightClock). `phases`: "all"; "extract" (phase 1 only: no scorecard, no
    training); "train" (phase 2 only: the primary node boots, its engine is stopped at once,
    nothing is extracted). `buckets`: train only these of the buckets that pass (the others'
    markers stay for the next night); `retrain`: train them even when an adapter of the same
    data and parameters exists."""
    if phases not in PHASES:
        raise ConfigError(f"nightly: phases {phases!r} — one of {', '.join(PHASES)}")
    if buckets is not None and phases == "extract":
        raise ConfigError("nightly: buckets name what to train; phases = \"extract\" trains "
                          "nothing — drop buckets, or run phases = \"train\"")
    logger = get_run_logger()
    cfg = load_profile(profile)
    known = set(cfg.corpus.buckets()) if buckets is not None else set()
    unknown = sorted(set(buckets or []) - known)
    if unknown:
        raise ConfigError(f"nightly: buckets {unknown} are not the profile's corpus buckets "
                          f"({', '.join(sorted(known))}) — fix the buckets parameter")
    summary = new_summary(cfg.name)
    summary.started_at = datetime.now(UTC).isoformat(timespec="seconds")
    night = float(night_budget_seconds or night_seconds(cfg, phase1_timeout_seconds,
                                                        phase2_timeout_seconds))
    clock = NightClock(night)
    summary.night_budget_seconds = night
    # the primary (phase 2's) first; once booting, every one is stopped. Phase 2 alone needs
    # only the primary (its worker takes the node runs).
    nodes = cfg.nodes if phases != "train" else cfg.nodes[:1]
    usages: dict[int, dict[str, Any] | None] = {}  # node's index → its usage, once stopped
    alive = ExitStack()
    _take_nightly_slot(alive)
    summary.reaper = _reap_at_start(cfg, logger)
    summary.reconciled = _reconcile_at_start(cfg, logger)
    if cfg.node.remote_training:  # a local node has no node runs
        summary.stale_node_runs = _cancel_stale_node_runs(cfg, logger)
    try:
        if cfg.node.remote_training:  # a GCE node: nothing boots before its preflight passes
            with _phase(summary, "preflight"):
                _preflight(cfg, logger)
        with _phase(summary, "compute_up"):
            boot = cfg.compute.boot_timeout_seconds if hasattr(cfg.compute,
                                                               "boot_timeout_seconds") else None
            booted = _each(compute_up, nodes, max_run_seconds=night_budget(
                cfg, phase1_timeout_seconds, phase2_timeout_seconds, night),
                endpoint=cfg.inference,
                timeout_seconds=None if boot is None else clock.give(boot))
            serving_nodes, where = _drop_failed(nodes, booted, "boot", logger)
            summary.node = where[0] if len(nodes) == 1 else " | ".join(
                f"node {i}: {w}" for i, w in enumerate(where, 1)) + (
                f" ({len(nodes) - len(where)} of {len(nodes)} did not boot)"
                if len(where) < len(nodes) else "")
        # Phase 1 holds the `gpu` slot: no ad-hoc training shares the card with the server.
        with gpu_slot():
            if phases == "train":  # the engine the node booted gives the GPU up at once
                phase1_error = None
                summary.set_phase("extract", "skipped", note="phases = train")
            else:
                serving_nodes, phase1_error = _phase1(
                    summary, cfg, profile, clock, serving_nodes, logger, full, retry_failed,
                    max_failed_share, phase1_timeout_seconds, phase2_timeout_seconds)
            with _phase(summary, "inference_down"):
                for result in _each(inference_down, serving_nodes):
                    if isinstance(result, BaseException):
                        raise result
        if len(nodes) > 1:  # only the primary's worker may take phase 2's node runs
            with _phase(summary, "extra_nodes_down"):
                results = _each(compute_down, nodes[1:])
                for i, r in enumerate(results, 1):
                    if not isinstance(r, BaseException):
                        usages[i] = r
                for r in results:
                    if isinstance(r, BaseException):
                        raise r
        if phases == "extract":
            summary.set_phase("scorecard", "skipped", note="phases = extract")
        elif cfg.corpus.root:
            with _phase(summary, "scorecard"):
                summary.scorecard = ScorecardSummary.model_validate(scorecard(profile=profile))
        else:
            summary.set_phase("scorecard", "skipped", note="no [corpus] root in the profile")
        try:
            if phases == "extract":
                summary.set_phase("train", "skipped", note="phases = extract")
            else:
                _train_passing_buckets(summary, cfg, profile,
                                       clock.give(phase2_timeout_seconds), buckets, retrain)
        except Exception:
            _publish(summary, cfg)  # what was promoted is served though another bucket failed
            raise
        _publish(summary, cfg)
        if phase1_error is not None:
            raise phase1_error
        summary.status = "partial" if summary.phases["extract"].status == "partial" \
            else "completed"
    except BaseException as e:
        summary.status = _final_status(e)
        raise
    finally:
        try:
            if "compute_up" not in summary.phases:  # the preflight failed: nothing booted
                summary.set_phase("compute_down", "skipped", note="nothing was booted")
            else:
                with _phase(summary, "compute_down"):
                    left = [i for i in range(len(nodes)) if i not in usages]
                    todo = [nodes[i] for i in left]
                    for n in todo:
                        _request_stop(n, logger)
                    try:
                        results = _each(compute_down, todo)
                        usages.update((i, None if isinstance(r, BaseException) else r)
                                      for i, r in zip(left, results, strict=True))
                        for r in results:
                            if isinstance(r, BaseException):
                                raise r
                    except BaseException:
                        # Cancellation can refuse new task runs: stop the nodes directly.
                        _stop_directly(todo, left, usages, logger)
                        raise
                    finally:
                        summary.cost = cost_summary(_merge_usage(
                            [usages.get(i) for i in range(len(nodes))]), summary)
        except Exception:
            summary.status = "failed"
            raise
        finally:
            try:
                summary.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
                path = _write_summary(summary, cfg.state_dir)
                _mirror_records(cfg, logger)
                create_markdown_artifact(render_markdown(summary), key="nightly-summary",
                                         description="Nightly run summary")
                logger.info("run summary written to %s", path)
            finally:
                alive.close()  # the node is down: release the `nightly` slot
    return summary.to_dict()
