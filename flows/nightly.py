"""The nightly pipeline, as the runbook reads:

boot the node → start the inference server and wait for it → phase 1 (extract) → stop the
inference server, release the accelerator → phase 2: score the corpus (training is not built
yet) → stop the node, always.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run as current_run

from blocks.profile import load_profile
from flows.extract import extract
from flows.scorecard import scorecard
from tasks.errors import PhaseFailed
from tasks.gpu import gpu_slot
from tasks.node import compute_down, compute_up, inference_down, inference_up
from tasks.summary import TRAINING_NOT_BUILT, merge_extraction, new_summary, render_markdown


def _stop_node_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """Backstop for cancellation and crashes: the `finally` below may not have run."""
    try:
        load_profile(flow_run.parameters.get("profile", "local")).compute.stop()
    except Exception as e:  # noqa: BLE001 - a hook must not raise
        print(f"nightly teardown hook could not stop the node: {e}")


@contextmanager
def _phase(summary: dict[str, Any], name: str) -> Iterator[None]:
    start = time.monotonic()
    record: dict[str, Any] = {"status": "running", "seconds": 0.0}
    summary["phases"][name] = record
    try:
        yield
        record["status"] = "completed"
    except BaseException as e:
        timed_out = isinstance(e, TimeoutError) or "timed out" in str(e).lower() or \
            type(e).__name__ in {"FlowRunTimeoutError", "TaskRunTimeoutError"}
        record["status"] = "timed_out" if timed_out else "failed"
        if isinstance(e, PhaseFailed):
            merge_extraction(summary, e.summary)
        summary.setdefault("error", f"{name}: {type(e).__name__}: {e}")
        raise
    finally:
        record["seconds"] = round(time.monotonic() - start, 2)


def _write_summary(summary: dict[str, Any], state_dir: Path) -> Path:
    runs = state_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = runs / f"{stamp}-{(current_run.get_id() or 'local')[:8]}.json"
    text = json.dumps(summary, indent=2, default=str)
    path.write_text(text)
    tmp = runs / "last-run.json.tmp"
    tmp.write_text(text)
    tmp.replace(runs / "last-run.json")
    return path


@flow(name="nightly", on_cancellation=[_stop_node_hook], on_crashed=[_stop_node_hook])
def nightly(profile: str = "local", full: bool = False, retry_failed: bool = False,
            phase1_timeout_seconds: int = 7200, max_failed_share: float | None = None
            ) -> dict[str, Any]:
    """Run the nightly pipeline on the profile's blocks and return the run summary."""
    logger = get_run_logger()
    cfg = load_profile(profile)
    summary = new_summary(cfg.name)
    summary["started_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        with _phase(summary, "compute_up"):
            summary["node"] = compute_up(cfg.compute)
        # Phase 1 holds the `gpu` slot: no ad-hoc training shares the card with the server.
        with gpu_slot():
            with _phase(summary, "inference_up"):
                base_url = inference_up(cfg.compute, cfg.inference)
            with _phase(summary, "extract"):
                phase1 = extract.with_options(timeout_seconds=phase1_timeout_seconds)(
                    profile=profile, base_url=base_url, full=full, retry_failed=retry_failed,
                    max_failed_share=max_failed_share)
                merge_extraction(summary, phase1)
            with _phase(summary, "inference_down"):
                inference_down(cfg.compute)
        if cfg.corpus.root:
            with _phase(summary, "scorecard"):
                summary["scorecard"] = scorecard(profile=profile)
        else:
            summary["phases"]["scorecard"] = {"status": "skipped", "seconds": 0.0,
                                              "note": "no [corpus] root in the profile"}
        # Training (phase 2b) is not built yet: no placeholder work.
        summary["phases"]["train"] = {"status": "not built", "seconds": 0.0,
                                      "note": TRAINING_NOT_BUILT}
        logger.info(TRAINING_NOT_BUILT)
        summary["status"] = "completed"
    except BaseException:
        summary["status"] = "failed"
        raise
    finally:
        try:
            with _phase(summary, "compute_down"):
                try:
                    compute_down(cfg.compute)
                except BaseException:
                    # Cancellation can refuse new task runs: stop the node directly.
                    cfg.compute.stop()
                    raise
        except Exception:
            summary["status"] = "failed"
            raise
        finally:
            summary["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            path = _write_summary(summary, cfg.state_dir)
            create_markdown_artifact(render_markdown(summary), key="nightly-summary",
                                     description="Nightly run summary")
            logger.info("run summary written to %s", path)
    return summary
