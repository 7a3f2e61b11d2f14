"""Prefect tasks for the compute node's lifecycle: boot, serve, release, stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from blocks.compute import LocalCompute
from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint

Compute = LocalCompute | GceCompute


@task(name="compute-up", cache_policy=NO_CACHE)
def compute_up(compute: Compute) -> str:
    """Boot the node."""
    node = compute.start()
    get_run_logger().info("compute up: %s", node)
    return node


@task(name="inference-up", cache_policy=NO_CACHE)
def inference_up(compute: Compute, endpoint: InferenceEndpoint,
                 adapter: Path | None = None) -> str:
    """Start the inference server on the node (with tonight's promoted adapter, if any) and
    wait until /v1/models answers."""
    logger = get_run_logger()
    if isinstance(compute, LocalCompute):
        url = compute.start_inference(endpoint, adapter)
    else:
        if adapter is not None:  # vLLM takes the PEFT adapter through the startup script
            logger.warning("promoted adapter %s is not loaded by this node: the GCE node serves "
                           "adapters through install_startup_script(lora_modules=…)", adapter)
        url = compute.start_inference(endpoint)
    logger.info("inference server ready at %s (model %s%s)", url, endpoint.model,
                f", adapter {adapter}" if adapter and isinstance(compute, LocalCompute) else "")
    return url


@task(name="inference-down", cache_policy=NO_CACHE)
def inference_down(compute: Compute) -> bool:
    """Stop the inference server and verify it is gone, so phase 2 has the GPU to itself."""
    stopped = compute.stop_inference()
    if compute.inference_running():
        raise RuntimeError("inference server still running after stop")
    get_run_logger().info("inference server stopped; accelerator released")
    return stopped


@task(name="compute-down", cache_policy=NO_CACHE)
def compute_down(compute: Compute) -> dict[str, Any] | None:
    """Stop the node (always runs, from the flow's `finally`) and return its usage this run
    (RUNNING time, GPU-hours, estimated cost; see GceCompute.usage), None if unavailable."""
    compute.stop()
    logger = get_run_logger()
    logger.info("compute down")
    return node_usage(compute, logger)


def node_usage(compute: Compute, logger: Any) -> dict[str, Any] | None:
    try:
        used = compute.usage()
    except Exception as e:  # noqa: BLE001 - the node is down; the estimate is a nicety
        logger.warning("node usage unavailable: %s", e)
        return None
    logger.info("node ran %.0f s this run (%.4f GPU-hours), estimated $%.2f",
                used["running_seconds"], used["gpu_hours"], used["estimated_usd"])
    return used
