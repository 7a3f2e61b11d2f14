"""Prefect tasks for the compute node's lifecycle: boot, serve, release, stop — on any node
(tasks/compute/protocol.py), and run_on_node for work that must run where the GPU is."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run as current_run
from prefect.states import Cancelled, Cancelling, Crashed

from blocks.inference import InferenceEndpoint
from tasks.compute.protocol import Node
from tasks.records import NodeUsage, TrainingResult
from tasks.shared.errors import NodePreempted, PhaseFailed
from tasks.shared.waiting import poll


@task(name="compute-up", cache_policy=NO_CACHE)
def compute_up(node: Node, max_run_seconds: float | None = None,
               endpoint: InferenceEndpoint | None = None,
               timeout_seconds: float | None = None) -> str:
    """Boot the node; a node that can stop itself does so after `max_run_seconds` RUNNING
    (None: the node's default — GceCompute.max_run_seconds); `timeout_seconds` caps the wait
    for the boot (Node.start). With `endpoint`, what the node boots is first brought in line
    with the profile (Node.prepare: the GCE startup script)."""
    logger = get_run_logger()
    if endpoint is not None:
        changed = node.prepare(endpoint)
        if changed:
            logger.info("startup script rewritten from the profile in %s (takes effect at "
                        "this boot)", ", ".join(changed))
    where = node.start(max_run_seconds, timeout_seconds)
    logger.info("compute up: %s", where)
    return where


@task(name="inference-up", cache_policy=NO_CACHE)
def inference_up(node: Node, endpoint: InferenceEndpoint,
                 adapter: Path | None = None, names: tuple[str, ...] = ()) -> str:
    """Start the inference server on the node (with tonight's promoted adapter, if any, where
    the node loads adapters, also served under `names`) and wait until /v1/models answers."""
    url = node.start_inference(endpoint, adapter, names)
    loaded = adapter and node.loads_adapters
    get_run_logger().info("inference server ready at %s (model %s%s%s)", url, endpoint.model,
                          f", adapter {adapter}" if loaded else "",
                          f", also served as {', '.join(names)}" if loaded and names else "")
    return url


@task(name="inference-down", cache_policy=NO_CACHE)
def inference_down(node: Node) -> bool:
    """Stop the inference server and verify it is gone, so phase 2 has the GPU to itself."""
    stopped = node.stop_inference()
    if node.inference_running():
        raise RuntimeError("inference server still running after stop")
    get_run_logger().info("inference server stopped; accelerator released")
    return stopped


@task(name="compute-down", cache_policy=NO_CACHE)
def compute_down(node: Node) -> NodeUsage | None:
    """Stop the node (always runs, from the flow's `finally`) and return its usage this run
    (RUNNING time, GPU-hours, estimated cost; see Node.usage), None if unavailable."""
    node.stop()
    logger = get_run_logger()
    logger.info("compute down")
    return node_usage(node, logger)


def node_usage(node: Node, logger: Any) -> NodeUsage | None:
    try:
        used = node.usage()
    except Exception as e:  # noqa: BLE001 - the node is down; the estimate is a nicety
        logger.warning("node usage unavailable: %s", e)
        return None
    logger.info("node ran %.0f s this run (%.4f GPU-hours), estimated $%.2f",
                used.running_seconds, used.gpu_hours, used.estimated_usd)
    return used


# --- work that must run on the node ---------------------------------------------------------
NODE_RESULT_KEY = "node-result"  # table artifact a node-side flow publishes its result in


@dataclass(frozen=True)
class Watch:
    """How run_on_node watches a node run: every `poll_seconds` (None: the node's
    watch_seconds), and for at most `pickup_seconds` until a worker takes it."""

    poll_seconds: float | None = None
    pickup_seconds: float = 600.0


def run_on_node(node: Node, deployment: str, parameters: dict[str, Any],
                timeout_seconds: float, *, label: str, watch: Watch | None = None
                ) -> TrainingResult:
    """Run a node-side flow on the GCE node through Prefect: `run_deployment` on the
    deployment that lives on the node's work pool (its worker is started by the node's
    startup script), then watch the run — and the node — until it ends.

    Returns the flow's result row as a TrainingResult (from the `node-result` table artifact
    it published: a result that crosses machines through the Prefect API, with no shared
    result storage), with `node_run` {id, name}. The run and the node are checked every
    `watch.poll_seconds` (default: the node's watch_seconds — 30 s in production, each check is a
    Compute call and a Prefect call); a transient Compute error in a check is retried by the
    node (GceNode._call), so the watch survives it.
    The node run is cancelled when this run times out, is cancelled, loses the node
    (NodePreempted), or no worker takes the run within `watch.pickup_seconds` (the node's worker
    is not up: better to fail than to pay for an idle GPU until the phase timeout); a node
    run that ends in any state but Completed fails here with its state and message."""
    logger = get_run_logger()
    watch = watch or Watch()
    every = node.watch_seconds if watch.poll_seconds is None else watch.poll_seconds
    pickup_seconds = watch.pickup_seconds
    parent = current_run.get_id()
    child: Any = run_deployment(name=deployment, parameters=parameters, timeout=0,
                           idempotency_key=f"{parent}-{label}" if parent else None,
                           tags=["slm-node"])
    logger.info("%s: node run %s (%s) submitted to %s — waiting for the node's worker",
                label, child.name, child.id, deployment)
    submitted = time.monotonic()
    last_state: list[str | None] = [""]
    with get_client(sync_client=True) as client:

        def ended() -> Any:
            """The run's final state; None while it runs (the node and the pickup checked)."""
            state = client.read_flow_run(child.id).state
            if state is not None and state.name != last_state[0]:
                last_state[0] = state.name
                logger.info("%s: node run %s is %s", label, child.name, state.name)
            if state is not None and state.is_final():
                return state
            waited = time.monotonic() - submitted
            if (state is None or state.is_scheduled()) and waited > pickup_seconds:
                raise PhaseFailed(
                    f"{label}: no worker on the node's pool took node run {child.name} "
                    f"within {pickup_seconds:.0f} s — check the node's Prefect worker "
                    "(`journalctl -u slm-prefect-worker` on the node: PREFECT_API_URL, "
                    f"its API key, the pool name) and `prefect work-pool inspect` for "
                    f"the pool of {deployment}")
            node.check_running()  # NodePreempted when the node went away
            return None

        try:
            state = poll(ended, timeout_seconds, first=every, factor=1.0, cap=every)
            if state is None:
                raise TimeoutError(f"{label}: node run {child.name} did not finish within "
                                   f"{timeout_seconds:.0f} s — cancelled")
        except BaseException as e:
            _end_node_run(client, child.id, logger, label, e)
            raise
        if not state.is_completed():
            raise PhaseFailed(f"{label}: node run {child.name} ended {state.name}"
                              f"{': ' + state.message if state.message else ''} — see the run "
                              f"in Prefect (flow run {child.id})")
        arts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[child.id])),
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[NODE_RESULT_KEY])))
    if not arts or not arts[0].data:
        raise PhaseFailed(f"{label}: node run {child.name} completed without publishing its "
                          f"result (a '{NODE_RESULT_KEY}' table artifact)")
    data: Any = arts[0].data
    rows = json.loads(data) if isinstance(data, str) else data
    return TrainingResult.parse(  # a node on another version fails here, naming both
        dict(rows[0]) | {"node_run": {"id": str(child.id), "name": child.name}},
        f"{label}: the result of node run {child.name}")


def _end_node_run(client: Any, run_id: Any, logger: Any, label: str, why: BaseException,
                  ack_seconds: float = 20.0) -> None:
    """A node run we stop waiting for must not hang in Running: Crashed when its node is gone
    (no worker is left to acknowledge anything); otherwise Cancelling, which the node's worker
    carries out (it ends the flow-run process and marks it Cancelled) — given `ack_seconds`,
    except when this run is itself being cancelled (its grace is for stopping the node), after
    which it is marked Cancelled here: the node stop that follows ends the process anyway."""
    try:
        if isinstance(why, NodePreempted):
            client.set_flow_run_state(run_id, Crashed(message=f"the node went away: {why}"),
                                      force=True)
            logger.warning("%s: node run %s crashed with its node", label, run_id)
            return
        current = client.read_flow_run(run_id).state
        if current is None or current.is_scheduled():  # no worker has it: nothing to stop
            client.set_flow_run_state(run_id, Cancelled(message="cancelled by the nightly "
                                                        "before the node's worker took it"),
                                      force=True)
            logger.warning("%s: node run %s cancelled before it started", label, run_id)
            return
        client.set_flow_run_state(run_id, Cancelling(message=f"the nightly stopped waiting: "
                                                     f"{type(why).__name__}"), force=True)
        def final() -> Any:
            state = client.read_flow_run(run_id).state
            return state if state is not None and state.is_final() else None

        # a cancelled run's grace is for stopping the node: it does not wait for the worker
        state = None if isinstance(why, TerminationSignal) else poll(
            final, ack_seconds, first=1.0, factor=1.0, cap=1.0)
        if state is not None:
            logger.warning("%s: node run %s %s by the node's worker", label, run_id,
                           state.name.lower())
            return
        client.set_flow_run_state(run_id, Cancelled(message="cancelled by the nightly; the node "
                                                    "stop ends its process"), force=True)
        logger.warning("%s: node run %s marked cancelled (the node stop ends it)", label, run_id)
    except Exception as e:  # noqa: BLE001 - teardown goes on; the node stop ends the run
        logger.warning("%s: could not end node run %s: %s", label, run_id, e)
